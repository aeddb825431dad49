/* precnb.io._cwalk: the per-record work of the msprobe dump.json parser, in C, for the records it fully understands.
 *
 * An optional extension (setup.py builds it with optional=True: an install without a compiler has the pure
 * Python parser, which gives the same records). The Python code stays the reference and the fallback;
 * PRECNB_PURE_PARSER=1 selects it, and tests/test_cwalk.py checks that both give identical FileRecords. Four
 * functions, each replacing one hot loop of precnb.io.msprobe and handing anything unusual back to Python:
 *
 * - walk_batch(): precnb.io.msprobe.parse._File.batch's loop and Walk.node. It reads the records of one batch
 *   dict in file order and, for every record it fully understands (an object whose keys are known sections
 *   holding lists or objects of tensor leaves, scalar arguments, lists of those, nulls, numbers or strings;
 *   a parameters_grad record of leaves), appends exactly what the Python walk appends: the leaf objects,
 *   their labels and roles, the node, its parent and its tensor count, and (flags, node, record, parent)
 *   for the run facts the Python code reads afterwards. At the first record it does not fully understand
 *   (not an object, deeper nesting, a tensor-like object that is not a leaf, an unknown section, a
 *   collective, a record the release probe still needs) it hands that record back, having appended nothing
 *   for it (a record is checked before anything is appended); the Python code reads it with the reference
 *   walk and calls walk_batch again from the position returned.
 * - parts_add(): NodeParts.add, the common node-name spellings split in line (the others by name_parts).
 * - leaf_columns(): Columns.add_batch's statistics (numbers, booleans, nulls and the quoted bare NaN /
 *   Infinity / -Infinity tokens, as numpy converts them: anything else sends the batch to the exact rules)
 *   and the shapes seen before.
 * - optimizer_args(): FileFacts.optimizer's scan of {type, value} arguments (the others through _scalars);
 *   facts_batch(): the batch's run facts in file order, the optimizer-scope records read here.
 * - quote_tokens(): precnb.io.msprobe._json.quote_tokens in one pass over the bytes (orjson's input).
 *
 * Size (issue #27 item 5's limits are for the Python modules; the reason is written here): one translation unit,
 * ~1,500 lines, because a CPython extension module is one file with one method table and its static state
 * (the g_* rules below) shared by every function. Four functions are over 80 lines (walk_section, walk_batch,
 * facts_batch, leaf_columns): each is one hot loop of the Python code it mirrors, kept whole so that it reads
 * side by side with that code (its error paths, Py_DECREFs included, make up most of the length).
 *
 * Written for precnb (no third-party code): CPython C API only.
 */
#define _GNU_SOURCE  /* memmem */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

/* configured once from Python (precnb.io.msprobe.walk / parse): the single source of the rules */
static PyObject *g_non_tensor = NULL;  /* frozenset of non-tensor leaf types */
static PyObject *g_order = NULL;       /* tuple of (key, section, role) in reading order */
static PyObject *g_index = NULL;       /* tuple of ".0", ".1", ... */
static PyObject *g_undefined = NULL;   /* tuple: node prefixes whose records go to the run facts */
static PyObject *g_comm = NULL;        /* tuple: collective prefixes (group_ranks read in Python) */
static PyObject *g_no_sig = NULL;      /* tuple: API prefixes whose facts are read without signatures */
static PyObject *g_module_cell = NULL; /* ("Module.", "Cell.") */
static PyObject *g_node_kind = NULL;   /* precnb.io.msprobe.nodes.node_kind */
static PyObject *s_type, *s_dtype, *s_shape, *s_value, *s_parameters, *s_dot, *s_forward_end,
    *s_backward_end, *s_backward_mid, *s_forward_mid, *s_param_grad, *s_optimizer, *s_fused, *s_addcdiv,
    *s_lerp, *s_empty, *s_grad, *s_param_grad_kind, *s_kind_api, *s_kind_module, *s_forward, *s_backward;

#define MAX_SECTIONS 16

static int
configure_strings(void)
{
#define INTERN(var, text) if (!(var = PyUnicode_InternFromString(text))) return -1
    INTERN(s_type, "type");
    INTERN(s_dtype, "dtype");
    INTERN(s_shape, "shape");
    INTERN(s_value, "value");
    INTERN(s_parameters, "parameters");
    INTERN(s_dot, ".");
    INTERN(s_forward_end, ".forward");
    INTERN(s_backward_end, ".backward");
    INTERN(s_backward_mid, ".backward.");
    INTERN(s_forward_mid, ".forward.");
    INTERN(s_param_grad, "parameters_grad");
    INTERN(s_optimizer, "optimizer");
    INTERN(s_fused, "_fused_");
    INTERN(s_addcdiv, "addcdiv_");
    INTERN(s_lerp, "_foreach_lerp_");
    INTERN(s_empty, "");
    INTERN(s_grad, "grad");
    INTERN(s_param_grad_kind, "param_grad");
    INTERN(s_kind_api, "api");
    INTERN(s_kind_module, "module");
    INTERN(s_forward, "forward");
    INTERN(s_backward, "backward");
#undef INTERN
    return 0;
}

