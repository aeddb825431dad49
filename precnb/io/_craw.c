/* precnb.io._craw: the common node records of a dump.json batch read straight from its bytes, in C.
 *
 * The parser's one fast path (setup.py builds it with optional=True; without it, or with PRECNB_PURE_PARSER=1, the
 * pure Python parser reads every file: the standard library's json and the reference walk, with the same
 * records). It reads the batch's text itself and builds no Python object per leaf: a plain record's statistics,
 * shapes and dtypes go into C buffers, and only what the file's records keep is made a Python object (a label
 * per tensor, a node name per record, the shared dtype / shape texts, the scalar arguments the run facts read).
 * It reads only what it can prove plain and gives every other record back:
 *
 * - read_records(raw, pos, ...) reads the members of one batch ("name": record, ...; the text between
 *   data's records that precnb.io.msprobe._json cuts) from byte *pos* on. A record is plain when its text is
 *   printable ASCII without a backslash, its numbers are JSON numbers an int64 or a double holds as Python
 *   reads them, and its structure is what Walk.node reads in line: an object of known sections (lists or
 *   objects of tensor leaves, {type, value} scalar arguments, nulls, numbers, strings), a parameters_grad
 *   record of leaves; a leaf has the statistics as numbers / NaN / +-Infinity / null / booleans, a shape of
 *   non-negative integers seen valid, a string dtype and no md5 or data_name. Every other record (escapes,
 *   non-ASCII, nested lists, duplicate keys, collectives, optimizer or undefined-buffer records, a record the
 *   release probe still needs, anything not valid JSON) is handed back as the byte span of its member, having
 *   added nothing: the Python code parses that span with the standard library and reads it with the
 *   reference walk, then calls read_records again after it. Text that is not a sequence of members (a
 *   missing comma, a trailing one, an unterminated value) raises ValueError: the reader then parses the
 *   whole file with the standard library, which words the error.
 *
 * What a large file's load costs here was profiled (benchmarks/RESULTS_large.md, 2026-12-07 23:00): each section
 * is read where it stands (one pass over a record; RETRY reads a record whose sections are out of reading order in
 * two), a record's name is looked for first just after the last one found in construct.json's order (ctx_t), the
 * roles, shapes and dtypes go back as codes (codes_t), and an optimizer op's arguments are built for the run facts
 * without its tensors (build_args), and not at all when the same ones were read already (facts_key).
 *
 * Numbers are read as Python reads them: an integer of up to 18 digits exactly (then converted to double as
 * numpy converts a Python int: rounded to nearest), any other number with PyOS_string_to_double, the function
 * behind float(), on the number's own text (after checking it against the JSON grammar).
 *
 * Why a reader of the bytes: with the records parsed into objects (orjson, python-rapidjson: a few times faster
 * than the standard library), the walk of those objects still cost more than the parse, even in C; here neither
 * is paid for the common records (benchmarks/RESULTS_large.md). Why the hand-back: every unusual record keeps
 * one reader, the reference walk in Python.
 * Size: this translation unit (~1,650 lines), _craw_construct.c (~200 lines: construct_table, which reads
 * a plain construct.json's parent table from its bytes in one pass, see that file) and _craw_parts.c (~330
 * lines: parts_add, the node names split) and _craw_facts.c (~400 lines: the optimizer ops' arguments and
 * the run-facts loop over the records handed over as objects); the long functions
 * (read_record, read_records, read_leaf, read_section, param_grad, build_value) each read one level of the
 * JSON grammar whole, with their error paths.
 *
 * Written for precnb (no third-party code): CPython C API only. tests/test_parse_paths.py checks that the records
 * read here equal the pure Python reference's, bit for bit, on every bundled dump and on generated ones;
 * tests/test_craw.py the numbers (against float()), the texts only this reader sees and the hand-backs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "_craw_text.h"

#define MAX_SECTIONS 16
#define MAX_DIMS 32
#define MAX_KEYS 64
#define SKIP_DEPTH 48

/* configured once from Python (precnb.io.msprobe.walk): the single source of the rules */
static PyObject *g_non_tensor, *g_undefined, *g_comm, *g_node_kind, *g_shape_info, *g_roles[MAX_SECTIONS],
    *g_sections[MAX_SECTIONS];
static char g_keys[MAX_SECTIONS][32];
static Py_ssize_t g_key_len[MAX_SECTIONS], g_n_order;
static int g_param_section = -1, g_args_section = -1, g_kwargs_section = -1;  /* indices in the order */
static PyObject *g_keys_obj[MAX_SECTIONS];
static PyObject *s_empty, *s_grad, *s_param_grad_kind, *s_optimizer;
static double g_nan;  /* float('nan'), as the standard library's json reads NaN */

/* ------------------------------------------------------------------------------------------ text caches */

/* printable strings seen before (dtypes, leaf types) -> their str object and whether the type is a tensor */
typedef struct {
    Py_ssize_t n;
    char text[56];
    PyObject *obj;
    int tensor;
} str_entry;
#define STR_SLOTS 2048
static str_entry g_strs[STR_SLOTS];

static uint64_t
fnv(const char *s, Py_ssize_t n)
{
    uint64_t h = 1469598103934665603ULL;
    for (Py_ssize_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ULL;
    return h;
}

static PyObject *
ascii_str(const char *s, Py_ssize_t n)
{
    PyObject *o = PyUnicode_New(n, 127);
    if (o != NULL)
        memcpy(PyUnicode_DATA(o), s, (size_t)n);
    return o;
}

/* a borrowed str for s[0:n] (kept in the cache when short), *tensor: not a non-tensor type; NULL on error */
static PyObject *
cached_str(const char *s, Py_ssize_t n, int *tensor, PyObject **owned)
{
    *owned = NULL;
    if (n < (Py_ssize_t)sizeof(g_strs[0].text)) {
        uint64_t h = fnv(s, n);
        for (int probe = 0; probe < 8; probe++) {
            str_entry *e = &g_strs[(h + (uint64_t)probe) % STR_SLOTS];
            if (e->obj == NULL) {
                PyObject *o = ascii_str(s, n);
                if (o == NULL)
                    return NULL;
                int non = PySet_Contains(g_non_tensor, o);
                if (non < 0) {
                    Py_DECREF(o);
                    return NULL;
                }
                e->n = n;
                memcpy(e->text, s, (size_t)n);
                e->obj = o;
                e->tensor = !non;
                *tensor = e->tensor;
                return o;
            }
            if (e->n == n && memcmp(e->text, s, (size_t)n) == 0) {
                *tensor = e->tensor;
                return e->obj;
            }
        }
    }
    PyObject *o = ascii_str(s, n);
    if (o == NULL)
        return NULL;
    int non = PySet_Contains(g_non_tensor, o);
    if (non < 0) {
        Py_DECREF(o);
        return NULL;
    }
    *tensor = !non;
    *owned = o;
    return o;
}

/* valid shapes seen before -> (text, numel) as precnb.io.msprobe.values._shape_info gives them */
typedef struct {
    int ndim;
    int64_t dims[8];
    PyObject *text;
    int64_t numel;
} shape_entry;
#define SHAPE_SLOTS 8192
static shape_entry g_shapes[SHAPE_SLOTS];

/* 1 found (*text borrowed), 0 not a valid shape, -1 error */
static int
shape_of(const int64_t *dims, int ndim, PyObject **text, int64_t *numel)
{
    uint64_t h = 1469598103934665603ULL ^ (uint64_t)ndim;
    for (int i = 0; i < ndim; i++)
        h = (h ^ (uint64_t)dims[i]) * 1099511628211ULL;
    shape_entry *slot = NULL;
    if (ndim <= 8) {
        for (int probe = 0; probe < 8; probe++) {
            shape_entry *e = &g_shapes[(h + (uint64_t)probe) % SHAPE_SLOTS];
            if (e->text == NULL) {
                slot = e;
                break;
            }
            if (e->ndim == ndim && memcmp(e->dims, dims, sizeof(int64_t) * (size_t)ndim) == 0) {
                *text = e->text;
                *numel = e->numel;
                return 1;
            }
        }
    }
    PyObject *key = PyTuple_New(ndim);
    if (key == NULL)
        return -1;
    for (int i = 0; i < ndim; i++) {
        PyObject *d = PyLong_FromLongLong(dims[i]);
        if (d == NULL) {
            Py_DECREF(key);
            return -1;
        }
        PyTuple_SET_ITEM(key, i, d);
    }
    PyObject *info = PyObject_CallOneArg(g_shape_info, key);
    Py_DECREF(key);
    if (info == NULL)
        return -1;
    if (info == Py_None) {
        Py_DECREF(info);
        return 0;
    }
    int ok = PyTuple_Check(info) && PyTuple_GET_SIZE(info) == 2 && PyUnicode_CheckExact(PyTuple_GET_ITEM(info, 0))
             && PyLong_CheckExact(PyTuple_GET_ITEM(info, 1));
    long long n = ok ? PyLong_AsLongLong(PyTuple_GET_ITEM(info, 1)) : -1;
    if (!ok || (n == -1 && PyErr_Occurred())) {
        Py_DECREF(info);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "shape_info: (text, numel)");
        return -1;
    }
    PyObject *t = Py_NewRef(PyTuple_GET_ITEM(info, 0));
    Py_DECREF(info);
    if (slot != NULL) {
        slot->ndim = ndim;
        memcpy(slot->dims, dims, sizeof(int64_t) * (size_t)ndim);
        slot->text = t;  /* kept for the process, as values._SHAPES keeps it */
        slot->numel = n;
        *text = t;
    } else {
        *text = t;  /* not cached: the caller's reference */
        ndim = -1;
    }
    *numel = n;
    return ndim < 0 ? 2 : 1;
}

/* ------------------------------------------------------------------------------------------- buffers */

typedef struct {
    char *p;
    Py_ssize_t n, cap;
} buf;

