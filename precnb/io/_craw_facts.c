/* precnb.io._craw.facts_batch / optimizer_args: the run facts of the records the reader hands over (part of _craw).
 *
 * FileFacts (precnb.io._runfacts) reads, of the records read_records / the reference walk give it, the parameters'
 * requires_grad, the scalar arguments of optimizer ops and the scalar-argument signatures. A large dump's optimizer
 * step is most of its records (a foreach/fused op per parameter group, each under the optimizer scope), and their
 * argument scan in Python cost about a tenth of a load; here:
 *
 * - optimizer_args(node, record, found, positions, plain, scalars_arg, scalars_kwarg, api_of, known):
 *   FileFacts.optimizer's scan of input_args / input_kwargs (the common {type, value} arguments read in line, any
 *   other value through the Python scan functions), returning the API name to merge, or None;
 * - facts_batch(todo, node_facts, api_facts, known, merge, positions, plain, scalars_arg, scalars_kwarg, api_of,
 *   markers, undefined): FileFacts.batch's loop over (flags, node, record, parent) entries in file order.
 *
 * PRECNB_PURE_PARSER=1 selects the Python code, the reference (tests/test_parse_paths.py checks both give identical
 * facts). Written for precnb (no third-party code): CPython C API only.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <string.h>

PyObject *craw_optimizer_args(PyObject *self, PyObject *args);
PyObject *craw_facts_batch(PyObject *self, PyObject *args);

static PyObject *s_type, *s_value, *s_shape, *s_parameters, *s_forward_end, *s_forward_mid, *s_optimizer;

static int
facts_strings(void)
{
#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1
    INTERN(s_value, "value");
    INTERN(s_shape, "shape");
    INTERN(s_parameters, "parameters");
    INTERN(s_forward_end, ".forward");
    INTERN(s_forward_mid, ".forward.");
    INTERN(s_optimizer, "optimizer");
    INTERN(s_type, "type");  /* last: set means all are */
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

static Py_ssize_t
rfind_dot(const char *s, Py_ssize_t end)
{
    for (Py_ssize_t i = end - 1; i >= 0; i--)
        if (s[i] == '.')
            return i;
    return -1;
}

static int
starts_with_any(PyObject *s, PyObject *prefixes)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(prefixes); i++) {
        Py_ssize_t r = PyUnicode_Tailmatch(s, PyTuple_GET_ITEM(prefixes, i), 0, PY_SSIZE_T_MAX, -1);
        if (r != 0)
            return (int)r;
    }
    return 0;
}

static int
ends_with(PyObject *s, PyObject *suffix)
{
    return (int)PyUnicode_Tailmatch(s, suffix, 0, PY_SSIZE_T_MAX, 1);
}

static int
contains(PyObject *s, PyObject *sub)
{
    return PyUnicode_Contains(s, sub);
}

static PyObject *s_input_args, *s_input_kwargs, *s_Max;

/* found.setdefault(path, []).append(v) (v a new reference, stolen) */
static int
found_add(PyObject *found, PyObject *path, PyObject *v)
{
    if (v == NULL)
        return -1;
    PyObject *have = PyDict_GetItemWithError(found, path);
    if (have == NULL) {
        if (PyErr_Occurred()) {
            Py_DECREF(v);
            return -1;
        }
        PyObject *fresh = PyList_New(0);
        if (fresh == NULL || PyDict_SetItem(found, path, fresh) < 0) {
            Py_XDECREF(fresh);
            Py_DECREF(v);
            return -1;
        }
        have = fresh;
        Py_DECREF(fresh);  /* found holds it */
    }
    int r = PyList_Append(have, v);
    Py_DECREF(v);
    return r;
}

/* A {type, value} argument's plain value appended under *path* (FileFacts.optimizer's in-line case). */
static int
plain_value(PyObject *found, PyObject *path, PyObject *kind, PyObject *v, PyObject *plain)
{
    PyObject *got;
    if ((PyFloat_CheckExact(v) && isfinite(PyFloat_AS_DOUBLE(v))) || PyLong_CheckExact(v))
        got = Py_NewRef(v);  /* a finite float or an int is its own plain value */
    else {
        got = PyObject_CallFunctionObjArgs(plain, kind, v, NULL);
        if (got == NULL)
            return -1;
    }
    if (got == Py_None) {
        Py_DECREF(got);
        return 0;
    }
    return found_add(found, path, got);
}