static PyObject *
configure(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *non_tensor, *order, *index, *undefined, *comm, *no_sig, *module_cell, *node_kind;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O", &PyFrozenSet_Type, &non_tensor, &PyTuple_Type, &order,
                          &PyTuple_Type, &index, &PyTuple_Type, &undefined, &PyTuple_Type, &comm, &PyTuple_Type,
                          &no_sig, &PyTuple_Type, &module_cell, &node_kind))
        return NULL;
    if (!PyCallable_Check(node_kind)) {
        PyErr_SetString(PyExc_TypeError, "node_kind: a callable");
        return NULL;
    }
    if (PyTuple_GET_SIZE(order) > MAX_SECTIONS) {
        PyErr_SetString(PyExc_ValueError, "too many sections");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(order); i++) {
        PyObject *o = PyTuple_GET_ITEM(order, i);
        if (!PyTuple_Check(o) || PyTuple_GET_SIZE(o) != 3 || !PyUnicode_CheckExact(PyTuple_GET_ITEM(o, 0)) ||
            !PyUnicode_CheckExact(PyTuple_GET_ITEM(o, 1)) || !PyUnicode_CheckExact(PyTuple_GET_ITEM(o, 2))) {
            PyErr_SetString(PyExc_TypeError, "order: (key, section, role) strings");
            return NULL;
        }
    }
    if (!s_type && configure_strings() < 0)
        return NULL;
    Py_XSETREF(g_non_tensor, Py_NewRef(non_tensor));
    Py_XSETREF(g_order, Py_NewRef(order));
    Py_XSETREF(g_index, Py_NewRef(index));
    Py_XSETREF(g_undefined, Py_NewRef(undefined));
    Py_XSETREF(g_comm, Py_NewRef(comm));
    Py_XSETREF(g_no_sig, Py_NewRef(no_sig));
    Py_XSETREF(g_module_cell, Py_NewRef(module_cell));
    Py_XSETREF(g_node_kind, Py_NewRef(node_kind));
    Py_RETURN_NONE;
}

/* 1: a tensor leaf; 2: a scalar argument (nothing below it); 0: anything else (the reference walk decides);
 * -1: error. x is an exact dict. */