static int
buf_add(buf *b, const void *x, Py_ssize_t n)
{
    if (n <= 0)  /* nothing to add: memcpy into a buffer not allocated yet (NULL) is undefined even for 0 bytes */
        return 0;
    if (b->n + n > b->cap) {
        Py_ssize_t cap = b->cap ? b->cap * 2 : 4096;
        while (cap < b->n + n)
            cap *= 2;
        char *p = PyMem_Realloc(b->p, (size_t)cap);
        if (p == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, x, (size_t)n);
    b->n += n;
    return 0;
}

/* a text column of few distinct texts (roles, shapes, dtypes): the distinct str objects of one call in a list, in
 * order of first use, and an int32 code per leaf (its index there). The objects come from this module's caches, so
 * they are told apart by address: a slot (object, index, call) is valid while the list still holds the object at
 * that index (a record rolled back truncates the list: its slots go stale, never wrong). */
#define CODE_SLOTS 8192
typedef struct {
    PyObject *obj;
    Py_ssize_t idx;
    unsigned call;
} code_slot;

typedef struct {
    PyObject *list;
    buf codes;
    code_slot *slots;
} codes_t;

static code_slot g_code_slots[3][CODE_SLOTS];
static unsigned g_call;  /* read_records calls: a slot of an earlier call is empty */

static int
code_of(codes_t *t, PyObject *obj)
{
    Py_ssize_t size = PyList_GET_SIZE(t->list);
    int32_t k = -1;
    if (size < CODE_SLOTS / 2) {
        size_t h = (size_t)(((uintptr_t)obj >> 4) * 0x9E3779B97F4A7C15ULL) & (CODE_SLOTS - 1);
        code_slot *free_slot = NULL;
        for (int probe = 0; probe < CODE_SLOTS; probe++) {
            code_slot *e = &t->slots[(h + (size_t)probe) & (CODE_SLOTS - 1)];
            int empty = e->call != g_call;
            int valid = !empty && e->idx < size && PyList_GET_ITEM(t->list, e->idx) == e->obj;
            if (valid && e->obj == obj) {
                k = (int32_t)e->idx;
                break;
            }
            if (!valid && free_slot == NULL)
                free_slot = e;
            if (empty)
                break;
        }
        if (k < 0) {
            if (PyList_Append(t->list, obj) < 0)
                return -1;
            k = (int32_t)size;
            if (free_slot != NULL) {
                free_slot->obj = obj;
                free_slot->idx = size;
                free_slot->call = g_call;
            }
        }
    } else {  /* (thousands of distinct texts in one batch) */
        for (Py_ssize_t i = 0; i < size && k < 0; i++)
            if (PyList_GET_ITEM(t->list, i) == obj)
                k = (int32_t)i;
        if (k < 0) {
            if (PyList_Append(t->list, obj) < 0)
                return -1;
            k = (int32_t)size;
        }
    }
    return buf_add(&t->codes, &k, sizeof k);
}

/* what one call reads: the leaves' columns (C buffers) and the Python lists it appends to */
typedef struct {
    buf stat[4], null, numel, label_hash, name_hash, label;  /* label: the text being built */
    codes_t role, shape, dtype;  /* their lists: the roles, shapes, dtypes arguments */
    PyObject *labels, *leaf_type;
    Py_ssize_t n;  /* leaves read */
    /* the current record's input_args: which of its first 64 elements were read as tensor leaves (bit k), and
     * where each of those ends (build_args steps over them) */
    uint64_t arg_tensor;
    Py_ssize_t arg_start[64], arg_end[64];
} out_t;

/* a leaf's fields as read */
typedef struct {
    double stat[4];
    uint8_t null;
    int has_type, type_str, has_dtype, has_shape, has_value, value_scalar, rg;  /* rg: -1 absent/not bool */
    const char *type_s, *dtype_s;
    Py_ssize_t type_n, dtype_n;
    int64_t dims[MAX_DIMS];
    int ndim, n_members;
} leaf_t;

/* ------------------------------------------------------------------------------------------- the text */

/* the cursor (cur) and the whitespace skip (ws) are in _craw_text.h, shared with _craw_construct.c */

#define NOT_PLAIN 0
#define ERR (-1)
#define RETRY 2  /* read_record: the record's sections are not in reading order; read it again in two passes */

/* after a member of a container closed by *close*: 1 past a ',' (another member follows, c->i at it), 0 past
 * the close, -1 at anything else (the caller's NOT_PLAIN); whitespace skipped on both sides */
static inline int
member_end(cur *c, char close)
{
    ws(c);
    if (c->i < c->n) {
        char ch = c->s[c->i];
        if (ch == ',') {
            c->i++;
            ws(c);
            return 1;
        }
        if (ch == close) {
            c->i++;
            return 0;
        }
    }
    return -1;
}

/* a plain string at c->i (the opening quote): *a, *len its text; 1, or NOT_PLAIN */
static int
plain_string(cur *c, const char **a, Py_ssize_t *len)
{
    if (c->i >= c->n || c->s[c->i] != '"')
        return NOT_PLAIN;
    Py_ssize_t j = c->i + 1, n = c->n;
    const char *s = c->s;
    /* (one comparison for most bytes: the quote, the backslash and the bytes outside ' '..'~' end the loop) */
    while (j < n && (unsigned char)(s[j] - 0x20) < 0x5f && s[j] != '"' && s[j] != '\\')
        j++;
    if (j >= n || s[j] != '"')
        return NOT_PLAIN;
    *a = s + c->i + 1;
    *len = j - c->i - 1;
    c->i = j + 1;
    return 1;
}

static int
word(cur *c, const char *w, Py_ssize_t n)
{
    if (c->n - c->i >= n && memcmp(c->s + c->i, w, (size_t)n) == 0) {
        c->i += n;
        return 1;
    }
    return 0;
}

/* kinds of a scalar value */
#define V_NUM 1
#define V_NULL 2
#define V_BOOL 3
#define V_STR 4

/* the double nearest to the decimal number w * 10^e10 (w: its significant digits, at most 19), by one operation in
 * 80-bit extended precision, when that provably rounds as float() does: w and the power of ten (up to 10^27) are
 * exact there, the one multiplication or division is rounded once to 64 bits, and the conversion to 53 bits then
 * gives the correctly rounded double unless the 64-bit result lies within one unit of its last place of a point
 * halfway between two doubles; then (and for every other number) 0 is returned and PyOS_string_to_double decides. */
#if LDBL_MANT_DIG == 64 && (defined(__x86_64__) || defined(__i386__))
static const long double POW10[28] = {1e0L, 1e1L, 1e2L, 1e3L, 1e4L, 1e5L, 1e6L, 1e7L, 1e8L, 1e9L, 1e10L, 1e11L,
                                      1e12L, 1e13L, 1e14L, 1e15L, 1e16L, 1e17L, 1e18L, 1e19L, 1e20L, 1e21L, 1e22L,
                                      1e23L, 1e24L, 1e25L, 1e26L, 1e27L};

static int
fast_decimal(uint64_t w, long e10, int neg, double *out)
{
    if (w == 0) {
        *out = neg ? -0.0 : 0.0;
        return 1;
    }
    if (e10 < -27 || e10 > 27)
        return 0;
    long double v = (long double)w;  /* exact: w < 2^64 */
    v = e10 < 0 ? v / POW10[-e10] : v * POW10[e10];
    union {
        long double ld;
        struct {
            uint64_t mant;
            uint16_t se;
        } p;
    } u;
    memset(&u, 0, sizeof u);
    u.ld = v;
    if (!(u.p.mant >> 63))
        return 0;  /* not normalized (cannot happen here; kept safe) */
    uint64_t low = u.p.mant & 0x7FF;  /* the 11 bits below a double's 53 */
    if (low >= 0x3FF && low <= 0x401)
        return 0;  /* within one unit of a halfway point: the exact rules */
    double d = (double)v;
    if (!isfinite(d) || d < DBL_MIN)
        return 0;
    *out = neg ? -d : d;
    return 1;
}
#else
static int
fast_decimal(uint64_t w, long e10, int neg, double *out)
{
    (void)w, (void)e10, (void)neg, (void)out;
    return 0;  /* no 64-bit extended precision here: every number goes to PyOS_string_to_double */
}
#endif

#define IS_DIGIT(ch) ((unsigned char)((ch) - '0') < 10)

/* a JSON number (or NaN / Infinity / -Infinity) at c->i as Python reads it: 1 with *d, *is_int, NOT_PLAIN.
 * One pass over the text: the grammar is checked while the significant digits (w, up to 19 of them) and the
 * power of ten are gathered for fast_decimal. */
static int
number(cur *c, double *d, int *is_int, int64_t *iv)
{
    const char *s = c->s;
    Py_ssize_t i = c->i, n = c->n, start = i;
    int neg = 0;
    if (i < n && s[i] == '-') {
        neg = 1;
        i++;
    }
    if (i < n && s[i] == 'I') {
        c->i = i;
        if (!word(c, "Infinity", 8))
            return NOT_PLAIN;
        *d = neg ? -Py_HUGE_VAL : Py_HUGE_VAL;
        *is_int = 0;
        return 1;
    }
    if (!neg && i < n && s[i] == 'N') {
        if (!word(c, "NaN", 3))
            return NOT_PLAIN;
        *d = g_nan;
        *is_int = 0;
        return 1;
    }
    uint64_t w = 0;
    int digits = 0;  /* significant digits seen (from the first non-zero one); beyond 19: no fast path */
    long e10 = 0;
    Py_ssize_t d0 = i;
    if (i < n && s[i] == '0')
        i++;
    else {
        if (i >= n || s[i] < '1' || s[i] > '9')
            return NOT_PLAIN;
        while (i < n && IS_DIGIT(s[i])) {
            if (++digits <= 19)
                w = w * 10 + (uint64_t)(s[i] - '0');
            i++;
        }
    }
    Py_ssize_t int_digits = i - d0;
    int frac = 0;
    if (i < n && s[i] == '.') {
        i++;
        if (i >= n || !IS_DIGIT(s[i]))
            return NOT_PLAIN;
        while (i < n && IS_DIGIT(s[i])) {
            if (digits || s[i] != '0')
                digits++;
            if (digits <= 19) {
                w = w * 10 + (uint64_t)(s[i] - '0');
                e10--;
            }
            i++;
        }
        frac = 1;
    }
    int big_exp = 0;
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        int eneg = 0;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            eneg = s[i++] == '-';
        if (i >= n || !IS_DIGIT(s[i]))
            return NOT_PLAIN;
        long x = 0;
        while (i < n && IS_DIGIT(s[i])) {
            if (x <= 100000)
                x = x * 10 + (s[i] - '0');
            else
                big_exp = 1;
            i++;
        }
        big_exp |= x > 100000;
        e10 += eneg ? -x : x;
        frac = 1;
    }
    if (i >= n)
        return NOT_PLAIN;  /* a number is followed by something in a batch (at least the record's close) */
    if (!frac) {
        if (int_digits > 18)
            return NOT_PLAIN;  /* an int beyond int64: the Python code reads it */
        int64_t v = (int64_t)w;  /* every digit is significant here (no leading zero but "0" itself) */
        if (neg)
            v = -v;
        *iv = v;
        *d = (double)v;
        *is_int = 1;
        c->i = i;
        return 1;
    }
    if (digits <= 19 && !big_exp && fast_decimal(w, e10, neg, d)) {
        *is_int = 0;
        c->i = i;
        return 1;
    }
    char tmp[64];
    Py_ssize_t len = i - start;
    if (len >= (Py_ssize_t)sizeof(tmp))
        return NOT_PLAIN;
    memcpy(tmp, s + start, (size_t)len);
    tmp[len] = '\0';
    char *end = NULL;
    double v = PyOS_string_to_double(tmp, &end, NULL);
    if (v == -1.0 && PyErr_Occurred()) {
        PyErr_Clear();
        return NOT_PLAIN;
    }
    if (end != tmp + len)
        return NOT_PLAIN;
    *d = v;
    *is_int = 0;
    c->i = i;
    return 1;
}