static int
call_scalars(PyObject *scalars, PyObject *x, PyObject *path, PyObject *found)
{
    PyObject *r = PyObject_CallFunctionObjArgs(scalars, x, path, found, NULL);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* api_of(node) for the common spellings ({api}.{call}.{direction}, {api}.{direction}), else the Python one */
static PyObject *
api_of(PyObject *node, PyObject *api_of_py)
{
    if (PyUnicode_CheckExact(node) && PyUnicode_IS_ASCII(node)) {
        const char *s = (const char *)PyUnicode_DATA(node);
        Py_ssize_t n = PyUnicode_GET_LENGTH(node), h = -1;
        if (memchr(s, '\n', (size_t)n) == NULL) {
            if (n >= 8 && memcmp(s + n - 8, ".forward", 8) == 0)
                h = n - 8;
            else if (n >= 9 && memcmp(s + n - 9, ".backward", 9) == 0)
                h = n - 9;
        }
        if (h >= 0) {  /* head = s[:h] */
            Py_ssize_t e = rfind_dot(s, h);
            if (e > 0 && all_digits(s + e + 1, h - e - 1))
                return PyUnicode_FromStringAndSize(s, e);  /* the shortest api wins */
            if (h > 0)
                return PyUnicode_FromStringAndSize(s, h);
        }
    }
    return PyObject_CallOneArg(api_of_py, node);
}

/* 1: every value of *found* is known already for *api* ((api, path, type, value) in *known*), 0 not, -1 error */
static int
all_known(PyObject *api, PyObject *found, PyObject *known)
{
    Py_ssize_t pos = 0;
    PyObject *path, *vals;
    while (PyDict_Next(found, &pos, &path, &vals)) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(vals); i++) {
            PyObject *v = PyList_GET_ITEM(vals, i);
            PyObject *key = PyTuple_Pack(4, api, path, (PyObject *)Py_TYPE(v), v);
            if (key == NULL)
                return -1;
            int r = PySet_Contains(known, key);
            Py_DECREF(key);
            if (r <= 0)
                return r;
        }
    }
    return 1;
}

static int scan_arguments(PyObject *record, PyObject *found, PyObject *positions, PyObject *plain,
                          PyObject *scalars_arg, PyObject *scalars_kwarg);

/* FileFacts.optimizer: the arguments scanned into *found*; None when there is nothing to merge (nothing found, or
 * every value known already), else the api to merge them under */
PyObject *
craw_optimizer_args(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *node, *record, *found, *positions, *plain, *scalars_arg, *scalars_kwarg, *api_of_py, *known;
    if (!PyArg_ParseTuple(args, "OO!O!O!OOOOO!", &node, &PyDict_Type, &record, &PyDict_Type, &found, &PyTuple_Type,
                          &positions, &plain, &scalars_arg, &scalars_kwarg, &api_of_py, &PySet_Type, &known))
        return NULL;
    if (scan_arguments(record, found, positions, plain, scalars_arg, scalars_kwarg) < 0)
        return NULL;
    if (PyDict_GET_SIZE(found) == 0)
        Py_RETURN_NONE;
    PyObject *api = api_of(node, api_of_py);
    if (api == NULL)
        return NULL;
    int r = all_known(api, found, known);
    if (r != 0) {
        Py_DECREF(api);
        if (r < 0)
            return NULL;
        Py_RETURN_NONE;
    }
    return api;
}

