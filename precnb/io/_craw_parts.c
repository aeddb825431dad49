/* precnb.io._craw.parts_add: NodeParts.add (precnb.io.msprobe.nodes) in C (part of _craw).
 *
 * parts_add(nodes, parents, kinds, apis, modules, dirs, calls, out, of_parent, names, module_of, name_parts)
 * splits the node names of one batch (the nodes that had tensors, their construct.json parents aligned) and
 * appends their (kind, api, module, direction, call) to the five lists, and the parents to *out*, exactly as
 * the Python loop of NodeParts.add does: the common spellings ({api}.{call}.{direction},
 * Module|Cell.{path}.{Class}.{direction}.{call}, Module|Cell.{path}.{Class}.parameters_grad[.{call}]) in line,
 * every other name through name_parts, every parent's module once through module_of (of_parent caches it);
 * equal texts are kept as one object (names). PRECNB_PURE_PARSER=1 selects the Python loop, the reference
 * (tests/test_parse_paths.py checks that both give identical records).
 *
 * Written for precnb (no third-party code): CPython C API only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

PyObject *craw_parts_add(PyObject *self, PyObject *args);

static PyObject *s_param_grad, *s_param_grad_kind, *s_kind_api, *s_kind_module, *s_forward, *s_backward, *s_empty;

static int
parts_strings(void)
{
#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1
    INTERN(s_param_grad, "parameters_grad");
    INTERN(s_param_grad_kind, "param_grad");
    INTERN(s_kind_module, "module");
    INTERN(s_forward, "forward");
    INTERN(s_backward, "backward");
    INTERN(s_empty, "");
    INTERN(s_kind_api, "api");  /* last: set means all are */
#undef INTERN
    return 0;
}