/* a scalar at c->i: 1 with *kind (and *d for numbers and booleans), NOT_PLAIN otherwise (containers too) */
static int
scalar(cur *c, int *kind, double *d)
{
    if (c->i >= c->n)
        return NOT_PLAIN;
    char ch = c->s[c->i];
    if (ch == '"') {
        const char *a;
        Py_ssize_t len;
        *kind = V_STR;
        return plain_string(c, &a, &len);
    }
    if (ch == 'n') {
        *kind = V_NULL;
        return word(c, "null", 4);
    }
    if (ch == 't' || ch == 'f') {
        *kind = V_BOOL;
        *d = ch == 't' ? 1.0 : 0.0;
        return ch == 't' ? word(c, "true", 4) : word(c, "false", 5);
    }
    int is_int;
    int64_t iv;
    *kind = V_NUM;
    return number(c, d, &is_int, &iv);
}

/* any plain value at c->i, checked and skipped (depth-limited): 1, or NOT_PLAIN */
static int
skip_value(cur *c, int depth)
{
    if (c->i >= c->n || depth > SKIP_DEPTH)
        return NOT_PLAIN;
    char ch = c->s[c->i];
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        c->i++;
        ws(c);
        if (c->i < c->n && c->s[c->i] == close) {
            c->i++;
            return 1;
        }
        for (;;) {
            if (ch == '{') {
                const char *a;
                Py_ssize_t len;
                if (!plain_string(c, &a, &len))
                    return NOT_PLAIN;
                ws(c);
                if (c->i >= c->n || c->s[c->i] != ':')
                    return NOT_PLAIN;
                c->i++;
                ws(c);
            }
            if (!skip_value(c, depth + 1))
                return NOT_PLAIN;
            ws(c);
            if (c->i >= c->n)
                return NOT_PLAIN;
            if (c->s[c->i] == ',') {
                c->i++;
                ws(c);
                continue;
            }
            if (c->s[c->i] != close)
                return NOT_PLAIN;
            c->i++;
            return 1;
        }
    }
    int kind;
    double d;
    return scalar(c, &kind, &d);
}

/* any plain value at c->i as the standard library's json builds it (dicts keep the last of a key twice, at its
 * first place): a new reference; NULL without an exception set when the value is not plain, with one on error */
static PyObject *
build_value(cur *c, int depth)
{
    if (c->i >= c->n || depth > SKIP_DEPTH)
        return NULL;
    char ch = c->s[c->i];
    if (ch == '{' || ch == '[') {
        char close = ch == '{' ? '}' : ']';
        PyObject *out = ch == '{' ? PyDict_New() : PyList_New(0);
        if (out == NULL)
            return NULL;
        c->i++;
        ws(c);
        if (c->i < c->n && c->s[c->i] == close) {
            c->i++;
            return out;
        }
        for (;;) {
            PyObject *key = NULL;
            if (ch == '{') {
                const char *a;
                Py_ssize_t len;
                if (!plain_string(c, &a, &len))
                    goto fail;
                ws(c);
                if (c->i >= c->n || c->s[c->i] != ':')
                    goto fail;
                c->i++;
                ws(c);
                if ((key = ascii_str(a, len)) == NULL)
                    goto fail;
            }
            PyObject *v = build_value(c, depth + 1);
            int bad = v == NULL || (key ? PyDict_SetItem(out, key, v) : PyList_Append(out, v)) < 0;
            Py_XDECREF(key);
            Py_XDECREF(v);
            if (bad)
                goto fail;
            int me = member_end(c, close);
            if (me > 0)
                continue;
            if (me == 0)
                return out;
            goto fail;
        }
    fail:
        Py_DECREF(out);
        return NULL;
    }
    if (ch == '"') {
        const char *a;
        Py_ssize_t len;
        return plain_string(c, &a, &len) ? ascii_str(a, len) : NULL;
    }
    if (ch == 'n')
        return word(c, "null", 4) ? Py_NewRef(Py_None) : NULL;
    if (ch == 't')
        return word(c, "true", 4) ? Py_NewRef(Py_True) : NULL;
    if (ch == 'f')
        return word(c, "false", 5) ? Py_NewRef(Py_False) : NULL;
    double d;
    int is_int;
    int64_t iv;
    if (!number(c, &d, &is_int, &iv))
        return NULL;
    return is_int ? PyLong_FromLongLong(iv) : PyFloat_FromDouble(d);
}

/* the structure of any value at c->i (strings with escapes and any bytes): its end, or -1 when the text ends
 * first. Only finds where a handed-back member ends; the standard library checks the text itself. */
static Py_ssize_t
value_end(const char *s, Py_ssize_t n, Py_ssize_t i)
{
    Py_ssize_t depth = 0;
    for (; i < n; i++) {
        char ch = s[i];
        if (ch == '"') {
            for (i++; i < n && s[i] != '"'; i++)
                if (s[i] == '\\')
                    i++;
            if (i >= n)
                return -1;
            if (depth == 0)
                return i + 1;
        } else if (ch == '{' || ch == '[')
            depth++;
        else if (ch == '}' || ch == ']') {
            if (--depth < 0)
                return i;  /* a scalar member's value ends at its container's close */
            if (depth == 0)
                return i + 1;
        } else if (depth == 0 && (ch == ',' || ch == ' ' || ch == '\n' || ch == '\t' || ch == '\r'))
            return i;
    }
    return depth == 0 ? n : -1;
}

/* ------------------------------------------------------------------------------------------- leaves */

/* one object at c->i ('{') read as a leaf candidate: 1, NOT_PLAIN (never ERR: no Python object is made). *depth*:
 * the object's nesting below the record (its members' values are checked with skip_value one level deeper, as
 * the skip of the whole section would: a section read in one pass accepts exactly what the skip accepted) */
