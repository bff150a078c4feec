/* The exact-type checks of the commit path, in C.
 *
 * A commit must refuse every value whose type would not come back as itself
 * (statelog/format/values.py). The common batch holds only plain values, or
 * only dicts of plain keys and plain values, and checking the type of each of
 * its objects is the largest single cost of a commit when it runs as Python
 * iterators. These functions make the same decisions as plain_batch_py and
 * plain_keys_py in exact.py, which remain the reference and the fallback when
 * this module was not built; a test holds the two to the same answers.
 *
 * Both functions only read object types and sizes: they call no Python code
 * (types are compared by address, so no metaclass __eq__ or __hash__ runs),
 * allocate nothing and hold the GIL throughout, so no object they read can
 * change under them. Neither raises for the contents it reads; a False answer
 * sends the batch to the per-object path, which decides and names the error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Exact types only: a subclass (IntEnum, a str subclass) comes back as its base. */
static inline int
is_plain(PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    return t == &PyUnicode_Type || t == &PyLong_Type || t == &PyFloat_Type
        || t == &PyBytes_Type || t == &PyBool_Type || o == Py_None;
}

static int
plain_dict(PyObject *d)
{
    Py_ssize_t pos = 0;
    PyObject *k, *v;

    while (PyDict_Next(d, &pos, &k, &v)) {
        if (!is_plain(k) || !is_plain(v)) {
            return 0;
        }
    }
    return 1;
}

PyDoc_STRVAR(plain_batch_doc,
"plain_batch(values: list) -> bool\n\n"
"True when every item is of a plain type, or every item is a dict whose\n"
"keys and values all are (exact types: None, bool, int, float, str, bytes).");

static PyObject *
plain_batch(PyObject *module, PyObject *values)
{
    Py_ssize_t i, n;

    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "plain_batch() takes a list");
        return NULL;
    }
    n = PyList_GET_SIZE(values);
    for (i = 0; i < n && is_plain(PyList_GET_ITEM(values, i)); i++) {
    }
    if (i == n) {
        Py_RETURN_TRUE;
    }
    for (i = 0; i < n; i++) {
        PyObject *d = PyList_GET_ITEM(values, i);
        if (!PyDict_CheckExact(d) || !plain_dict(d)) {
            Py_RETURN_FALSE;
        }
    }
    Py_RETURN_TRUE;
}

PyDoc_STRVAR(plain_keys_doc,
"plain_keys(keys: list, max_len: int) -> bool\n\n"
"True when every item is an exact str or bytes of at most max_len\n"
"characters or bytes.");

static PyObject *
plain_keys(PyObject *module, PyObject *args)
{
    PyObject *keys;
    Py_ssize_t max_len, i, n;

    if (!PyArg_ParseTuple(args, "On:plain_keys", &keys, &max_len)) {
        return NULL;
    }
    if (!PyList_CheckExact(keys)) {
        /* A subclass could answer for its items other than its storage holds. */
        PyErr_SetString(PyExc_TypeError, "plain_keys() takes a list");
        return NULL;
    }
    n = PyList_GET_SIZE(keys);
    for (i = 0; i < n; i++) {
        PyObject *k = PyList_GET_ITEM(keys, i);
        PyTypeObject *t = Py_TYPE(k);
        Py_ssize_t len;

        if (t == &PyUnicode_Type) {
#if PY_VERSION_HEX < 0x030C0000
            if (!PyUnicode_IS_READY(k)) {
                /* A legacy string: readying it would allocate; the per-key path decides. */
                Py_RETURN_FALSE;
            }
#endif
            len = PyUnicode_GET_LENGTH(k);
        }
        else if (t == &PyBytes_Type) {
            len = PyBytes_GET_SIZE(k);
        }
        else {
            Py_RETURN_FALSE;
        }
        if (len > max_len) {
            Py_RETURN_FALSE;
        }
    }
    Py_RETURN_TRUE;
}

static PyMethodDef exact_methods[] = {
    {"plain_batch", (PyCFunction)plain_batch, METH_O, plain_batch_doc},
    {"plain_keys", (PyCFunction)plain_keys, METH_VARARGS, plain_keys_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot exact_slots[] = {
#ifdef Py_mod_multiple_interpreters
    /* The module keeps no state, so each interpreter may have its own GIL. */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef exact_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "statelog.format._exact",
    .m_doc = "The commit path's exact-type checks, in C (see statelog.format.exact).",
    .m_size = 0,
    .m_methods = exact_methods,
    .m_slots = exact_slots,
};

PyMODINIT_FUNC
PyInit__exact(void)
{
    return PyModuleDef_Init(&exact_module);
}