static int
scan_arguments(PyObject *record, PyObject *found, PyObject *positions, PyObject *plain, PyObject *scalars_arg,
               PyObject *scalars_kwarg)
{
    if (s_input_args == NULL && (!(s_input_args = PyUnicode_InternFromString("input_args")) ||
                                 !(s_input_kwargs = PyUnicode_InternFromString("input_kwargs")) ||
                                 !(s_Max = PyUnicode_InternFromString("Max"))))
        return -1;
    if (s_type == NULL && facts_strings() < 0)
        return -1;
    PyObject *a = PyDict_GetItemWithError(record, s_input_args);
    if (a == NULL && PyErr_Occurred())
        return -1;
    if (a != NULL && PyList_Check(a)) {
        Py_INCREF(a);  /* a callback may not change it, but hold it anyway */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(a); i++) {
            PyObject *x = PyList_GET_ITEM(a, i);
            int rc = 0;
            PyObject *path = i < PyTuple_GET_SIZE(positions) ? Py_NewRef(PyTuple_GET_ITEM(positions, i))
                                                             : PyUnicode_FromFormat("%zd", i);
            if (path == NULL) {
                Py_DECREF(a);
                return -1;
            }
            Py_INCREF(x);
            PyObject *kind = PyDict_Check(x) ? PyDict_GetItemWithError(x, s_type) : NULL;
            if (PyErr_Occurred())
                rc = -1;
            else if (kind != NULL && PyUnicode_CheckExact(kind)) {
                /* a scalar, or a tensor (nothing for a positional argument) */
                int has_value = PyDict_Contains(x, s_value), has_shape = PyDict_Contains(x, s_shape);
                if (has_value < 0 || has_shape < 0)
                    rc = -1;
                else if (has_value && !has_shape) {
                    PyObject *v = PyDict_GetItemWithError(x, s_value);
                    rc = v == NULL ? -1 : plain_value(found, path, kind, v, plain);
                }
            }
            else if (PyDict_Check(x) || PyList_Check(x))
                rc = call_scalars(scalars_arg, x, path, found);
            Py_DECREF(x);
            Py_DECREF(path);
            if (rc < 0) {
                Py_DECREF(a);
                return -1;
            }
        }
        Py_DECREF(a);
    }
    PyObject *kw = PyDict_GetItemWithError(record, s_input_kwargs);
    if (kw == NULL && PyErr_Occurred())
        return -1;
    if (kw != NULL && PyDict_Check(kw) && PyDict_GET_SIZE(kw)) {
        /* the keyword arguments through FileFacts' own _scalars (an object's items may be anything) */
        PyObject *items = PyDict_Items(kw);
        if (items == NULL)
            return -1;
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); i++) {
            PyObject *pair = PyList_GET_ITEM(items, i);
            PyObject *key = PyObject_Str(PyTuple_GET_ITEM(pair, 0));
            PyObject *x = PyTuple_GET_ITEM(pair, 1);
            int rc = key == NULL ? -1 : 0, done = 0;
            if (rc == 0 && PyDict_CheckExact(x)) {  /* the usual {type, value} keyword (lr=, value=) in line */
                PyObject *kind = PyDict_GetItemWithError(x, s_type);
                if (kind != NULL && PyUnicode_CheckExact(kind)) {
                    int has_shape = PyDict_Contains(x, s_shape);
                    PyObject *v = has_shape ? NULL : PyDict_GetItemWithError(x, s_value);
                    if (has_shape < 0 || PyErr_Occurred())
                        rc = -1;
                    else if (v != NULL) {
                        rc = plain_value(found, key, kind, v, plain);
                        done = 1;
                    }
                }
                else if (PyErr_Occurred())
                    rc = -1;
            }
            if (rc == 0 && !done && (PyDict_Check(x) || PyList_Check(x)))
                rc = call_scalars(scalars_kwarg, x, key, found);
            Py_XDECREF(key);
            if (rc < 0) {
                Py_DECREF(items);
                return -1;
            }
        }
        Py_DECREF(items);
    }
    return 0;
}

/* whether the text holds one of the markers (a tuple of str), 1 / 0 / -1 */
static int
holds_marker(PyObject *text, PyObject *markers)
{
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(markers); i++) {
        Py_ssize_t at = PyUnicode_Find(text, PyTuple_GET_ITEM(markers, i), 0, PY_SSIZE_T_MAX, 1);
        if (at != -1)
            return at == -2 ? -1 : 1;
    }
    return 0;
}

/* facts_batch(todo, node_facts, api_facts, known, merge, positions, plain, scalars_arg, scalars_kwarg, api_of,
 * markers, undefined): parse._File.batch's run-facts loop, in file order. A FileFacts.node entry whose only possible fact is an
 * optimizer op (no parameters, no undefined-prefix node) is read here: is_optimizer_node (a forward record under
 * the optimizer scope, or whose name and API name hold one of *markers*, _runfacts._OPTIMIZER_MARKERS), then the
 * scan of optimizer_args and merge(api, found) unless every value is known; every other entry calls
 * node_facts / api_facts. */