static int
read_leaf(cur *c, leaf_t *lf, int depth)
{
    unsigned seen = 0;
    lf->null = 0;
    lf->has_type = lf->type_str = lf->has_dtype = lf->has_shape = lf->has_value = 0;
    lf->value_scalar = 1;
    lf->rg = -1;
    lf->ndim = 0;
    lf->n_members = 0;
    c->i++;  /* '{' */
    ws(c);
    if (c->i < c->n && c->s[c->i] == '}') {
        c->i++;
        return 1;
    }
    for (;;) {
        const char *k;
        Py_ssize_t kn;
        if (!plain_string(c, &k, &kn))
            return NOT_PLAIN;
        ws(c);
        if (c->i >= c->n || c->s[c->i] != ':')
            return NOT_PLAIN;
        c->i++;
        ws(c);
        lf->n_members++;
        int slot = -1;  /* tracked keys: 0-3 statistics, 4 type, 5 dtype, 6 shape, 7 value, 8 requires_grad */
        if (kn == 3 && memcmp(k, "Max", 3) == 0)
            slot = 0;
        else if (kn == 3 && memcmp(k, "Min", 3) == 0)
            slot = 1;
        else if (kn == 4 && memcmp(k, "Mean", 4) == 0)
            slot = 2;
        else if (kn == 4 && memcmp(k, "Norm", 4) == 0)
            slot = 3;
        else if (kn == 4 && memcmp(k, "type", 4) == 0)
            slot = 4;
        else if (kn == 5 && memcmp(k, "dtype", 5) == 0)
            slot = 5;
        else if (kn == 5 && memcmp(k, "shape", 5) == 0)
            slot = 6;
        else if (kn == 5 && memcmp(k, "value", 5) == 0)
            slot = 7;
        else if (kn == 13 && memcmp(k, "requires_grad", 13) == 0)
            slot = 8;
        else if ((kn == 3 && memcmp(k, "md5", 3) == 0) || (kn == 9 && memcmp(k, "data_name", 9) == 0))
            return NOT_PLAIN;  /* the string columns: read by the Python code */
        if (slot >= 0) {
            if (seen & (1u << slot))
                return NOT_PLAIN;  /* a key twice: the last one counts (the Python code reads it) */
            seen |= 1u << slot;
        }
        if (c->i >= c->n)
            return NOT_PLAIN;
        char ch = c->s[c->i];
        int kind;
        double d = 0.0;
        if (slot >= 0 && slot < 4) {
            if (ch == '{' || ch == '[' || ch == '"')
                return NOT_PLAIN;  /* the exact rules (stat_value) in Python */
            if (!scalar(c, &kind, &d))
                return NOT_PLAIN;
            if (kind == V_NULL) {
                d = g_nan;
                lf->null |= (uint8_t)(1u << slot);
            }
            lf->stat[slot] = d;
        } else if (slot == 4) {
            lf->has_type = 1;
            if (ch == '"') {
                if (!plain_string(c, &lf->type_s, &lf->type_n))
                    return NOT_PLAIN;
                lf->type_str = 1;
            } else if (ch == '{' || ch == '[' || !scalar(c, &kind, &d))
                return NOT_PLAIN;
        } else if (slot == 5) {
            lf->has_dtype = 1;
            if (ch != '"' || !plain_string(c, &lf->dtype_s, &lf->dtype_n))
                return NOT_PLAIN;
        } else if (slot == 6) {
            lf->has_shape = 1;
            if (ch != '[')
                return NOT_PLAIN;
            c->i++;
            ws(c);
            if (c->i < c->n && c->s[c->i] == ']')
                c->i++;
            else {
                for (;;) {
                    double dd;
                    int is_int;
                    int64_t iv;
                    if (c->i >= c->n || c->s[c->i] == '-' || lf->ndim >= MAX_DIMS ||
                        !number(c, &dd, &is_int, &iv) || !is_int)
                        return NOT_PLAIN;
                    lf->dims[lf->ndim++] = iv;
                    int me = member_end(c, ']');
                    if (me > 0)
                        continue;
                    if (me == 0)
                        break;
                    return NOT_PLAIN;
                }
            }
        } else if (slot == 7) {
            lf->has_value = 1;
            if (ch == '{' || ch == '[') {
                lf->value_scalar = 0;
                if (!skip_value(c, depth + 1))
                    return NOT_PLAIN;
            } else if (!scalar(c, &kind, &d))
                return NOT_PLAIN;
        } else if (slot == 8) {
            if (ch == 't' || ch == 'f') {
                if (!scalar(c, &kind, &d))
                    return NOT_PLAIN;
                lf->rg = d != 0.0;
            } else if (!skip_value(c, depth + 1))
                return NOT_PLAIN;
        } else if (!skip_value(c, depth + 1))
            return NOT_PLAIN;
        int me = member_end(c, '}');
        if (me > 0)
            continue;
        if (me == 0)
            break;
        return NOT_PLAIN;
    }
    for (int k = 0; k < 4; k++)
        if (!(seen & (1u << k))) {  /* absent: null, as the Python columns read a missing key */
            lf->stat[k] = g_nan;
            lf->null |= (uint8_t)(1u << k);
        }
    return 1;
}

/* an optimizer op's input_args (a list at c->i) as FileFacts.optimizer's scan reads it (_craw_facts.c,
 * scan_arguments): a positional argument that is an object with a string "type" and a "shape" (a tensor) gives that
 * scan nothing, so it is None here instead of a dict built for nothing; every other element is built as
 * build_value builds it. A new reference; NULL as build_value. */
static PyObject *
build_args(cur *c, const out_t *o)
{
    if (c->i >= c->n || c->s[c->i] != '[')
        return build_value(c, 1);
    PyObject *out = PyList_New(0);
    if (out == NULL)
        return NULL;
    c->i++;
    ws(c);
    if (c->i < c->n && c->s[c->i] == ']') {
        c->i++;
        return out;
    }
    for (Py_ssize_t k = 0;; k++) {
        PyObject *v = NULL;
        if (k < 64 && (o->arg_tensor >> k) & 1) {  /* read as a tensor leaf by read_section */
            v = Py_NewRef(Py_None);
            c->i = o->arg_end[k];
        } else if (c->i < c->n && c->s[c->i] == '{') {
            cur t = *c;
            leaf_t lf;
            if (read_leaf(&t, &lf, 2) == 1 && lf.type_str && lf.has_shape) {
                v = Py_NewRef(Py_None);
                c->i = t.i;
            }
        }
        if (v == NULL)
            v = build_value(c, 2);
        int bad = v == NULL || PyList_Append(out, v) < 0;
        Py_XDECREF(v);
        if (bad)
            break;
        int me = member_end(c, ']');
        if (me > 0)
            continue;
        if (me == 0)
            return out;
        break;
    }
    Py_DECREF(out);
    return NULL;
}

/* what an object item is: 1 a tensor leaf, 2 nothing to read (a scalar argument), NOT_PLAIN, ERR */
static int
classify(leaf_t *lf, PyObject **type_obj, PyObject **type_owned)
{
    *type_obj = *type_owned = NULL;
    if (lf->type_str && lf->has_dtype && lf->has_shape) {
        int tensor;
        PyObject *t = cached_str(lf->type_s, lf->type_n, &tensor, type_owned);
        if (t == NULL)
            return ERR;
        if (tensor) {
            *type_obj = t;
            return 1;
        }
        Py_CLEAR(*type_owned);
    }
    if (lf->n_members == 2 && lf->has_value && lf->value_scalar)
        return 2;  /* {type, value} (or any other key beside value): a scalar argument, nothing below it */
    return NOT_PLAIN;  /* a tensor-like object that is not a leaf, an empty or other object: the Python walk */
}

/* append one leaf (its label is out->label's text) */
static int
emit(out_t *o, leaf_t *lf, PyObject *type_obj, PyObject *role)
{
    PyObject *text;
    int64_t numel;
    int r = shape_of(lf->dims, lf->ndim, &text, &numel);
    if (r <= 0)
        return r;  /* 0: not a valid shape (the Python columns report it) */
    int owned = r == 2;
    int tensor;
    PyObject *dt_owned, *dt = cached_str(lf->dtype_s, lf->dtype_n, &tensor, &dt_owned);
    PyObject *label = dt ? ascii_str(o->label.p, o->label.n) : NULL;
    Py_hash_t h = label ? PyObject_Hash(label) : -1;
    int fail = label == NULL || h == -1 || code_of(&o->shape, text) < 0 || code_of(&o->dtype, dt) < 0
               || PyList_Append(o->labels, label) < 0 || code_of(&o->role, role) < 0;
    Py_XDECREF(label);
    Py_XDECREF(dt_owned);
    if (owned)
        Py_DECREF(text);
    if (fail)
        return ERR;
    int64_t hh = (int64_t)h;
    for (int k = 0; k < 4; k++)
        if (buf_add(&o->stat[k], &lf->stat[k], sizeof(double)) < 0)
            return ERR;
    if (buf_add(&o->null, &lf->null, 1) < 0 || buf_add(&o->numel, &numel, sizeof numel) < 0 ||
        buf_add(&o->label_hash, &hh, sizeof hh) < 0)
        return ERR;
    if (o->leaf_type == Py_None && type_obj != NULL) {
        const char *t = PyUnicode_AsUTF8(type_obj);
        if (t == NULL)
            return ERR;
        if (strncmp(t, "torch", 5) == 0 || strncmp(t, "mindspore", 9) == 0 || strncmp(t, "mindtorch", 9) == 0)
            Py_SETREF(o->leaf_type, Py_NewRef(type_obj));
    }
    o->n++;
    return 1;
}

/* the label text: prefix (o->label[0:base]) + "." + item */
static int
label_item(out_t *o, Py_ssize_t base, const char *item, Py_ssize_t n)
{
    o->label.n = base;
    return buf_add(&o->label, ".", 1) < 0 || buf_add(&o->label, item, n) < 0 ? ERR : 1;
}

static int
index_text(char *tmp, Py_ssize_t k)
{
    char rev[24];
    int n = 0;
    do {
        rev[n++] = (char)('0' + k % 10);
        k /= 10;
    } while (k > 0);
    for (int j = 0; j < n; j++)
        tmp[j] = rev[n - 1 - j];
    return n;
}

/* one item of a section (an array element or an object member) at c->i: 1, NOT_PLAIN, ERR. The label text is
 * built only for a leaf. */
static int
read_item(cur *c, out_t *o, Py_ssize_t base, const char *item, Py_ssize_t item_n, PyObject *role,
          PyObject *grads, int keep_grad, int nested)
{
    char ch = c->s[c->i];
    if (ch == '[') {  /* a list in a section (foreach ops' tensor lists): its items are {prefix}.{item}.{j} */
        if (nested)
            return NOT_PLAIN;  /* deeper: the Python walk */
        c->i++;
        ws(c);
        if (c->i < c->n && c->s[c->i] == ']') {
            c->i++;
            return 1;
        }
        if (label_item(o, base, item, item_n) < 0)
            return ERR;
        Py_ssize_t inner = o->label.n;
        char tmp[24];
        for (Py_ssize_t j = 0;; j++) {
            if (c->i >= c->n)
                return NOT_PLAIN;
            int r = read_item(c, o, inner, tmp, index_text(tmp, j), role, NULL, 0, 1);
            if (r != 1)
                return r;
            int me = member_end(c, ']');
            if (me > 0)
                continue;
            if (me == 0)
                return 1;
            return NOT_PLAIN;
        }
    }
    if (ch != '{')
        return skip_value(c, 1);  /* null, a number, a string, a boolean: no tensor */
    leaf_t lf;
    int r = read_leaf(c, &lf, nested ? 3 : 2);
    if (r != 1)
        return r;
    PyObject *type_obj, *type_owned;
    r = classify(&lf, &type_obj, &type_owned);
    if (r == 1)
        r = label_item(o, base, item, item_n) < 0 ? ERR : emit(o, &lf, type_obj, role);
    if (r >= 1) {
        if (keep_grad && lf.rg >= 0) {  /* FileFacts.node: a parameter's requires_grad */
            PyObject *k = ascii_str(item, item_n);
            PyObject *v = k ? Py_BuildValue("{sO}", "requires_grad", lf.rg ? Py_True : Py_False) : NULL;
            if (v == NULL || PyDict_SetItem(grads, k, v) < 0)
                r = ERR;
            Py_XDECREF(k);
            Py_XDECREF(v);
        }
        if (r == 2)
            r = 1;
    }
    Py_XDECREF(type_owned);
    return r;
}