static int
all_digits(const char *s, Py_ssize_t n)
{
    if (n <= 0)
        return 0;
    for (Py_ssize_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

/* the int of n ASCII digits (n < 19: it fits in 64 bits) */
static PyObject *
digits_value(const char *s, Py_ssize_t n)
{
    long long v = 0;
    for (Py_ssize_t i = 0; i < n; i++)
        v = v * 10 + (s[i] - '0');
    return PyLong_FromLongLong(v);
}

static Py_ssize_t
rfind_dot(const char *s, Py_ssize_t end)
{
    for (Py_ssize_t i = end - 1; i >= 0; i--)
        if (s[i] == '.')
            return i;
    return -1;
}

/* one(text): names.setdefault(text, text) of s[a:b] (a new reference) */
static PyObject *
one_text(PyObject *names, const char *s, Py_ssize_t a, Py_ssize_t b)
{
    PyObject *text = PyUnicode_FromStringAndSize(s + a, b - a);
    if (text == NULL)
        return NULL;
    PyObject *kept = PyDict_SetDefault(names, text, text);
    Py_XINCREF(kept);
    Py_DECREF(text);
    return kept;
}

static int
append_parts(PyObject *const *lists, PyObject *kind, PyObject *api, PyObject *module, PyObject *direction,
             PyObject *call)
{
    /* lists: kinds, apis, modules, dirs, calls; api and call are new references (stolen) */
    int rc = -1;
    if (api != NULL && call != NULL && PyList_Append(lists[0], kind) == 0 && PyList_Append(lists[1], api) == 0 &&
        PyList_Append(lists[2], module) == 0 && PyList_Append(lists[3], direction) == 0 &&
        PyList_Append(lists[4], call) == 0)
        rc = 0;
    Py_XDECREF(api);
    Py_XDECREF(call);
    return rc;
}

/* The common spellings name_parts splits with string methods (ASCII, no line break; the caller checks that the
 * name does not hold "parameters_grad"): 1 {api}.{call}.{direction} (api s[a0:a1]), 2
 * Module|Cell.{path}.{Class}.{direction}.{call} (class s[a0:a1], path s[m0:m1]); the call's digits s[c0:c1].
 * 0: not one of them. */
typedef struct {
    int fwd;
    Py_ssize_t a0, a1, m0, m1, c0, c1;
} name_split;

static int
parse_common(const char *s, Py_ssize_t n, name_split *out)
{
    if (memchr(s, '\n', (size_t)n) != NULL)
        return 0;
    Py_ssize_t d = rfind_dot(s, n);  /* head = s[:d], last = s[d+1:] (d == -1: head "", last the whole) */
    const char *last = s + d + 1;
    Py_ssize_t n_last = n - d - 1;
    int fwd = n_last == 7 && memcmp(last, "forward", 7) == 0;
    int bwd = n_last == 8 && memcmp(last, "backward", 8) == 0;
    if (fwd || bwd) {  /* {api}.{call}.{direction} */
        if (d < 0)
            return 0;
        Py_ssize_t e = rfind_dot(s, d);  /* api = s[:e], call = s[e+1:d] */
        if (e <= 0)
            return 0;  /* no separator, or an empty api */
        Py_ssize_t n_call = d - e - 1;
        if (!all_digits(s + e + 1, n_call) || n_call >= 19)
            return 0;
        *out = (name_split){fwd, 0, e, 0, 0, e + 1, d};
        return 1;
    }
    if (d < 0 || !all_digits(last, n_last) || n_last >= 19)
        return 0;
    Py_ssize_t e = rfind_dot(s, d);  /* body = s[:e], direction = s[e+1:d] */
    if (e < 0)
        return 0;
    Py_ssize_t n_dir = d - e - 1;
    fwd = n_dir == 7 && memcmp(s + e + 1, "forward", 7) == 0;
    bwd = n_dir == 8 && memcmp(s + e + 1, "backward", 8) == 0;
    if (!fwd && !bwd)
        return 0;
    const char *dot = memchr(s, '.', (size_t)e);  /* pre = s[:p], body = s[p+1:e] */
    if (dot == NULL)
        return 0;
    Py_ssize_t p = dot - s;
    if (p + 1 >= e)
        return 0;  /* an empty body */
    if (!((p == 6 && memcmp(s, "Module", 6) == 0) || (p == 4 && memcmp(s, "Cell", 4) == 0)))
        return 0;
    Py_ssize_t c = rfind_dot(s, e);  /* within body: path = s[p+1:c], cls = s[c+1:e] (no dot: path "") */
    if (c <= p)
        *out = (name_split){fwd, p + 1, e, 0, 0, d + 1, n};
    else
        *out = (name_split){fwd, c + 1, e, p + 1, c, d + 1, n};
    return 2;
}

/* name_parts' Module|Cell.{path}.{Class}.parameters_grad[.{call}] (ASCII, no line break, holding "parameters_grad"):
 * 1 (class s[a0:a1], path s[m0:m1], the call's digits s[c0:c1], none when c0 == c1: call -1), 0 not that. */
static int
parse_param_grad(const char *s, Py_ssize_t n, name_split *out)
{
    if (memchr(s, '\n', (size_t)n) != NULL)
        return 0;
    Py_ssize_t d = rfind_dot(s, n);  /* head = s[:h], last = s[d+1:] */
    const char *last = s + d + 1;
    Py_ssize_t n_last = n - d - 1, h = d < 0 ? 0 : d, c0 = 0, c1 = 0;
    if (!(n_last == 15 && memcmp(last, "parameters_grad", 15) == 0)) {
        /* {head}.parameters_grad.{call}, else not this spelling (head "") */
        if (!(all_digits(last, n_last) && n_last < 19 && h >= 16 && memcmp(s + h - 16, ".parameters_grad", 16) == 0))
            return 0;
        c0 = d + 1;
        c1 = n;
        h -= 16;
    }
    const char *dot = memchr(s, '.', (size_t)h);  /* pre = s[:p], body = s[p+1:h] */
    if (dot == NULL)
        return 0;
    Py_ssize_t p = dot - s;
    if (p + 1 >= h)
        return 0;
    if (!((p == 6 && memcmp(s, "Module", 6) == 0) || (p == 4 && memcmp(s, "Cell", 4) == 0)))
        return 0;
    Py_ssize_t c = rfind_dot(s, h);
    if (c <= p)
        *out = (name_split){0, p + 1, h, 0, 0, c0, c1};
    else
        *out = (name_split){0, c + 1, h, p + 1, c, c0, c1};
    return 1;
}

/* split_param_grad: NodeParts.add of a parameters_grad node of that spelling: 1 done, 0 not it, -1 error */
static int
split_param_grad(PyObject *node, PyObject *names, PyObject *const *lists)
{
    if (!PyUnicode_CheckExact(node) || !PyUnicode_IS_ASCII(node))
        return 0;
    const char *s = (const char *)PyUnicode_DATA(node);
    name_split sp;
    if (!parse_param_grad(s, PyUnicode_GET_LENGTH(node), &sp))
        return 0;
    PyObject *call = sp.c1 > sp.c0 ? digits_value(s + sp.c0, sp.c1 - sp.c0) : PyLong_FromLong(-1);
    PyObject *path = one_text(names, s, sp.m0, sp.m1);
    if (path == NULL) {
        Py_XDECREF(call);
        return -1;
    }
    int rc = append_parts(lists, s_param_grad_kind, one_text(names, s, sp.a0, sp.a1), path, s_backward, call);
    Py_DECREF(path);
    return rc < 0 ? -1 : 1;
}

/* The common spellings of NodeParts.add, split in line: 1 done, 0 not one of them, -1 error. */
static int
split_common(PyObject *node, PyObject *of, PyObject *names, PyObject *const *lists)
{
    if (!PyUnicode_IS_ASCII(node))
        return 0;
    const char *s = (const char *)PyUnicode_DATA(node);
    name_split sp;
    int kind = parse_common(s, PyUnicode_GET_LENGTH(node), &sp);
    if (kind == 0)
        return 0;
    PyObject *direction = sp.fwd ? s_forward : s_backward;
    PyObject *call = digits_value(s + sp.c0, sp.c1 - sp.c0);
    if (kind == 1)
        return append_parts(lists, s_kind_api, one_text(names, s, sp.a0, sp.a1), of, direction, call) < 0 ? -1 : 1;
    PyObject *path = one_text(names, s, sp.m0, sp.m1);
    if (path == NULL) {
        Py_XDECREF(call);
        return -1;
    }
    int rc = append_parts(lists, s_kind_module, one_text(names, s, sp.a0, sp.a1), path, direction, call);
    Py_DECREF(path);
    return rc < 0 ? -1 : 1;
}

/* _module_of(parent) for the common spellings (a new reference), NULL with no error set when it is not one */
static PyObject *
module_of_common(PyObject *parent)
{
    if (!PyUnicode_CheckExact(parent) || !PyUnicode_IS_ASCII(parent) || PyUnicode_GET_LENGTH(parent) == 0)
        return NULL;
    int r = PyUnicode_Contains(parent, s_param_grad);
    const char *s = (const char *)PyUnicode_DATA(parent);
    name_split sp;
    if (r != 0) {
        if (r < 0) {
            PyErr_Clear();
            return NULL;
        }
        if (parse_param_grad(s, PyUnicode_GET_LENGTH(parent), &sp))  /* a param_grad parent: its module path */
            return PyUnicode_FromStringAndSize(s + sp.m0, sp.m1 - sp.m0);
        return NULL;
    }
    int kind = parse_common(s, PyUnicode_GET_LENGTH(parent), &sp);
    if (kind == 1)
        return Py_NewRef(s_empty);  /* an API parent: no module path */
    if (kind == 2)
        return PyUnicode_FromStringAndSize(s + sp.m0, sp.m1 - sp.m0);
    return NULL;
}

PyObject *
craw_parts_add(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *nodes, *parents, *kinds, *apis, *modules, *dirs, *calls, *out, *of_parent, *names, *module_of,
        *name_parts;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!O!O!OO", &PyList_Type, &nodes, &PyList_Type, &parents,
                          &PyList_Type, &kinds, &PyList_Type, &apis, &PyList_Type, &modules, &PyList_Type, &dirs,
                          &PyList_Type, &calls, &PyList_Type, &out, &PyDict_Type, &of_parent, &PyDict_Type, &names,
                          &module_of, &name_parts))
        return NULL;
    if (s_kind_api == NULL && parts_strings() < 0)
        return NULL;
    if (PyList_GET_SIZE(nodes) != PyList_GET_SIZE(parents)) {
        PyErr_SetString(PyExc_ValueError, "nodes and parents differ in length");
        return NULL;
    }
    PyObject *lists[5] = {kinds, apis, modules, dirs, calls};
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(nodes); i++) {
        PyObject *node = PyList_GET_ITEM(nodes, i), *parent = PyList_GET_ITEM(parents, i);
        PyObject *hit = PyDict_GetItemWithError(of_parent, parent);
        if (hit == NULL) {
            if (PyErr_Occurred())
                return NULL;
            PyObject *module = module_of_common(parent);
            if (module == NULL && !PyErr_Occurred())
                module = PyObject_CallOneArg(module_of, parent);
            if (module == NULL)
                return NULL;
            hit = PyTuple_Pack(2, parent, module);
            Py_DECREF(module);
            if (hit == NULL || PyDict_SetItem(of_parent, parent, hit) < 0) {
                Py_XDECREF(hit);
                return NULL;
            }
            Py_DECREF(hit);  /* of_parent holds it */
        }
        if (!PyTuple_Check(hit) || PyTuple_GET_SIZE(hit) != 2) {
            PyErr_SetString(PyExc_TypeError, "of_parent: (parent, module) pairs");
            return NULL;
        }
        PyObject *of = PyTuple_GET_ITEM(hit, 1);
        if (PyList_Append(out, PyTuple_GET_ITEM(hit, 0)) < 0)
            return NULL;
        int r = PyUnicode_CheckExact(node) ? PyUnicode_Contains(node, s_param_grad) : 1;
        if (r < 0)
            return NULL;
        r = r ? split_param_grad(node, names, lists) : split_common(node, of, names, lists);
        if (r < 0)
            return NULL;
        if (r)
            continue;
        PyObject *got = PyObject_CallOneArg(name_parts, node);
        if (got == NULL)
            return NULL;
        if (!PyTuple_Check(got) || PyTuple_GET_SIZE(got) != 5) {
            Py_DECREF(got);
            PyErr_SetString(PyExc_TypeError, "name_parts: 5-tuples");
            return NULL;
        }
        PyObject *kind = PyTuple_GET_ITEM(got, 0), *api = PyTuple_GET_ITEM(got, 1);
        PyObject *module = PyTuple_GET_ITEM(got, 2);
        int is_api = PyObject_RichCompareBool(kind, s_kind_api, Py_EQ);
        PyObject *kept_api = is_api < 0 ? NULL : PyDict_SetDefault(names, api, api);
        PyObject *kept_module = (is_api < 0 || kept_api == NULL) ? NULL : is_api ? of :
                                PyDict_SetDefault(names, module, module);
        int rc = -1;
        if (kept_module != NULL)
            rc = append_parts(lists, kind, Py_NewRef(kept_api), kept_module, PyTuple_GET_ITEM(got, 3),
                              Py_NewRef(PyTuple_GET_ITEM(got, 4)));
        Py_DECREF(got);
        if (rc < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}