static int
item_kind(PyObject *x)
{
    PyObject *t = PyDict_GetItemWithError(x, s_type);
    if (t == NULL && PyErr_Occurred())
        return -1;
    if (t != NULL && PyUnicode_CheckExact(t)) {
        int has = PyDict_Contains(x, s_dtype);
        if (has < 0)
            return -1;
        if (has) {
            has = PyDict_Contains(x, s_shape);
            if (has < 0)
                return -1;
            if (has) {
                int non = PySet_Contains(g_non_tensor, t);
                if (non < 0)
                    return -1;
                if (!non)
                    return 1;
            }
        }
    }
    if (PyDict_GET_SIZE(x) == 2) {
        PyObject *v = PyDict_GetItemWithError(x, s_value);
        if (v == NULL) {
            return PyErr_Occurred() ? -1 : 0;
        }
        if (!PyDict_CheckExact(v) && !PyList_CheckExact(v) &&
            !(t != NULL && (PyDict_CheckExact(t) || PyList_CheckExact(t))))
            return 2;
    }
    return 0;
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

static int
append_new(PyObject *list, PyObject *item)
{
    if (item == NULL)
        return -1;
    int r = PyList_Append(list, item);
    Py_DECREF(item);
    return r;
}

static PyObject *
index_label(PyObject *prefix, Py_ssize_t k)
{
    if (k < PyTuple_GET_SIZE(g_index))
        return PyUnicode_Concat(prefix, PyTuple_GET_ITEM(g_index, k));
    return PyUnicode_FromFormat("%U.%zd", prefix, k);
}

static int
emit_leaf(PyObject *x, PyObject *label, PyObject *role, PyObject *leaves, PyObject *labels, PyObject *roles)
{
    if (label == NULL)
        return -1;
    if (PyList_Append(leaves, x) < 0 || PyList_Append(labels, label) < 0 || PyList_Append(roles, role) < 0) {
        Py_DECREF(label);
        return -1;
    }
    Py_DECREF(label);
    return 0;
}

/* The leaves of one section item named by *prefix* + its index or key (made on the first leaf only): the item is
 * a leaf, a scalar argument, a list of those, or a null/number/string. 1 plain (its leaves appended), 0 not plain,
 * -1 error. *name_of(k)* is built by the caller's callback style below: list items pass k >= 0, object members
 * their key. */
typedef struct {
    PyObject *leaves, *labels, *roles, *role;
    Py_ssize_t n;  /* leaves appended */
} sink;

static int
sink_leaf(sink *out, PyObject *x, PyObject *label)
{
    if (label == NULL)
        return -1;
    int rc = PyList_Append(out->leaves, x) < 0 || PyList_Append(out->labels, label) < 0 ||
             PyList_Append(out->roles, out->role) < 0 ? -1 : 0;
    Py_DECREF(label);
    out->n++;
    return rc;
}

/* *name* (a borrowed label) holds the item x: emit what x holds (depth 1 or, for depth == 1 lists, 2) */
static int
walk_item(sink *out, PyObject *x, PyObject *name, int depth)
{
    if (PyDict_CheckExact(x)) {
        int kind = item_kind(x);
        if (kind == 1)
            return sink_leaf(out, x, Py_NewRef(name)) < 0 ? -1 : 1;
        return kind < 0 ? -1 : kind == 2;
    }
    if (PyList_CheckExact(x)) {
        if (depth > 1)
            return 0;  /* deeper still: the reference walk */
        Py_ssize_t len = PyList_GET_SIZE(x);
        for (Py_ssize_t j = 0; j < len; j++) {
            PyObject *y = PyList_GET_ITEM(x, j);
            if (PyDict_CheckExact(y)) {
                int kind = item_kind(y);
                if (kind == 1) {
                    if (sink_leaf(out, y, index_label(name, j)) < 0)
                        return -1;
                }
                else if (kind <= 0)
                    return kind;
            }
            else if (PyList_CheckExact(y))
                return 0;
        }
        return 1;
    }
    return 1;  /* null, a number, a string, a boolean: nothing below it */
}

/* Whether an item needs a name (it may hold a leaf): dicts and lists */
static int
may_hold(PyObject *x)
{
    return PyDict_CheckExact(x) || PyList_CheckExact(x);
}

/* One section value, its leaves appended as the reference walk names them: 1 plain, 0 not plain, -1 error. */
static int
walk_section(sink *out, PyObject *node, PyObject *v, PyObject *section)
{
    if (v == Py_None)
        return 1;
    int rc = 1;
    if (PyList_CheckExact(v)) {
        Py_ssize_t len = PyList_GET_SIZE(v);
        PyObject *prefix = NULL;
        for (Py_ssize_t k = 0; k < len && rc == 1; k++) {
            PyObject *x = PyList_GET_ITEM(v, k);
            if (!may_hold(x))
                continue;
            if (PyDict_CheckExact(x)) {  /* the usual item: a leaf or a scalar, named only when a leaf */
                int kind = item_kind(x);
                if (kind == 2)
                    continue;
                if (kind <= 0) {
                    rc = kind;
                    break;
                }
            }
            if (prefix == NULL && (prefix = PyUnicode_Concat(node, section)) == NULL) {
                rc = -1;
                break;
            }
            PyObject *name = index_label(prefix, k);
            rc = name == NULL ? -1 : walk_item(out, x, name, 1);
            Py_XDECREF(name);
        }
        Py_XDECREF(prefix);
        return rc;
    }
    if (!PyDict_CheckExact(v))
        return 0;  /* a number or string section: unread, for the reference walk */
    if (PyDict_GET_SIZE(v) == 0)
        return 1;
    PyObject *t = PyDict_GetItemWithError(v, s_type);
    if (t == NULL && PyErr_Occurred())
        return -1;
    if (t != NULL && PyUnicode_CheckExact(t)) {
        int kind = item_kind(v);
        if (kind < 0)
            return -1;
        if (kind == 1)  /* the section is itself a tensor */
            return sink_leaf(out, v, PyUnicode_Concat(node, section)) < 0 ? -1 : 1;
    }
    if (t != NULL && t != Py_None)
        return 0;  /* a typed object that is not a leaf: the reference walk decides */
    int has = PyDict_Contains(v, s_shape);
    if (has != 0)
        return has < 0 ? -1 : 0;
    PyObject *dot = NULL, *key, *x;
    Py_ssize_t pos = 0;
    while (rc == 1 && PyDict_Next(v, &pos, &key, &x)) {
        if (!PyUnicode_CheckExact(key)) {
            rc = 0;
            break;
        }
        if (!may_hold(x))
            continue;
        if (PyDict_CheckExact(x)) {
            int kind = item_kind(x);
            if (kind == 2)
                continue;
            if (kind <= 0) {
                rc = kind;
                break;
            }
        }
        if (dot == NULL) {
            PyObject *prefix = PyUnicode_Concat(node, section);
            dot = prefix == NULL ? NULL : PyUnicode_Concat(prefix, s_dot);
            Py_XDECREF(prefix);
            if (dot == NULL) {
                rc = -1;
                break;
            }
        }
        PyObject *name = PyUnicode_Concat(dot, key);
        rc = name == NULL ? -1 : walk_item(out, x, name, 1);
        Py_XDECREF(name);
    }
    Py_XDECREF(dot);
    return rc;
}

/* One record's known sections in reading order, their leaves appended: 1 plain, 0 not plain (the caller takes
 * back what was appended), -1 error. */
static int
walk_record(sink *out, PyObject *node, PyObject *record)
{
    Py_ssize_t n_keys = PyDict_GET_SIZE(record), found = 0, n_order = PyTuple_GET_SIZE(g_order);
    for (Py_ssize_t i = 0; i < n_order && found < n_keys; i++) {
        PyObject *o = PyTuple_GET_ITEM(g_order, i);
        PyObject *v = PyDict_GetItemWithError(record, PyTuple_GET_ITEM(o, 0));
        if (v == NULL) {
            if (PyErr_Occurred())
                return -1;
            continue;
        }
        found++;
        out->role = PyTuple_GET_ITEM(o, 2);
        int r = walk_section(out, node, v, PyTuple_GET_ITEM(o, 1));
        if (r <= 0)
            return r;
    }
    if (found != n_keys) {
        if (found == 0)
            return 0;  /* maybe the record is itself a tensor (debug.json): the reference walk */
        Py_ssize_t pos = 0;
        PyObject *key, *v;
        while (PyDict_Next(record, &pos, &key, &v)) {
            if ((PyDict_CheckExact(v) && PyDict_GET_SIZE(v)) || (PyList_CheckExact(v) && PyList_GET_SIZE(v))) {
                /* a known section was read above; any other key holding a container is a section of its own */
                int known = 0;
                for (Py_ssize_t i = 0; i < n_order && !known; i++) {
                    known = PyObject_RichCompareBool(key, PyTuple_GET_ITEM(PyTuple_GET_ITEM(g_order, i), 0), Py_EQ);
                    if (known < 0)
                        return -1;
                }
                if (!known)
                    return 0;
            }
        }
    }
    return 1;
}

static int
take_back(PyObject *list, Py_ssize_t n0)
{
    return PyList_GET_SIZE(list) > n0 ? PyList_SetSlice(list, n0, PyList_GET_SIZE(list), NULL) : 0;
}

/* A parameters_grad record ({param: [leaf]} or {param: leaf}): 1 plain (leaves emitted), 0 not, -1 error. */
static int
param_grad_record(PyObject *node, PyObject *record, PyObject *leaves, PyObject *labels, PyObject *roles,
                  Py_ssize_t *n)
{
    Py_ssize_t pos = 0;
    PyObject *key, *val;
    while (PyDict_Next(record, &pos, &key, &val)) {  /* check first: nothing is emitted for a record handed back */
        PyObject *leaf = (PyList_CheckExact(val) && PyList_GET_SIZE(val) == 1) ? PyList_GET_ITEM(val, 0) : val;
        if (!PyUnicode_CheckExact(key))
            return 0;
        if (leaf == Py_None)
            continue;
        if (!PyDict_CheckExact(leaf))
            return 0;
        int kind = item_kind(leaf);
        if (kind != 1)
            return kind < 0 ? -1 : 0;
        (*n)++;
    }
    if (*n == 0)
        return 1;
    PyObject *dot = PyUnicode_Concat(node, s_dot);
    if (dot == NULL)
        return -1;
    pos = 0;
    while (PyDict_Next(record, &pos, &key, &val)) {
        PyObject *leaf = (PyList_CheckExact(val) && PyList_GET_SIZE(val) == 1) ? PyList_GET_ITEM(val, 0) : val;
        if (leaf != Py_None && emit_leaf(leaf, PyUnicode_Concat(dot, key), s_grad, leaves, labels, roles) < 0) {
            Py_DECREF(dot);
            return -1;
        }
    }
    Py_DECREF(dot);
    return 1;
}

/* flags for the Python run facts: 1 FileFacts.node, 2 FileFacts.api */
static int
fact_flags(PyObject *node, PyObject *record, PyObject *parent, int sigs)
{
    int flags = 0, r;
    r = PyDict_Contains(record, s_parameters);
    if (r < 0)
        return -1;
    if (!r) {
        r = PyUnicode_Check(parent) ? (int)PyUnicode_Tailmatch(parent, s_optimizer, 0, PY_SSIZE_T_MAX, -1) : 0;
        if (!r && (r = contains(node, s_fused)) == 0 && (r = contains(node, s_addcdiv)) == 0 &&
            (r = contains(node, s_lerp)) == 0)
            r = starts_with_any(node, g_undefined);
        if (r < 0)
            return -1;
    }
    if (r)
        flags |= 1;
    r = ends_with(node, s_forward_end);
    if (r < 0)
        return -1;
    if (r) {
        r = sigs ? starts_with_any(node, g_module_cell) : starts_with_any(node, g_no_sig);
        if (r < 0)
            return -1;
        if (sigs ? !r : r)
            flags |= 2;
    }
    return flags;
}

static PyObject *
walk_batch(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *data, *names, *parents, *leaves, *labels, *roles, *nodes, *node_parents, *counts, *todo;
    Py_ssize_t pos;
    int sigs, need_backward, need_forward;
    if (!PyArg_ParseTuple(args, "O!nO!O!O!O!O!O!O!O!O!ppp", &PyDict_Type, &data, &pos, &PyDict_Type, &names,
                          &PyDict_Type, &parents, &PyList_Type, &leaves, &PyList_Type, &labels, &PyList_Type,
                          &roles, &PyList_Type, &nodes, &PyList_Type, &node_parents, &PyList_Type, &counts,
                          &PyList_Type, &todo, &sigs, &need_backward, &need_forward))
        return NULL;
    if (g_order == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_cwalk.configure() was not called");
        return NULL;
    }
    PyObject *key, *record;
    while (PyDict_Next(data, &pos, &key, &record)) {
        PyObject *node = PyDict_GetItemWithError(names, key);
        if (node == NULL) {
            if (PyErr_Occurred())
                return NULL;
            node = key;
        }
        PyObject *parent = PyDict_GetItemWithError(parents, key);
        if (parent == NULL) {
            if (PyErr_Occurred())
                return NULL;
            parent = s_empty;
        }
        int hand_back = !PyDict_CheckExact(record) || !PyUnicode_CheckExact(node);
        if (!hand_back && (need_backward || need_forward)) {
            /* the release probe (_File.look) reads these records */
            int r = 0;
            if (need_backward && ((r = ends_with(node, s_backward_end)) != 0 ||
                                  (r = contains(node, s_backward_mid)) != 0))
                hand_back = r;
            else if (need_forward && ((r = ends_with(node, s_forward_end)) != 0 ||
                                      (r = contains(node, s_forward_mid)) != 0))
                hand_back = r;
            if (r < 0)
                return NULL;
        }
        if (!hand_back) {
            int r = starts_with_any(node, g_comm);
            if (r < 0)
                return NULL;
            hand_back = r;
        }
        Py_ssize_t n_leaves = 0;
        if (!hand_back) {
            int r = contains(node, s_param_grad);
            if (r > 0) {  /* Walk.node's test: the text, then node_kind */
                PyObject *kind = PyObject_CallOneArg(g_node_kind, node);
                if (kind == NULL)
                    return NULL;
                r = PyObject_RichCompareBool(kind, s_param_grad_kind, Py_EQ);
                Py_DECREF(kind);
            }
            if (r < 0)
                return NULL;
            if (r)
                r = param_grad_record(node, record, leaves, labels, roles, &n_leaves);
            else {
                sink out = {leaves, labels, roles, NULL, 0};
                Py_ssize_t n0 = PyList_GET_SIZE(leaves);
                r = walk_record(&out, node, record);
                n_leaves = out.n;
                if (r == 0 && (take_back(leaves, n0) < 0 || take_back(labels, n0) < 0 || take_back(roles, n0) < 0))
                    return NULL;
            }
            if (r < 0)
                return NULL;
            hand_back = !r;
        }
        if (hand_back)
            return Py_BuildValue("nOOO", pos, node, record, parent);
        if (n_leaves && (PyList_Append(nodes, node) < 0 || PyList_Append(node_parents, parent) < 0 ||
                         append_new(counts, PyLong_FromSsize_t(n_leaves)) < 0))
            return NULL;
        int flags = fact_flags(node, record, parent, sigs);
        if (flags < 0)
            return NULL;
        if (flags && append_new(todo, Py_BuildValue("iOOO", flags, node, record, parent)) < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------------------------------------- node names */

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

static PyObject *
parts_add(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *nodes, *parents, *kinds, *apis, *modules, *dirs, *calls, *out, *of_parent, *names, *module_of,
        *name_parts;
    if (!PyArg_ParseTuple(args, "O!O!O!O!O!O!O!O!O!O!OO", &PyList_Type, &nodes, &PyList_Type, &parents,
                          &PyList_Type, &kinds, &PyList_Type, &apis, &PyList_Type, &modules, &PyList_Type, &dirs,
                          &PyList_Type, &calls, &PyList_Type, &out, &PyDict_Type, &of_parent, &PyDict_Type, &names,
                          &module_of, &name_parts))
        return NULL;
    if (s_kind_api == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_cwalk.configure() was not called");
        return NULL;
    }
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

/* ---------------------------------------------------------------------------------------------- run facts */

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
static PyObject *
optimizer_args(PyObject *Py_UNUSED(self), PyObject *args)
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
    if (s_type == NULL && configure_strings() < 0)
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
 * markers): parse._File.batch's run-facts loop, in file order. A FileFacts.node entry whose only possible fact is an
 * optimizer op (no parameters, no undefined-prefix node) is read here: is_optimizer_node (a forward record under
 * the optimizer scope, or whose name and API name hold one of *markers*, _runfacts._OPTIMIZER_MARKERS), then the
 * scan of optimizer_args and merge(api, found) unless every value is known; every other entry calls
 * node_facts / api_facts. */
static PyObject *
facts_batch(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *todo, *node_facts, *api_facts, *known, *merge, *positions, *plain, *sa, *ska, *api_of_py, *markers;
    if (!PyArg_ParseTuple(args, "O!OOO!OO!OOOOO!", &PyList_Type, &todo, &node_facts, &api_facts, &PySet_Type, &known,
                          &merge, &PyTuple_Type, &positions, &plain, &sa, &ska, &api_of_py, &PyTuple_Type, &markers))
        return NULL;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(markers); i++)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(markers, i))) {
            PyErr_SetString(PyExc_TypeError, "markers: a tuple of str");
            return NULL;
        }
    if (g_undefined == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "_cwalk.configure() was not called");
        return NULL;
    }
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

/* ---------------------------------------------------------------------------------------------- value columns */

static PyObject *s_stat_keys[4], *s_nan_text, *s_inf_text, *s_minus_inf_text, *s_md5, *s_data_name;

/* one statistic as Columns._stat_column's numpy conversion reads it: 1 done, 0 not one this reads, -1 error */
static int
stat_double(PyObject *v, double *out, unsigned char *null, unsigned char bit)
{
    static const uint64_t nan_bits = 0x7ff8000000000000ULL;  /* numpy's NaN for None (and float("nan")) */
    if (v == NULL || v == Py_None) {
        memcpy(out, &nan_bits, sizeof nan_bits);
        *null |= bit;
        return 1;
    }
    if (PyFloat_CheckExact(v)) {
        *out = PyFloat_AS_DOUBLE(v);
        return 1;
    }
    if (PyBool_Check(v)) {
        *out = v == Py_True ? 1.0 : 0.0;
        return 1;
    }
    if (PyLong_CheckExact(v)) {
        double d = PyLong_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            return 0;  /* beyond the float range: the exact rules (±inf) */
        }
        *out = d;
        return 1;
    }
    if (PyUnicode_CheckExact(v)) {  /* the quoted bare tokens (precnb.io.msprobe._json.quote_tokens) */
        int r;
        if ((r = PyUnicode_Compare(v, s_nan_text)) == 0) {
            memcpy(out, &nan_bits, sizeof nan_bits);
            return 1;
        }
        if (r == -1 && PyErr_Occurred())
            return -1;
        if ((r = PyUnicode_Compare(v, s_inf_text)) == 0) {
            *out = INFINITY;
            return 1;
        }
        if (r == -1 && PyErr_Occurred())
            return -1;
        if ((r = PyUnicode_Compare(v, s_minus_inf_text)) == 0) {
            *out = -INFINITY;
            return 1;
        }
        if (r == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

/* leaf_columns(leaves, shapes) -> None (a statistic the exact rules must read: the whole batch goes to
 * Columns.add_batch's Python path), or (stats, null, shape column, dtype column, shape texts, numel): stats a
 * bytearray of 4 x n float64 (Max, Min, Mean, Norm), null a bytearray of n null bits, the shape and dtype values
 * as the leaves hold them (None when absent), and when every shape is a list of ints found in *shapes* (the
 * per-process table of valid shapes: tuple -> (text, numel)) their texts and a bytearray of n int64 numel, else
 * None, None; then the dtypes through intern.setdefault when every one is a string (else None), and whether a
 * leaf has an md5 or a data_name that is not null. */
static PyObject *
leaf_columns(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *leaves, *shapes, *intern;
    if (!PyArg_ParseTuple(args, "O!O!O!", &PyList_Type, &leaves, &PyDict_Type, &shapes, &PyDict_Type, &intern))
        return NULL;
    if (s_type == NULL && configure_strings() < 0)
        return NULL;
    if (s_nan_text == NULL) {
        const char *keys[4] = {"Max", "Min", "Mean", "Norm"};
        for (int k = 0; k < 4; k++)
            if (!(s_stat_keys[k] = PyUnicode_InternFromString(keys[k])))
                return NULL;
        if (!(s_md5 = PyUnicode_InternFromString("md5")) || !(s_data_name = PyUnicode_InternFromString("data_name")) ||
            !(s_nan_text = PyUnicode_InternFromString("NaN")) ||
            !(s_inf_text = PyUnicode_InternFromString("Infinity")) ||
            !(s_minus_inf_text = PyUnicode_InternFromString("-Infinity")))
            return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(leaves);
    PyObject *stats = PyByteArray_FromStringAndSize(NULL, 4 * n * (Py_ssize_t)sizeof(double));
    PyObject *null = PyByteArray_FromStringAndSize(NULL, n);
    PyObject *shape_col = PyList_New(n), *dtype_col = PyList_New(n), *texts = PyList_New(n);
    PyObject *numel = PyByteArray_FromStringAndSize(NULL, n * (Py_ssize_t)sizeof(long long));
    PyObject *result = NULL;
    if (!stats || !null || !shape_col || !dtype_col || !texts || !numel)
        goto done;
    double *st = (double *)PyByteArray_AS_STRING(stats);
    unsigned char *nl = (unsigned char *)PyByteArray_AS_STRING(null);
    long long *ne = (long long *)PyByteArray_AS_STRING(numel);
    int all_shapes = 1, all_dtypes = 1, extra = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *leaf = PyList_GET_ITEM(leaves, i);
        if (!PyDict_CheckExact(leaf)) {
            PyErr_SetString(PyExc_TypeError, "leaves: dicts");
            goto done;
        }
        nl[i] = 0;
        for (int k = 0; k < 4; k++) {
            PyObject *v = PyDict_GetItemWithError(leaf, s_stat_keys[k]);
            if (v == NULL && PyErr_Occurred())
                goto done;
            int r = stat_double(v, st + k * n + i, nl + i, (unsigned char)(1 << k));
            if (r < 0)
                goto done;
            if (r == 0) {
                result = Py_NewRef(Py_None);
                goto done;
            }
        }
        PyObject *shape = PyDict_GetItemWithError(leaf, s_shape);
        PyObject *dtype = PyDict_GetItemWithError(leaf, s_dtype);
        if ((shape == NULL || dtype == NULL) && PyErr_Occurred())
            goto done;
        shape = shape ? shape : Py_None;
        dtype = dtype ? dtype : Py_None;
        PyList_SET_ITEM(shape_col, i, Py_NewRef(shape));
        PyList_SET_ITEM(dtype_col, i, Py_NewRef(dtype));
        all_dtypes = all_dtypes && PyUnicode_CheckExact(dtype);
        if (!extra) {  /* an md5 or a data_name that is not null: Columns._strings reads them */
            PyObject *m = PyDict_GetItemWithError(leaf, s_md5);
            PyObject *d = (m == NULL || m == Py_None) && !PyErr_Occurred() ? PyDict_GetItemWithError(leaf, s_data_name)
                                                                            : NULL;
            if (PyErr_Occurred())
                goto done;
            extra = (m != NULL && m != Py_None) || (d != NULL && d != Py_None);
        }
        if (!all_shapes)
            continue;
        if (!PyList_CheckExact(shape)) {
            all_shapes = 0;
            continue;
        }
        Py_ssize_t nd = PyList_GET_SIZE(shape);
        PyObject *key = PyTuple_New(nd);
        if (key == NULL)
            goto done;
        for (Py_ssize_t d = 0; d < nd; d++) {
            PyObject *x = PyList_GET_ITEM(shape, d);
            if (!PyLong_CheckExact(x)) {
                all_shapes = 0;
                break;
            }
            PyTuple_SET_ITEM(key, d, Py_NewRef(x));
        }
        PyObject *info = NULL;
        if (all_shapes) {
            info = PyDict_GetItemWithError(shapes, key);
            if (info == NULL && PyErr_Occurred()) {
                Py_DECREF(key);
                goto done;
            }
        }
        Py_DECREF(key);  /* (a tuple left part-filled holds NULLs, which its dealloc skips) */
        if (info == NULL || !PyTuple_Check(info) || PyTuple_GET_SIZE(info) != 2 ||
            !PyLong_CheckExact(PyTuple_GET_ITEM(info, 1))) {
            all_shapes = 0;
            continue;
        }
        long long count = PyLong_AsLongLong(PyTuple_GET_ITEM(info, 1));
        if (count == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            all_shapes = 0;
            continue;
        }
        ne[i] = count;
        PyList_SET_ITEM(texts, i, Py_NewRef(PyTuple_GET_ITEM(info, 0)));
    }
    PyObject *interned = Py_None;  /* the dtypes through intern.setdefault, when every one is a string */
    if (all_dtypes) {
        interned = PyList_New(n);
        if (interned == NULL)
            goto done;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *d = PyList_GET_ITEM(dtype_col, i), *kept = PyDict_SetDefault(intern, d, d);
            if (kept == NULL) {
                Py_DECREF(interned);
                goto done;
            }
            PyList_SET_ITEM(interned, i, Py_NewRef(kept));
        }
    }
    else
        Py_INCREF(interned);
    result = Py_BuildValue("OOOOOOOO", stats, null, shape_col, dtype_col, all_shapes ? texts : Py_None,
                           all_shapes ? numel : Py_None, interned, extra ? Py_True : Py_False);
    Py_DECREF(interned);
done:
    Py_XDECREF(stats);
    Py_XDECREF(null);
    Py_XDECREF(shape_col);
    Py_XDECREF(dtype_col);
    Py_XDECREF(texts);
    Py_XDECREF(numel);
    return result;
}

/* ---------------------------------------------------------------------------------------------- bare tokens */

static int
is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\r' || c == '\n';
}

/* _BEFORE (rb'"(?:Max|Min|Mean|Norm|value)"[ \t\r\n]*:[ \t\r\n]*\Z' searched in raw[max(0, start - 40):start])
 * and no backslash before its quote */
static int
key_before(const char *s, Py_ssize_t start)
{
    Py_ssize_t lo = start > 40 ? start - 40 : 0, k = start - 1;
    while (k >= lo && is_space(s[k]))
        k--;
    if (k < lo || s[k] != ':')
        return 0;
    k--;
    while (k >= lo && is_space(s[k]))
        k--;
    if (k < lo || s[k] != '"')
        return 0;
    static const char *keys[] = {"Max", "Min", "Mean", "Norm", "value"};
    for (int j = 0; j < 5; j++) {
        Py_ssize_t n = (Py_ssize_t)strlen(keys[j]), q = k - n - 1;  /* the opening quote */
        if (q >= lo && s[q] == '"' && memcmp(s + q + 1, keys[j], (size_t)n) == 0)
            return q == 0 || s[q - 1] != '\\';
    }
    return 0;
}

static int
after_ok(const char *s, Py_ssize_t n, Py_ssize_t end)
{
    return end == n || is_space(s[end]) || s[end] == ',' || s[end] == '}' || s[end] == ']';
}

/* The quotable spans of one token (NaN, or Infinity with its sign) in s, appended to *spans (pairs start, end). */
static int
token_spans(const char *s, Py_ssize_t n, const char *token, Py_ssize_t len, Py_ssize_t **spans, Py_ssize_t *count,
            Py_ssize_t *cap)
{
    const char *p = s, *stop = s + n;
    while (p + len <= stop) {
        const char *hit = memmem(p, (size_t)(stop - p), token, (size_t)len);
        if (hit == NULL)
            break;
        Py_ssize_t i = hit - s, end = i + len;
        Py_ssize_t start = (token[0] == 'I' && i && s[i - 1] == '-') ? i - 1 : i;
        if (after_ok(s, n, end) && key_before(s, start)) {
            if (*count == *cap) {
                *cap *= 2;
                Py_ssize_t *more = PyMem_Realloc(*spans, sizeof(Py_ssize_t) * 2 * (size_t)*cap);
                if (more == NULL)
                    return -1;
                *spans = more;
            }
            (*spans)[2 * *count] = start;
            (*spans)[2 * *count + 1] = end;
            (*count)++;
        }
        p = hit + len;  /* bytes.find from the token's end */
    }
    return 0;
}

/* quote_tokens(raw, nan) -> bytes: precnb.io.msprobe._json.quote_tokens (raw itself when nothing is quoted) */
static PyObject *
quote_tokens(PyObject *Py_UNUSED(self), PyObject *args)
{
    PyObject *raw;
    int nan;
    if (!PyArg_ParseTuple(args, "O!p", &PyBytes_Type, &raw, &nan))
        return NULL;
    const char *s = PyBytes_AS_STRING(raw);
    Py_ssize_t n = PyBytes_GET_SIZE(raw), cap_a = 64, cap_b = 64, n_a = 0, n_b = 0;
    Py_ssize_t *a = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)cap_a);
    Py_ssize_t *b = PyMem_Malloc(sizeof(Py_ssize_t) * 2 * (size_t)cap_b);
    PyObject *out = NULL;
    if (a == NULL || b == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if ((nan && token_spans(s, n, "NaN", 3, &a, &n_a, &cap_a) < 0) ||
        token_spans(s, n, "Infinity", 8, &b, &n_b, &cap_b) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (n_a + n_b == 0) {
        out = Py_NewRef(raw);
        goto done;
    }
    out = PyBytes_FromStringAndSize(NULL, n + 2 * (n_a + n_b));
    if (out == NULL)
        goto done;
    char *o = PyBytes_AS_STRING(out);
    Py_ssize_t last = 0, i = 0, j = 0;
    while (i < n_a || j < n_b) {  /* the two tokens' spans are disjoint: merged in order */
        Py_ssize_t *sp = (j >= n_b || (i < n_a && a[2 * i] < b[2 * j])) ? a + 2 * i++ : b + 2 * j++;
        memcpy(o, s + last, (size_t)(sp[0] - last));
        o += sp[0] - last;
        *o++ = '"';
        memcpy(o, s + sp[0], (size_t)(sp[1] - sp[0]));
        o += sp[1] - sp[0];
        *o++ = '"';
        last = sp[1];
    }
    memcpy(o, s + last, (size_t)(n - last));
done:
    PyMem_Free(a);
    PyMem_Free(b);
    return out;
}

static PyMethodDef methods[] = {
    {"configure", configure, METH_VARARGS,
     "configure(non_tensor_types, order, index, undefined_prefixes, comm_prefixes, no_signature, module_cell, "
     "node_kind)"},
    {"walk_batch", walk_batch, METH_VARARGS,
     "walk_batch(data, pos, names, parents, leaves, labels, roles, nodes, node_parents, counts, todo, sigs, "
     "need_backward, need_forward) -> None, or (pos, node, record, parent) of a record to read in Python"},
    {"parts_add", parts_add, METH_VARARGS,
     "parts_add(nodes, parents, kinds, apis, modules, dirs, calls, out_parents, of_parent, names, module_of, "
     "name_parts): NodeParts.add"},
    {"optimizer_args", optimizer_args, METH_VARARGS,
     "optimizer_args(node, record, found, positions, plain, scalars_arg, scalars_kwarg, api_of, known) -> api "
     "or None: FileFacts.optimizer's scan"},
    {"leaf_columns", leaf_columns, METH_VARARGS,
     "leaf_columns(leaves, shapes, intern) -> None or (stats, null, shapes, dtypes, shape texts, numel, interned "
     "dtypes, md5/data_name present): Columns.add_batch"},
    {"facts_batch", facts_batch, METH_VARARGS,
     "facts_batch(todo, node_facts, api_facts, known, merge, positions, plain, scalars_arg, scalars_kwarg, api_of, "
     "markers): "
     "the run facts of one batch, in file order"},
    {"quote_tokens", quote_tokens, METH_VARARGS,
     "quote_tokens(raw, nan) -> bytes: precnb.io.msprobe._json.quote_tokens"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cwalk", "The common msprobe node records of a batch, walked in C (optional).", -1,
    methods,
};

PyMODINIT_FUNC
PyInit__cwalk(void)
{
    return PyModule_Create(&module);
}