/* one section's value at c->i (prefix text in o->label[0:base]): 1, NOT_PLAIN, ERR */
static int
read_section(cur *c, out_t *o, Py_ssize_t base, PyObject *role, PyObject *grads, int keep_grad, int args)
{
    char ch = c->s[c->i];
    char tmp[24];
    if (ch == 'n')
        return word(c, "null", 4) ? 1 : NOT_PLAIN;
    if (ch == '[') {
        c->i++;
        ws(c);
        if (c->i < c->n && c->s[c->i] == ']') {
            c->i++;
            return 1;
        }
        for (Py_ssize_t k = 0;; k++) {
            if (c->i >= c->n)
                return NOT_PLAIN;
            Py_ssize_t n0 = o->n, at = c->i;
            int leaf = c->s[c->i] == '{';
            int r = read_item(c, o, base, tmp, index_text(tmp, k), role, grads, 0, 0);
            if (r != 1)
                return r;
            if (args && leaf && k < 64 && o->n == n0 + 1) {  /* emitted: a string type and a shape (classify) */
                o->arg_tensor |= (uint64_t)1 << k;
                o->arg_start[k] = at;
                o->arg_end[k] = c->i;
            }
            int me = member_end(c, ']');
            if (me > 0)
                continue;
            if (me == 0)
                return 1;
            return NOT_PLAIN;
        }
    }
    if (ch != '{')
        return NOT_PLAIN;  /* a section that is a number or a string: the Python walk notes it unread */
    c->i++;
    ws(c);
    if (c->i < c->n && c->s[c->i] == '}') {
        c->i++;
        return 1;
    }
    const char *keys[MAX_KEYS];
    Py_ssize_t key_n[MAX_KEYS];
    int n_keys = 0;
    for (;;) {
        const char *k;
        Py_ssize_t kn;
        if (!plain_string(c, &k, &kn))
            return NOT_PLAIN;
        if ((kn == 4 && memcmp(k, "type", 4) == 0) || (kn == 5 && memcmp(k, "shape", 5) == 0))
            return NOT_PLAIN;  /* the section may itself be a tensor, or tensor-like: the Python walk */
        if (n_keys >= MAX_KEYS)
            return NOT_PLAIN;
        for (int j = 0; j < n_keys; j++)
            if (key_n[j] == kn && memcmp(keys[j], k, (size_t)kn) == 0)
                return NOT_PLAIN;  /* a key twice */
        keys[n_keys] = k;
        key_n[n_keys++] = kn;
        ws(c);
        if (c->i >= c->n || c->s[c->i] != ':')
            return NOT_PLAIN;
        c->i++;
        ws(c);
        if (c->i >= c->n)
            return NOT_PLAIN;
        int r = read_item(c, o, base, k, kn, role, grads, keep_grad, 0);
        if (r != 1)
            return r;
        int me = member_end(c, '}');
        if (me > 0)
            continue;
        if (me == 0)
            return 1;
        return NOT_PLAIN;
    }
}

/* ------------------------------------------------------------------------------------------- records */

static int
starts_any(const char *s, Py_ssize_t n, PyObject *prefixes)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        Py_ssize_t pn;
        const char *p = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(prefixes, i), &pn);
        if (p == NULL)
            return -1;
        if (pn <= n && memcmp(s, p, (size_t)pn) == 0)
            return 1;
    }
    return 0;
}

static int
has(const char *s, Py_ssize_t n, const char *sub)
{
    size_t m = strlen(sub);
    if ((size_t)n < m)
        return 0;
    for (Py_ssize_t i = 0; i + (Py_ssize_t)m <= n; i++)
        if (s[i] == sub[0] && memcmp(s + i, sub, m) == 0)
            return 1;
    return 0;
}

static int
ends(const char *s, Py_ssize_t n, const char *suf)
{
    size_t m = strlen(suf);
    return (size_t)n >= m && memcmp(s + n - m, suf, m) == 0;
}

/* whether precnb.io.msprobe.nodes.name_parts splits the (ASCII, printable) name s[0:n] in line as a param_grad node:
 * Module|Cell.{path}.{Class}.parameters_grad[.{call}]. 0 says nothing (the caller asks node_kind) */
static int
param_grad_name(const char *s, Py_ssize_t n)
{
    Py_ssize_t dot = n - 1;
    while (dot >= 0 && s[dot] != '.')
        dot--;
    if (dot < 0)
        return 0;
    Py_ssize_t head = dot, ln = n - dot - 1;  /* head: s[0:head]; last: s[dot+1:n] */
    if (!(ln == 15 && memcmp(s + dot + 1, "parameters_grad", 15) == 0)) {
        if (ln < 1 || ln >= 19)
            return 0;
        for (Py_ssize_t i = dot + 1; i < n; i++)
            if (s[i] < '0' || s[i] > '9')
                return 0;
        if (head < 16 || memcmp(s + head - 16, ".parameters_grad", 16) != 0)
            return 0;
        head -= 16;
    }
    Py_ssize_t pre = 0;  /* head.partition("."): pre s[0:pre], body after the dot, not empty */
    while (pre < head && s[pre] != '.')
        pre++;
    if (pre >= head - 1)
        return 0;
    return (pre == 6 && memcmp(s, "Module", 6) == 0) || (pre == 4 && memcmp(s, "Cell", 4) == 0);
}

/* a parameters_grad record at c->i ('{'): {param: [leaf]} or {param: leaf} (or null) */
static int
param_grad(cur *c, out_t *o, Py_ssize_t base)
{
    c->i++;
    ws(c);
    if (c->i < c->n && c->s[c->i] == '}') {
        c->i++;
        return 1;
    }
    const char *keys[MAX_KEYS];
    Py_ssize_t key_n[MAX_KEYS];
    int n_keys = 0;
    for (;;) {
        const char *k;
        Py_ssize_t kn;
        if (!plain_string(c, &k, &kn) || n_keys >= MAX_KEYS)
            return NOT_PLAIN;
        for (int j = 0; j < n_keys; j++)
            if (key_n[j] == kn && memcmp(keys[j], k, (size_t)kn) == 0)
                return NOT_PLAIN;
        keys[n_keys] = k;
        key_n[n_keys++] = kn;
        ws(c);
        if (c->i >= c->n || c->s[c->i] != ':')
            return NOT_PLAIN;
        c->i++;
        ws(c);
        if (c->i >= c->n)
            return NOT_PLAIN;
        int in_list = 0;
        if (c->s[c->i] == '[') {  /* [leaf]: a list of one */
            c->i++;
            ws(c);
            in_list = 1;
        }
        if (c->i >= c->n)
            return NOT_PLAIN;
        char ch = c->s[c->i];
        if (ch == 'n' && !in_list) {
            if (!word(c, "null", 4))
                return NOT_PLAIN;
        } else {
            if (ch != '{')
                return NOT_PLAIN;
            leaf_t lf;
            int r = read_leaf(c, &lf, 0);  /* (a parameters_grad record is read in one pass as it was) */
            if (r != 1)
                return r;
            PyObject *type_obj, *type_owned;
            r = classify(&lf, &type_obj, &type_owned);
            if (r == 1)
                r = label_item(o, base, k, kn) < 0 ? ERR : emit(o, &lf, type_obj, s_grad);
            else if (r == 2)
                r = NOT_PLAIN;
            Py_XDECREF(type_owned);
            if (r != 1)
                return r;
        }
        if (in_list) {
            ws(c);
            if (c->i >= c->n || c->s[c->i] != ']')
                return NOT_PLAIN;
            c->i++;
        }
        int me = member_end(c, '}');
        if (me > 0)
            continue;
        if (me == 0)
            return 1;
        return NOT_PLAIN;
    }
}

typedef struct {
    PyObject *names, *parents, *nodes, *node_parents, *counts, *todo;
    int need_backward, need_forward, sigs;  /* sigs: FileFacts.api's records (scalar signatures) as objects */
    int one_pass;  /* read each section where it stands (RETRY when the sections are not in reading order) */
    /* construct.json's nodes in its order (parents' keys, also names' values) and their parents: a dump's records
     * mostly come in that order, so the next record's name is looked for just after the last one found (no str
     * made, no hash, no lookup in the two large tables) before the tables are asked. NULL: not given */
    PyObject *order, *order_parents;
    Py_ssize_t cursor;  /* the index in order of the last record found there (-1: none yet) */
    PyObject *seen;  /* facts_key of the optimizer records whose arguments went to the run facts (NULL: not given) */
} ctx_t;

#define LOOK_AHEAD 4  /* entries of order tried after the cursor */
#define RESYNC 64  /* entries of order searched (by identity) for a name the tables found */

/* node and parent (borrowed) of the record name nm from order at the cursor: 1 found, 0 not */
static int
in_order(ctx_t *x, const char *nm, Py_ssize_t nn, PyObject **node, PyObject **parent)
{
    if (x->order == NULL)
        return 0;
    Py_ssize_t n = PyList_GET_SIZE(x->order);
    for (Py_ssize_t j = x->cursor + 1; j < n && j <= x->cursor + LOOK_AHEAD; j++) {
        PyObject *k = PyList_GET_ITEM(x->order, j);
        if (PyUnicode_CheckExact(k) && PyUnicode_IS_COMPACT_ASCII(k) && PyUnicode_GET_LENGTH(k) == nn &&
            memcmp(PyUnicode_DATA(k), nm, (size_t)nn) == 0) {
            *node = k;
            *parent = PyList_GET_ITEM(x->order_parents, j);
            x->cursor = j;
            return 1;
        }
    }
    return 0;
}

