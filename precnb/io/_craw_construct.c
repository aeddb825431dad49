/* precnb.io._craw.construct_table: a plain construct.json read straight from its bytes (part of _craw).
 *
 * construct.json maps every dumped node to its parent module ("Functional.linear.0.forward":
 * "Module.fc.Linear.forward.0", null for a root). A large dump's table holds millions of nodes; parsed
 * into a dict by orjson and then normalised in Python (nulls to "", one string object per distinct parent,
 * the node -> node intern table the record reader uses), it cost about as much as a fifth of the records'
 * own read. Here both tables come out of one pass over the text:
 *
 * construct_table(raw) -> (parents, names) or None
 *   parents: node -> parent ("" for null), one str object per distinct parent text;
 *   names:   node -> the same str object as parents' key (the intern table of precnb.io.msprobe.parse).
 *   None when the text is not the plain layout: anything but one object of string keys and string / null
 *   values, a backslash escape, a control character, invalid UTF-8, a Megatron micro-step table
 *   ("megatron_micro_step_number", or [parent, micro step] values), a byte-order mark, trailing text. The
 *   caller then parses it with the standard library rules (precnb.io.msprobe.sides.parse_construct), which
 *   give the same tables for every text this function accepts (tests/test_craw_construct.py checks both).
 *
 * Duplicate keys keep the last value at the first key's position, as json.loads and dict() do; the first
 * key's object stays the key of both tables.
 *
 * Written for precnb (no third-party code): CPython C API only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

#include "_craw_text.h"

PyObject *craw_construct_table(PyObject *self, PyObject *arg);


/* the text of a string at c->i (its opening quote) without escapes or control characters: 1 (c->i past the
 * closing quote, *ascii whether every byte is ASCII), 0 when it is not such a string */
static inline int
c_string(cur *c, const char **a, Py_ssize_t *len, int *ascii)
{
    if (c->i >= c->n || c->s[c->i] != '"')
        return 0;
    const unsigned char *s = (const unsigned char *)c->s;
    Py_ssize_t j = c->i + 1, n = c->n;
    unsigned char high = 0;
    while (j < n) {
        unsigned char ch = s[j];
        if (ch == '"')
            break;
        if (ch < 0x20 || ch == '\\')
            return 0;
        high |= ch;
        j++;
    }
    if (j >= n)
        return 0;
    *a = c->s + c->i + 1;
    *len = j - c->i - 1;
    *ascii = high < 0x80;
    c->i = j + 1;
    return 1;
}

/* a new str for the text (NULL: a Python error set, or invalid UTF-8 with the error cleared and *bad set) */
static PyObject *
c_str(const char *a, Py_ssize_t len, int ascii, int *bad)
{
    if (ascii) {
        PyObject *o = PyUnicode_New(len, 127);
        if (o != NULL)
            memcpy(PyUnicode_DATA(o), a, (size_t)len);
        return o;
    }
    PyObject *o = PyUnicode_DecodeUTF8(a, len, "strict");
    if (o == NULL && PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
        PyErr_Clear();
        *bad = 1;
    }
    return o;
}

#define MICRO_KEY "megatron_micro_step_number"

PyObject *
craw_construct_table(PyObject *Py_UNUSED(self), PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "construct_table: bytes");
        return NULL;
    }
    cur c = {PyBytes_AS_STRING(arg), PyBytes_GET_SIZE(arg), 0};
    PyObject *parents = PyDict_New(), *names = PyDict_New(), *distinct = PyDict_New();
    PyObject *empty = PyUnicode_New(0, 127);
    PyObject *last = NULL;  /* the previous value's str (siblings follow each other: most values repeat it) */
    const char *last_a = NULL;
    Py_ssize_t last_n = -1;
    int plain = 0, bad = 0;
    if (parents == NULL || names == NULL || distinct == NULL || empty == NULL)
        goto error;
    if (!expect(&c, '{'))
        goto done;
    if (c.i < c.n && c.s[c.i] == '}') {
        c.i++;
    } else {
        for (;;) {
            const char *a, *v;
            Py_ssize_t len, vlen;
            int ascii, vascii;
            if (!c_string(&c, &a, &len, &ascii))
                goto done;
            if (len == (Py_ssize_t)strlen(MICRO_KEY) && memcmp(a, MICRO_KEY, (size_t)len) == 0)
                goto done;
            if (!expect(&c, ':'))
                goto done;
            PyObject *value;  /* borrowed */
            if (c.i < c.n && c.s[c.i] == '"') {
                if (!c_string(&c, &v, &vlen, &vascii))
                    goto done;
                if (last != NULL && vlen == last_n && memcmp(v, last_a, (size_t)vlen) == 0) {
                    value = last;
                } else {
                    PyObject *fresh = c_str(v, vlen, vascii, &bad);
                    if (fresh == NULL)
                        goto error;
                    value = PyDict_SetDefault(distinct, fresh, fresh);  /* borrowed: the first such text's */
                    Py_DECREF(fresh);
                    if (value == NULL)
                        goto error;
                    last = value;
                    last_a = v;
                    last_n = vlen;
                }
            } else if (c.n - c.i >= 4 && memcmp(c.s + c.i, "null", 4) == 0) {
                c.i += 4;
                value = empty;
            } else {
                goto done;  /* a Megatron [parent, micro step] pair, a number, ...: the Python reader's */
            }
            PyObject *fresh = c_str(a, len, ascii, &bad);
            if (fresh == NULL)
                goto error;
            /* a repeated key: its first object stays the key of both tables (and names' value) */
            PyObject *key = PyDict_SetDefault(names, fresh, fresh);  /* borrowed */
            int r = key == NULL ? -1 : PyDict_SetItem(parents, key, value);
            Py_DECREF(fresh);
            if (r < 0)
                goto error;
            ws(&c);
            if (c.i < c.n && c.s[c.i] == ',') {
                c.i++;
                ws(&c);
                continue;
            }
            if (c.i < c.n && c.s[c.i] == '}') {
                c.i++;
                break;
            }
            goto done;
        }
    }
    ws(&c);
    plain = c.i == c.n;
done:
    Py_DECREF(distinct);
    Py_DECREF(empty);
    if (!plain) {
        Py_DECREF(parents);
        Py_DECREF(names);
        Py_RETURN_NONE;
    }
    PyObject *out = PyTuple_Pack(2, parents, names);
    Py_DECREF(parents);
    Py_DECREF(names);
    return out;
error:
    Py_XDECREF(parents);
    Py_XDECREF(names);
    Py_XDECREF(distinct);
    Py_XDECREF(empty);
    if (bad) {
        Py_RETURN_NONE;  /* invalid UTF-8: the standard library's reader repairs it (with a note) */
    }
    return NULL;
}