PyObject *
craw_facts_batch(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *todo, *node_facts, *api_facts, *known, *merge, *positions, *plain, *sa, *ska, *api_of_py, *markers,
        *g_undefined;
    if (!PyArg_ParseTuple(args, "O!OOO!OO!OOOOO!O!", &PyList_Type, &todo, &node_facts, &api_facts, &PySet_Type,
                          &known, &merge, &PyTuple_Type, &positions, &plain, &sa, &ska, &api_of_py, &PyTuple_Type,
                          &markers, &PyTuple_Type, &g_undefined))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(markers); i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(markers, i))) {
            PyErr_SetString(PyExc_TypeError, "markers: a tuple of str");
            return NULL;
        }
    if (s_type == NULL && facts_strings() < 0)
        return NULL;
    static PyObject *s_opt_dot = NULL;
    if (s_opt_dot == NULL && !(s_opt_dot = PyUnicode_InternFromString("optimizer.")))
        return NULL;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(todo); i++) {
        PyObject *entry = PyList_GET_ITEM(todo, i);
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 4) {
            PyErr_SetString(PyExc_TypeError, "todo: (flags, node, record, parent)");
            return NULL;
        }
        long flags = PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
        if (flags == -1 && PyErr_Occurred())
            return NULL;
        PyObject *node = PyTuple_GET_ITEM(entry, 1), *record = PyTuple_GET_ITEM(entry, 2);
        PyObject *parent = PyTuple_GET_ITEM(entry, 3);
        if (flags & 1) {
            int simple = PyUnicode_CheckExact(node) && PyUnicode_CheckExact(parent) && PyDict_CheckExact(record);
            int r = 0;
            if (simple) {
                r = PyDict_Contains(record, s_parameters);
                if (r == 0)
                    r = starts_with_any(node, g_undefined);
                if (r < 0)
                    return NULL;
                simple = !r;
            }
            if (simple) {
                int fwd = ends_with(node, s_forward_end);
                if (fwd == 0)
                    fwd = contains(node, s_forward_mid);
                if (fwd < 0)
                    return NULL;
                PyObject *api = NULL;
                if (fwd) {  /* is_optimizer_node: under the optimizer scope ("optimizer" or "optimizer.*") */
                    int opt = PyUnicode_Compare(parent, s_optimizer) == 0;
                    if (!opt && PyErr_Occurred())
                        return NULL;
                    if (!opt)
                        opt = (int)PyUnicode_Tailmatch(parent, s_opt_dot, 0, PY_SSIZE_T_MAX, -1);
                    if (opt == 0) {  /* or a marker in the node name, and in its API name */
                        opt = holds_marker(node, markers);
                        if (opt == 1) {
                            api = api_of(node, api_of_py);
                            opt = api == NULL ? -1 : holds_marker(api, markers);
                        }
                    }
                    if (opt < 0) {
                        Py_XDECREF(api);
                        return NULL;
                    }
                    fwd = opt;
                    if (!fwd)
                        Py_CLEAR(api);
                }
                if (fwd) {
                    PyObject *found = PyDict_New();
                    if (found == NULL) {
                        Py_XDECREF(api);
                        return NULL;
                    }
                    int rc = scan_arguments(record, found, positions, plain, sa, ska);
                    if (rc == 0 && PyDict_GET_SIZE(found)) {
                        if (api == NULL)
                            api = api_of(node, api_of_py);
                        rc = api == NULL ? -1 : all_known(api, found, known);
                        if (rc == 0) {
                            PyObject *got = PyObject_CallFunctionObjArgs(merge, api, found, NULL);
                            rc = got == NULL ? -1 : 0;
                            Py_XDECREF(got);
                        }
                    }
                    Py_XDECREF(api);
                    Py_DECREF(found);
                    if (rc < 0)
                        return NULL;
                }
            }
            else {
                PyObject *got = PyObject_CallFunctionObjArgs(node_facts, node, record, parent, NULL);
                if (got == NULL)
                    return NULL;
                Py_DECREF(got);
            }
        }
        if (flags & 2) {
            PyObject *got = PyObject_CallFunctionObjArgs(api_facts, node, record, NULL);
            if (got == NULL)
                return NULL;
            Py_DECREF(got);
        }
    }
    Py_RETURN_NONE;
}