/* the cursor moved to *node* (found in the tables) when it is among the next RESYNC entries of order */
static void
resync(ctx_t *x, PyObject *node)
{
    if (x->order == NULL)
        return;
    Py_ssize_t n = PyList_GET_SIZE(x->order);
    for (Py_ssize_t j = x->cursor + 1; j < n && j <= x->cursor + RESYNC; j++)
        if (PyList_GET_ITEM(x->order, j) == node) {
            x->cursor = j;
            return;
        }
}

/* what a record's name and parent say: 1 it goes to the Python walk, 2 its arguments go to the run facts (an
 * optimizer op's), 0 nothing, -1 error */
static int
by_name(ctx_t *x, const char *nm, Py_ssize_t nn, PyObject *parent)
{
    if (x->need_backward && (ends(nm, nn, ".backward") || has(nm, nn, ".backward.")))
        return 1;  /* the release probe (_File.look) reads it */
    if (x->need_forward && (ends(nm, nn, ".forward") || has(nm, nn, ".forward.")))
        return 1;
    int r = starts_any(nm, nn, g_comm);  /* collectives: their groups and peers */
    if (r)
        return r;
    r = starts_any(nm, nn, g_undefined);  /* buffers the op ignores: read by the Python code */
    if (r)
        return r;
    if (has(nm, nn, "_fused_") || has(nm, nn, "addcdiv_") || has(nm, nn, "_foreach_lerp_"))
        return 2;  /* maybe an optimizer op: its arguments go to the run facts as objects */
    r = (int)PyUnicode_Tailmatch(parent, s_optimizer, 0, PY_SSIZE_T_MAX, -1);
    return r > 0 ? 2 : r;
}

/* what FileFacts' optimizer scan (facts_batch) makes of a record whose only facts are its arguments depends on
 * nothing else than its API name, its parent and the text of its input_args (but the tensors, which give it
 * nothing) and input_kwargs: a record with the same key as one whose facts were read adds nothing (each value is
 * known already, or the argument holds its most values), so it goes to no list. The key as bytes (new reference),
 * Py_None when the name is not {api}.{call}.forward, NULL on error. */
static PyObject *
facts_key(cur *c, const out_t *o, const char *nm, Py_ssize_t nn, PyObject *parent, const Py_ssize_t *at)
{
    if (nn < 8 || memcmp(nm + nn - 8, ".forward", 8) != 0)
        return Py_NewRef(Py_None);
    Py_ssize_t h = nn - 8, e = h - 1;  /* api_of's in-line case: s[:e] when s[e+1:h] is all digits, e > 0 */
    while (e >= 0 && nm[e] != '.')
        e--;
    if (e <= 0 || e + 1 >= h)
        return Py_NewRef(Py_None);
    for (Py_ssize_t i = e + 1; i < h; i++)
        if (nm[i] < '0' || nm[i] > '9')
            return Py_NewRef(Py_None);
    Py_ssize_t pn;
    const char *pt = PyUnicode_AsUTF8AndSize(parent, &pn);
    if (pt == NULL)
        return NULL;
    buf k = {0};
    int fail = buf_add(&k, nm, e) < 0 || buf_add(&k, "\0", 1) < 0 || buf_add(&k, pt, pn) < 0;
    int want[2] = {g_args_section, g_kwargs_section};
    for (int w = 0; w < 2 && !fail; w++) {
        Py_ssize_t a = want[w] < 0 ? -1 : at[want[w]];
        if (a < 0) {
            fail = buf_add(&k, "\1", 1) < 0;  /* absent */
            continue;
        }
        Py_ssize_t b = value_end(c->s, c->n, a);
        if (b < 0) {
            PyMem_Free(k.p);
            return Py_NewRef(Py_None);
        }
        fail = buf_add(&k, "\0", 1) < 0;
        for (int t = 0; t < 64 && w == 0 && !fail; t++)
            if ((o->arg_tensor >> t) & 1) {  /* the text up to the tensor, then a mark for it */
                fail = buf_add(&k, c->s + a, o->arg_start[t] - a) < 0 || buf_add(&k, "\2", 1) < 0;
                a = o->arg_end[t];
            }
        if (!fail)
            fail = buf_add(&k, c->s + a, b - a) < 0;
    }
    PyObject *out = fail ? NULL : PyBytes_FromStringAndSize(k.p, k.n);
    PyMem_Free(k.p);
    return out;
}

/* one record ("name": value) whose name is nm; c->i at the value. 1 read, NOT_PLAIN, ERR */
static int
read_record(cur *c, out_t *o, ctx_t *x, const char *nm, Py_ssize_t nn)
{
    PyObject *key = NULL, *node = NULL, *parent = NULL;
    Py_hash_t h;
    if (in_order(x, nm, nn, &node, &parent))
        h = PyObject_Hash(node);  /* (the tables' key: its hash is cached) */
    else {
        key = ascii_str(nm, nn);
        if (key == NULL)
            return ERR;
        h = PyObject_Hash(key);
        node = h == -1 ? NULL : PyDict_GetItemWithError(x->names, key);
        /* names[k] is parents' own key object k (construct_table, _File): found by identity, no second compare */
        parent = node == NULL && PyErr_Occurred() ? NULL
                 : PyDict_GetItemWithError(x->parents, node != NULL && PyUnicode_CheckExact(node) ? node : key);
        if (node != NULL)
            resync(x, node);
    }
    if (h == -1 || PyErr_Occurred()) {
        Py_XDECREF(key);
        return ERR;
    }
    if (node == NULL)
        node = key;
    if (parent == NULL)
        parent = s_empty;
    if (!PyUnicode_CheckExact(parent) || !PyUnicode_CheckExact(node)) {
        Py_XDECREF(key);
        return NOT_PLAIN;
    }
    Py_INCREF(node);
    Py_INCREF(parent);
    Py_XDECREF(key);
    int r, opt = 0, sig = 0;
    Py_ssize_t n0 = o->n, rec_start = c->i;
    PyObject *grads = NULL, *facts = NULL;
    o->arg_tensor = 0;
    if (c->s[c->i] == 'n') {  /* a null record: nothing */
        r = word(c, "null", 4) ? 1 : NOT_PLAIN;
        goto done;
    }
    if (c->s[c->i] != '{') {
        r = NOT_PLAIN;  /* not an object: the Python code reports it */
        goto done;
    }
    opt = by_name(x, nm, nn, parent);
    if (opt < 0 || opt == 1) {
        r = opt < 0 ? ERR : NOT_PLAIN;
        goto done;
    }
    o->label.n = 0;
    if (buf_add(&o->label, nm, nn) < 0) {
        r = ERR;
        goto done;
    }
    if (has(nm, nn, "parameters_grad")) {  /* Walk.node's test: the text, then node_kind */
        PyObject *kind = NULL;
        if (PyUnicode_IS_ASCII(node) && PyUnicode_GET_LENGTH(node) == nn &&
            memcmp(PyUnicode_DATA(node), nm, (size_t)nn) == 0 && param_grad_name(nm, nn))  /* in line, no call */
            r = 1;
        else {
            kind = PyObject_CallOneArg(g_node_kind, node);
            r = kind == NULL ? -1 : PyObject_RichCompareBool(kind, s_param_grad_kind, Py_EQ);
        }
        Py_XDECREF(kind);
        if (r != 0) {
            r = r < 0 ? ERR : param_grad(c, o, nn);
            goto done;
        }
    }
    /* the sections: where each starts. In one pass (the usual case) each is read where it stands, as long as they
     * come in reading order (g_n_order: the labels' order); else, and in two passes, each is read in reading order
     * after the whole record was checked. Anything not plain found after a section was read rolls the record
     * back (read_records) as it would have rolled back a section read in the second pass. */
    Py_ssize_t at[MAX_SECTIONS];
    for (int k = 0; k < g_n_order; k++)
        at[k] = -1;
    int found = 0, others = 0, last = -1;
    c->i++;
    ws(c);
    if (c->i < c->n && c->s[c->i] == '}')
        c->i++;
    else {
        for (;;) {
            const char *k;
            Py_ssize_t kn;
            if (!plain_string(c, &k, &kn)) {
                r = NOT_PLAIN;
                goto done;
            }
            ws(c);
            if (c->i >= c->n || c->s[c->i] != ':') {
                r = NOT_PLAIN;
                goto done;
            }
            c->i++;
            ws(c);
            int sec = -1;
            for (int j = 0; j < g_n_order; j++)
                if (g_key_len[j] == kn && memcmp(g_keys[j], k, (size_t)kn) == 0) {
                    sec = j;
                    break;
                }
            if (sec >= 0) {
                if (at[sec] >= 0) {
                    r = NOT_PLAIN;  /* a section twice */
                    goto done;
                }
                at[sec] = c->i;
                found++;
                if (x->one_pass) {
                    if (sec < last) {
                        r = RETRY;
                        goto done;
                    }
                    last = sec;
                    if (sec == g_param_section && grads == NULL && (grads = PyDict_New()) == NULL) {
                        r = ERR;
                        goto done;
                    }
                    o->label.n = nn;
                    if (buf_add(&o->label, PyUnicode_AsUTF8(g_sections[sec]),
                                PyUnicode_GET_LENGTH(g_sections[sec])) < 0)
                        r = ERR;
                    else
                        r = read_section(c, o, o->label.n, g_roles[sec], grads, sec == g_param_section,
                                         sec == g_args_section);
                    if (r != 1)
                        goto done;
                    goto next_member;
                }
            } else {
                others++;
                if (c->i < c->n && (c->s[c->i] == '{' || c->s[c->i] == '[')) {
                    /* a key beside the sections: a record flag unless it holds something (empty only) */
                    char close = c->s[c->i] == '{' ? '}' : ']';
                    Py_ssize_t j = c->i + 1;
                    while (j < c->n && (c->s[j] == ' ' || c->s[j] == '\n' || c->s[j] == '\t' || c->s[j] == '\r'))
                        j++;
                    if (j >= c->n || c->s[j] != close) {
                        r = NOT_PLAIN;
                        goto done;
                    }
                }
            }
            if (!skip_value(c, 1)) {
                r = NOT_PLAIN;
                goto done;
            }
        next_member:;
            int me = member_end(c, '}');
            if (me > 0)
                continue;
            if (me == 0)
                break;
            r = NOT_PLAIN;
            goto done;
        }
    }
    if (!found && others) {
        r = NOT_PLAIN;  /* no known section: the record may itself be a tensor (debug.json) */
        goto done;
    }
    Py_ssize_t end = c->i;
    if (!x->one_pass && g_param_section >= 0 && at[g_param_section] >= 0) {
        grads = PyDict_New();
        if (grads == NULL) {
            r = ERR;
            goto done;
        }
    }
    r = 1;
    for (int k = 0; k < g_n_order && r == 1 && !x->one_pass; k++) {
        if (at[k] < 0)
            continue;
        cur s = {c->s, c->n, at[k]};
        o->label.n = nn;
        if (buf_add(&o->label, PyUnicode_AsUTF8(g_sections[k]), PyUnicode_GET_LENGTH(g_sections[k])) < 0)
            r = ERR;
        else
            r = read_section(&s, o, o->label.n, g_roles[k], grads, k == g_param_section, k == g_args_section);
    }
    c->i = end;
    /* with signatures, an API forward record goes to FileFacts.api (flag 2, as _File.record sets it), which reads
     * its {type, value} scalar arguments only: a record whose text holds no "value" key has none (signature 0,
     * nothing noted), so only the others are built */
    if (r == 1 && x->sigs && ends(nm, nn, ".forward") && !(nn >= 7 && memcmp(nm, "Module.", 7) == 0) &&
        !(nn >= 5 && memcmp(nm, "Cell.", 5) == 0))
        sig = has(c->s + rec_start, end - rec_start, "\"value\"");
    PyObject *fkey = NULL;  /* the facts_key to note once this record's facts are built */
    if (r == 1 && opt == 2 && !sig && x->seen != NULL && !(grads != NULL && PyDict_GET_SIZE(grads))) {
        fkey = facts_key(c, o, nm, nn, parent, at);
        int known = fkey == NULL ? -1 : fkey == Py_None ? 0 : PySet_Contains(x->seen, fkey);
        if (known < 0)
            r = ERR;
        else if (known)
            opt = 0;  /* an optimizer op whose arguments were read already: nothing new */
        if (known || fkey == Py_None)
            Py_CLEAR(fkey);
    }
    if (r == 1 && (opt == 2 || sig)) {  /* FileFacts.optimizer / .api read input_args and input_kwargs: those, as objects */
        facts = PyDict_New();
        int want[2] = {g_args_section, g_kwargs_section};
        for (int k = 0; k < 2 && facts != NULL && r == 1; k++) {
            if (want[k] < 0 || at[want[k]] < 0)
                continue;
            cur s = {c->s, c->n, at[want[k]]};
            /* without a signature, only the optimizer scan reads them: its tensors are not built */
            PyObject *v = want[k] == g_args_section && !sig ? build_args(&s, o) : build_value(&s, 1);
            if (v == NULL)
                r = PyErr_Occurred() ? ERR : NOT_PLAIN;
            else if (PyDict_SetItem(facts, g_keys_obj[want[k]], v) < 0)
                r = ERR;
            Py_XDECREF(v);
        }
        if (facts == NULL)
            r = ERR;
        if (r == 1 && fkey != NULL && PySet_Add(x->seen, fkey) < 0)
            r = ERR;
    }
    Py_XDECREF(fkey);
done:
    if (r == 1) {
        Py_ssize_t n = o->n - n0;
        int64_t hh = (int64_t)h;
        if (buf_add(&o->name_hash, &hh, sizeof hh) < 0)
            r = ERR;
        else if (n && (PyList_Append(x->nodes, node) < 0 || PyList_Append(x->node_parents, parent) < 0))
            r = ERR;
        else if (n) {
            PyObject *cnt = PyLong_FromSsize_t(n);
            if (cnt == NULL || PyList_Append(x->counts, cnt) < 0)
                r = ERR;
            Py_XDECREF(cnt);
        }
        int with_grads = grads != NULL && PyDict_GET_SIZE(grads);
        int flags = (with_grads || (facts != NULL && opt == 2) ? 1 : 0) | (sig ? 2 : 0);
        if (r == 1 && flags) {
            /* the run facts: FileFacts.node (flag 1) reads the parameters' requires_grad and an optimizer op's
             * arguments, FileFacts.api (flag 2) the scalar arguments, and nothing else of the record */
            PyObject *rec = facts != NULL ? Py_NewRef(facts) : PyDict_New();
            if (rec != NULL && with_grads && PyDict_SetItemString(rec, "parameters", grads) < 0)
                Py_CLEAR(rec);
            PyObject *entry = rec ? Py_BuildValue("iOOO", flags, node, rec, parent) : NULL;
            if (entry == NULL || PyList_Append(x->todo, entry) < 0)
                r = ERR;
            Py_XDECREF(rec);
            Py_XDECREF(entry);
        }
    }
    Py_XDECREF(grads);
    Py_XDECREF(facts);
    Py_DECREF(node);
    Py_DECREF(parent);
    return r;
}

