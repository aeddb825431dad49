/* precnb.io._craw: the text cursor both of its translation units read with (_craw.c, _craw_construct.c). */
#ifndef PRECNB_CRAW_TEXT_H
#define PRECNB_CRAW_TEXT_H

#include <Python.h>

/* a position *i* in the *n* bytes at *s* */
typedef struct {
    const char *s;
    Py_ssize_t n, i;
} cur;

/* JSON whitespace skipped from c->i on */
static inline void
ws(cur *c)
{
    const char *s = c->s;
    Py_ssize_t i = c->i, n = c->n;
    /* (one comparison for most bytes: every JSON whitespace byte is at most ' ') */
    while (i < n && (unsigned char)s[i] <= ' ' && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r'))
        i++;
    c->i = i;
}

/* 1 past the punctuation *ch* at c->i (JSON whitespace skipped on both sides), 0 at anything else */
static inline int
expect(cur *c, char ch)
{
    ws(c);
    if (c->i >= c->n || c->s[c->i] != ch)
        return 0;
    c->i++;
    ws(c);
    return 1;
}

#endif