static int
take_back(PyObject *list, Py_ssize_t n0)
{
    return PyList_GET_SIZE(list) > n0 ? PyList_SetSlice(list, n0, PyList_GET_SIZE(list), NULL) : 0;
}

static PyObject *
bytes_of(buf *b)
{
    return PyBytes_FromStringAndSize(b->p ? b->p : "", b->n);
}

/* read_records(raw, pos, names, parents, labels, roles, shapes, dtypes, nodes, node_parents, counts, todo,
 *              need_backward, need_forward[, sigs, order, order_parents, cursor, seen])
 * -> (pos, records, stats, null, numel, label_hashes, name_hashes, leaf_type, back, role_codes, shape_codes,
 *     dtype_codes, cursor)
 * order, order_parents: construct.json's nodes in its order (parents' own key objects, which names maps to
 * themselves) and their parents, cursor: where the last call left off in order (see ctx_t); seen: a set the file's
 * calls share (facts_key).
 * back: None at the end of raw, else (start, end) of the member handed back (pos is end). roles, shapes, dtypes
 * (empty lists) receive the distinct str objects of the leaves read, in order of first use, and *_codes (int32
 * per leaf) index them: no Python object per leaf for those three columns. */
static PyObject *
read_records(PyObject *Py_UNUSED(self), PyObject *args)
{
    Py_buffer raw;
    Py_ssize_t pos;
    ctx_t x;
    out_t o;
    memset(&o, 0, sizeof o);
    x.sigs = 0;
    x.order = x.order_parents = x.seen = NULL;
    x.cursor = -1;
    if (!PyArg_ParseTuple(args, "y*nO!O!O!O!O!O!O!O!O!O!pp|pO!O!nO!", &raw, &pos, &PyDict_Type, &x.names, &PyDict_Type,
                          &x.parents, &PyList_Type, &o.labels, &PyList_Type, &o.role.list, &PyList_Type,
                          &o.shape.list, &PyList_Type, &o.dtype.list, &PyList_Type, &x.nodes, &PyList_Type, &x.node_parents,
                          &PyList_Type, &x.counts, &PyList_Type, &x.todo, &x.need_backward, &x.need_forward, &x.sigs,
                          &PyList_Type, &x.order, &PyList_Type, &x.order_parents, &x.cursor, &PySet_Type, &x.seen))
        return NULL;
    if (x.order != NULL && (PyList_GET_SIZE(x.order) != PyList_GET_SIZE(x.order_parents) || x.cursor < -1)) {
        PyErr_SetString(PyExc_ValueError, "order and order_parents: one parent per node; cursor >= -1");
        PyBuffer_Release(&raw);
        return NULL;
    }
    PyObject *result = NULL, *back = NULL;
    if (g_non_tensor == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_craw.configure() was not called");
        goto out;
    }
    g_call++;  /* the code slots of earlier calls are empty now */
    o.role.slots = g_code_slots[0];
    o.shape.slots = g_code_slots[1];
    o.dtype.slots = g_code_slots[2];
    o.leaf_type = Py_NewRef(Py_None);
    cur c = {raw.buf, raw.len, pos};
    Py_ssize_t records = 0;
    ws(&c);
    if (pos > 0 && c.i < c.n) {  /* after a record handed back: the comma between members */
        if (c.s[c.i] != ',') {
            PyErr_Format(PyExc_ValueError, "expected ',' at byte %zd", c.i);
            goto out;
        }
        c.i++;
        ws(&c);
        if (c.i >= c.n) {
            PyErr_Format(PyExc_ValueError, "a trailing ',' at byte %zd", c.i);
            goto out;
        }
    }
    while (c.i < c.n) {
        Py_ssize_t start = c.i;
        Py_ssize_t n_labels = PyList_GET_SIZE(o.labels), n_roles = PyList_GET_SIZE(o.role.list),
                   n_shapes = PyList_GET_SIZE(o.shape.list), n_dtypes = PyList_GET_SIZE(o.dtype.list), n_nodes = PyList_GET_SIZE(x.nodes),
                   n_parents = PyList_GET_SIZE(x.node_parents), n_counts = PyList_GET_SIZE(x.counts),
                   n_todo = PyList_GET_SIZE(x.todo), n0 = o.n, nh = o.name_hash.n;
        const char *nm;
        Py_ssize_t nn;
        int r = NOT_PLAIN;
        x.one_pass = 1;
        for (;;) {
            if (plain_string(&c, &nm, &nn)) {
                ws(&c);
                if (c.i < c.n && c.s[c.i] == ':') {
                    c.i++;
                    ws(&c);
                    r = c.i < c.n ? read_record(&c, &o, &x, nm, nn) : NOT_PLAIN;
                }
            }
            if (r == ERR)
                goto out;
            if (r == 1)
                break;
            /* added nothing: take back what this record appended */
            if (take_back(o.labels, n_labels) < 0 || take_back(o.role.list, n_roles) < 0 ||
                take_back(o.shape.list, n_shapes) < 0 || take_back(o.dtype.list, n_dtypes) < 0 ||
                take_back(x.nodes, n_nodes) < 0 || take_back(x.node_parents, n_parents) < 0 ||
                take_back(x.counts, n_counts) < 0 || take_back(x.todo, n_todo) < 0)
                goto out;
            for (int k = 0; k < 4; k++)
                o.stat[k].n = n0 * (Py_ssize_t)sizeof(double);
            o.null.n = n0;
            o.numel.n = o.label_hash.n = n0 * 8;
            o.role.codes.n = o.shape.codes.n = o.dtype.codes.n = n0 * 4;
            o.n = n0;
            o.name_hash.n = nh;
            if (r != RETRY)
                break;
            c.i = start;  /* its sections out of reading order: read again, in two passes */
            x.one_pass = 0;
            r = NOT_PLAIN;
        }
        if (r == NOT_PLAIN) {  /* find the end of the member handed back */
            Py_ssize_t e = value_end(c.s, c.n, start);  /* the name */
            Py_ssize_t j = e;
            while (j >= 0 && j < c.n && (c.s[j] == ' ' || c.s[j] == '\n' || c.s[j] == '\t' || c.s[j] == '\r'))
                j++;
            if (e >= 0 && j < c.n && c.s[j] == ':') {
                j++;
                while (j < c.n && (c.s[j] == ' ' || c.s[j] == '\n' || c.s[j] == '\t' || c.s[j] == '\r'))
                    j++;
                e = j < c.n ? value_end(c.s, c.n, j) : -1;
            } else
                e = -1;
            if (e < 0) {
                PyErr_Format(PyExc_ValueError, "no JSON member at byte %zd", start);
                goto out;
            }
            back = Py_BuildValue("nn", start, e);
            if (back == NULL)
                goto out;
            c.i = e;
            break;
        }
        records++;
        ws(&c);
        if (c.i >= c.n)
            break;
        if (c.s[c.i] != ',') {
            PyErr_Format(PyExc_ValueError, "expected ',' at byte %zd", c.i);
            goto out;
        }
        c.i++;
        ws(&c);
        if (c.i >= c.n) {
            PyErr_Format(PyExc_ValueError, "a trailing ',' at byte %zd", c.i);
            goto out;
        }
    }
    /* the statistics as one [4][n] table */
    buf table = {0};
    for (int k = 0; k < 4; k++)
        if (buf_add(&table, o.stat[k].p ? o.stat[k].p : "", o.stat[k].n) < 0)
            goto out_table;
    result = Py_BuildValue("nnNNNNNOONNNn", c.i, records, bytes_of(&table), bytes_of(&o.null), bytes_of(&o.numel),
                           bytes_of(&o.label_hash), bytes_of(&o.name_hash), o.leaf_type, back ? back : Py_None,
                           bytes_of(&o.role.codes), bytes_of(&o.shape.codes), bytes_of(&o.dtype.codes),
                           x.cursor);
out_table:
    PyMem_Free(table.p);
out:
    for (int k = 0; k < 4; k++)
        PyMem_Free(o.stat[k].p);
    PyMem_Free(o.null.p);
    PyMem_Free(o.numel.p);
    PyMem_Free(o.label_hash.p);
    PyMem_Free(o.name_hash.p);
    PyMem_Free(o.role.codes.p);
    PyMem_Free(o.shape.codes.p);
    PyMem_Free(o.dtype.codes.p);
    PyMem_Free(o.label.p);
    Py_XDECREF(o.leaf_type);
    Py_XDECREF(back);
    PyBuffer_Release(&raw);
    return result;
}

/* configure(non_tensor, order, undefined, comm, node_kind, shape_info) */
static PyObject *
configure(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *non_tensor, *order, *undefined, *comm, *node_kind, *shape_info;
    if (!PyArg_ParseTuple(args, "O!O!O!O!OO", &PyFrozenSet_Type, &non_tensor, &PyTuple_Type, &order, &PyTuple_Type,
                          &undefined, &PyTuple_Type, &comm, &node_kind, &shape_info))
        return NULL;
    if (!PyCallable_Check(node_kind) || !PyCallable_Check(shape_info)) {
        PyErr_SetString(PyExc_TypeError, "node_kind, shape_info: callables");
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(order);
    if (n > MAX_SECTIONS) {
        PyErr_SetString(PyExc_ValueError, "too many sections");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(order, i);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3)
            goto bad;
        for (int j = 0; j < 3; j++)
            if (!PyUnicode_CheckExact(PyTuple_GET_ITEM(t, j)) || !PyUnicode_IS_ASCII(PyTuple_GET_ITEM(t, j)))
                goto bad;
        Py_ssize_t kn;
        const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(t, 0), &kn);
        if (k == NULL || kn >= 32)
            goto bad;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyTuple_GET_ITEM(order, i);
        Py_ssize_t kn;
        const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(t, 0), &kn);
        memcpy(g_keys[i], k, (size_t)kn);
        g_key_len[i] = kn;
        Py_XSETREF(g_sections[i], Py_NewRef(PyTuple_GET_ITEM(t, 1)));
        Py_XSETREF(g_roles[i], Py_NewRef(PyTuple_GET_ITEM(t, 2)));
        Py_XSETREF(g_keys_obj[i], Py_NewRef(PyTuple_GET_ITEM(t, 0)));
        if (kn == 10 && memcmp(k, "parameters", 10) == 0)
            g_param_section = (int)i;
        if (kn == 10 && memcmp(k, "input_args", 10) == 0)
            g_args_section = (int)i;
        if (kn == 12 && memcmp(k, "input_kwargs", 12) == 0)
            g_kwargs_section = (int)i;
    }
    g_n_order = n;
    if (s_empty == NULL) {
        s_empty = PyUnicode_InternFromString("");
        s_grad = PyUnicode_InternFromString("grad");
        s_param_grad_kind = PyUnicode_InternFromString("param_grad");
        s_optimizer = PyUnicode_InternFromString("optimizer");
        if (!s_empty || !s_grad || !s_param_grad_kind || !s_optimizer)
            return NULL;
    }
    Py_XSETREF(g_non_tensor, Py_NewRef(non_tensor));
    Py_XSETREF(g_undefined, Py_NewRef(undefined));
    Py_XSETREF(g_comm, Py_NewRef(comm));
    Py_XSETREF(g_node_kind, Py_NewRef(node_kind));
    Py_XSETREF(g_shape_info, Py_NewRef(shape_info));
    for (int i = 0; i < STR_SLOTS; i++) {  /* the types' tensor flags follow the rules configured */
        Py_CLEAR(g_strs[i].obj);
        g_strs[i].n = 0;
    }
    for (int i = 0; i < SHAPE_SLOTS; i++)
        Py_CLEAR(g_shapes[i].text);
    Py_RETURN_NONE;
bad:
    PyErr_SetString(PyExc_TypeError, "order: (key, section, role) ASCII strings, keys under 32 bytes");
    return NULL;
}

/* number_value(text): the double read_records reads for one JSON number's text, or None (not plain) */
static PyObject *
number_value(PyObject *Py_UNUSED(self), PyObject *arg)
{
    if (!PyBytes_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "bytes");
        return NULL;
    }
    /* followed by a delimiter, as every number of a batch is */
    Py_ssize_t n = PyBytes_GET_SIZE(arg);
    char *tmp = PyMem_Malloc((size_t)n + 2);
    if (tmp == NULL)
        return PyErr_NoMemory();
    memcpy(tmp, PyBytes_AS_STRING(arg), (size_t)n);
    tmp[n] = ',';
    tmp[n + 1] = '\0';
    cur c = {tmp, n + 1, 0};
    double d;
    int is_int;
    int64_t iv;
    int ok = number(&c, &d, &is_int, &iv) && c.i == n;
    PyMem_Free(tmp);
    if (!ok)
        Py_RETURN_NONE;
    return is_int ? PyLong_FromLongLong(iv) : PyFloat_FromDouble(d);
}

/* precnb/io/_craw_construct.c */
PyObject *craw_construct_table(PyObject *self, PyObject *arg);
/* precnb/io/_craw_parts.c */
PyObject *craw_parts_add(PyObject *self, PyObject *args);
/* precnb/io/_craw_facts.c */
PyObject *craw_optimizer_args(PyObject *self, PyObject *args);
PyObject *craw_facts_batch(PyObject *self, PyObject *args);

static PyMethodDef methods[] = {
    {"number_value", number_value, METH_O, "The value read_records reads for one number's text (tests)."},
    {"configure", configure, METH_VARARGS, "Set the walk's rules (precnb.io.msprobe.walk calls it once)."},
    {"read_records", read_records, METH_VARARGS, "Read the plain records of one batch's text (see the module)."},
    {"parts_add", craw_parts_add, METH_VARARGS, "NodeParts.add of one batch's node names (see _craw_parts.c)."},
    {"optimizer_args", craw_optimizer_args, METH_VARARGS, "FileFacts.optimizer's argument scan (see _craw_facts.c)."},
    {"facts_batch", craw_facts_batch, METH_VARARGS, "FileFacts.batch's loop (see _craw_facts.c)."},
    {"construct_table", craw_construct_table, METH_O,
     "(parents, names) of a plain construct.json's bytes, or None (see _craw_construct.c)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_craw",
                                    "The common dump.json records read from their bytes (precnb/io/_craw.c).", -1,
                                    methods};

PyMODINIT_FUNC
PyInit__craw(void)
{
    g_nan = PyOS_string_to_double("nan", NULL, NULL);  /* float('nan') */
    return PyModule_Create(&module);
}
