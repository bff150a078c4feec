/* The commit path's exact-type key check and plain-batch encoder, and the
 * compactor's key encoder, in C.
 *
 * A commit must refuse every value whose type would not come back as itself
 * (statelog/format/values.py) and encode every value it keeps. The common
 * batch holds only plain values, or dicts of plain keys and plain values, and
 * checking and encoding it object by object through Python iterators and one
 * msgspec call per value is the largest cost of a commit after the fsync.
 * The compactor encodes every key of every record it folds into the bytes an
 * image stores, two allocations per key through Python's maps.
 * These functions give the answers of plain_keys_py, encode_plain_py and
 * tagged_keys_py in exact.py, which remain the reference and the fallback when
 * this module was not built; a test holds the two to the same answers.
 *
 * Types are compared by address, so no metaclass __eq__ or __hash__ runs,
 * and the GIL is held throughout. No function raises for the contents it
 * reads (only MemoryError): a False or None answer sends the batch to the
 * per-object path, which decides and names the error.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

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

/* encode_plain: msgpack bytes of each value of a plain batch, the same bytes
 * msgspec's encoder writes (the smallest int, str, bin and map headers; every
 * float as float 64). Encoding a batch object by object through msgspec pays
 * a call per value, the largest cost of a commit after the fsync. A test holds
 * these bytes to msgspec's for every header size.
 *
 * A value outside the plain set (anything but an exact scalar, or an exact
 * dict of exact scalars), an int outside msgpack's range, or a str that is
 * not valid UTF-8 makes the whole answer None, with no error set: the caller's
 * per-value path then decides and names the error.
 *
 * Allocating the result list may run a collection, and its finalizers may
 * change the batch, so its size is read again after that. Nothing allocated
 * while values are read is tracked by the collector (bytes, a str's UTF-8
 * copy, the scratch buffer), so no dict can change while it is encoded; an
 * exception raised on the way (which may collect) ends the call at once.
 */
typedef struct {
    char *data;
    Py_ssize_t len;
    Py_ssize_t cap;
} Buf;

static int
buf_reserve(Buf *b, Py_ssize_t more)
{
    Py_ssize_t need = b->len + more;
    char *grown;

    if (need <= b->cap) {
        return 0;
    }
    if (more < 0 || need > PY_SSIZE_T_MAX / 2) {
        PyErr_NoMemory();
        return -1;
    }
    grown = PyMem_Realloc(b->data, (size_t)(need * 2));
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    b->data = grown;
    b->cap = need * 2;
    return 0;
}

/* msgpack's multi-byte numbers and lengths are big-endian; space reserved by the caller. */
static inline void
put_be(Buf *b, unsigned char c, unsigned long long x, int n)
{
    unsigned char *p = (unsigned char *)b->data + b->len;

    p[0] = c;
    for (int i = n; i >= 1; i--) {
        p[i] = (unsigned char)(x & 0xFF);
        x >>= 8;
    }
    b->len += 1 + n;
}

/* A header of a sized type: the fix form below fix_limit, else 8, 16 or 32-bit length. */
static int
put_size(Buf *b, Py_ssize_t n, unsigned char fix, Py_ssize_t fix_limit,
         unsigned char c8, unsigned char c16, unsigned char c32)
{
    if (buf_reserve(b, 5) < 0) {
        return -1;
    }
    if (n < fix_limit) {
        b->data[b->len++] = (char)(fix | (unsigned char)n);
    }
    else if (c8 != 0 && n < 0x100) {
        put_be(b, c8, (unsigned long long)n, 1);
    }
    else if (n < 0x10000) {
        put_be(b, c16, (unsigned long long)n, 2);
    }
    else if ((unsigned long long)n <= 0xFFFFFFFFULL) {
        put_be(b, c32, (unsigned long long)n, 4);
    }
    else {
        return 1;  /* too large for msgpack: the per-value path raises */
    }
    return 0;
}

static int
put_raw(Buf *b, const char *p, Py_ssize_t n)
{
    if (buf_reserve(b, n) < 0) {
        return -1;
    }
    memcpy(b->data + b->len, p, (size_t)n);
    b->len += n;
    return 0;
}

/* Almost every int a reconciler stores has one or two digits: read them in place,
 * without the call the general path costs (*ok set); else 0. */
static inline long long
compact_int(PyObject *o, int *ok)
{
#if PY_VERSION_HEX >= 0x030C0000
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        *ok = 1;
        return (long long)PyUnstable_Long_CompactValue((PyLongObject *)o);
    }
#else
    Py_ssize_t size = Py_SIZE(o);
    const digit *d = ((PyLongObject *)o)->ob_digit;

    if (size >= -1 && size <= 1) {
        *ok = 1;
        return (long long)size * (long long)d[0];
    }
    if (size == 2 || size == -2) {  /* 60 bits: millisecond timestamps */
        long long v = (long long)d[0] | ((long long)d[1] << PyLong_SHIFT);
        *ok = 1;
        return size < 0 ? -v : v;
    }
#endif
    return 0;
}

static int
put_int(Buf *b, PyObject *o)
{
    int overflow = 0, ok = 0;
    long long x = compact_int(o, &ok);

    if (!ok) {
        /* An exact int cannot fail here: it only overflows. */
        x = PyLong_AsLongLongAndOverflow(o, &overflow);
    }
    if (overflow < 0) {
        return 1;  /* below -2**63: msgspec's OverflowError, on the per-value path */
    }
    if (buf_reserve(b, 9) < 0) {
        return -1;
    }
    if (overflow > 0) {
        unsigned long long u = PyLong_AsUnsignedLongLong(o);
        if (u == (unsigned long long)-1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
                return -1;
            }
            PyErr_Clear();  /* above 2**64-1 */
            return 1;
        }
        put_be(b, 0xcf, u, 8);
        return 0;
    }
    if (x >= 0) {
        unsigned long long u = (unsigned long long)x;
        if (u < 0x80) {
            b->data[b->len++] = (char)u;
        }
        else if (u < 0x100) {
            put_be(b, 0xcc, u, 1);
        }
        else if (u < 0x10000) {
            put_be(b, 0xcd, u, 2);
        }
        else if (u < 0x100000000ULL) {
            put_be(b, 0xce, u, 4);
        }
        else {
            put_be(b, 0xcf, u, 8);
        }
    }
    else if (x >= -32) {
        b->data[b->len++] = (char)(unsigned char)(x & 0xFF);
    }
    else if (x >= -128) {
        put_be(b, 0xd0, (unsigned long long)x, 1);
    }
    else if (x >= -32768) {
        put_be(b, 0xd1, (unsigned long long)x, 2);
    }
    else if (x >= -2147483648LL) {
        put_be(b, 0xd2, (unsigned long long)x, 4);
    }
    else {
        put_be(b, 0xd3, (unsigned long long)x, 8);
    }
    return 0;
}

/* One exact scalar: 0 written, 1 not encodable here (the per-value path decides), -1 error. */
static int
put_scalar(Buf *b, PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);

    if (t == &PyUnicode_Type) {
        Py_ssize_t n;
        const char *p;
        int r;

        if (PyUnicode_IS_COMPACT_ASCII(o)) {  /* its characters are its UTF-8 */
            n = PyUnicode_GET_LENGTH(o);
            p = (const char *)PyUnicode_DATA(o);
        }
        else {
            p = PyUnicode_AsUTF8AndSize(o, &n);
        }
        if (p == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
                return -1;
            }
            PyErr_Clear();  /* a lone surrogate: msgspec raises it on the per-value path */
            return 1;
        }
        r = put_size(b, n, 0xa0, 32, 0xd9, 0xda, 0xdb);
        return r != 0 ? r : put_raw(b, p, n);
    }
    if (t == &PyLong_Type) {
        return put_int(b, o);
    }
    if (t == &PyFloat_Type) {
        double d = PyFloat_AS_DOUBLE(o);
        unsigned long long u;

        if (buf_reserve(b, 9) < 0) {
            return -1;
        }
        memcpy(&u, &d, sizeof u);
        put_be(b, 0xcb, u, 8);
        return 0;
    }
    if (t == &PyBytes_Type) {
        Py_ssize_t n = PyBytes_GET_SIZE(o);
        int r = put_size(b, n, 0, 0, 0xc4, 0xc5, 0xc6);
        return r != 0 ? r : put_raw(b, PyBytes_AS_STRING(o), n);
    }
    if (buf_reserve(b, 1) < 0) {
        return -1;
    }
    if (o == Py_None) {
        b->data[b->len++] = (char)0xc0;
    }
    else if (o == Py_False) {
        b->data[b->len++] = (char)0xc2;
    }
    else if (o == Py_True) {
        b->data[b->len++] = (char)0xc3;
    }
    else {
        return 1;
    }
    return 0;
}

static int
put_value(Buf *b, PyObject *o)
{
    Py_ssize_t pos = 0;
    PyObject *k, *v;
    int r;

    if (!PyDict_CheckExact(o)) {
        return put_scalar(b, o);
    }
    r = put_size(b, PyDict_GET_SIZE(o), 0x80, 16, 0, 0xde, 0xdf);
    while (r == 0 && PyDict_Next(o, &pos, &k, &v)) {
        r = put_scalar(b, k);
        if (r == 0) {
            r = put_scalar(b, v);
        }
    }
    return r;
}

PyDoc_STRVAR(encode_plain_doc,
"encode_plain(values: list) -> list[bytes] | None\n\n"
"The msgpack bytes of each value, as msgspec encodes it, when every value is\n"
"an exact plain scalar or an exact dict of them and each encodes; else None.");

static PyObject *
encode_plain(PyObject *module, PyObject *values)
{
    Buf b = {NULL, 0, 0};
    PyObject *out;
    Py_ssize_t i, n;
    int r = 0;

    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "encode_plain() takes a list");
        return NULL;
    }
    n = PyList_GET_SIZE(values);
    out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    if (PyList_GET_SIZE(values) != n) {
        Py_DECREF(out);  /* a finalizer changed the batch: the per-value path reads it */
        Py_RETURN_NONE;
    }
    for (i = 0; i < n; i++) {
        PyObject *item;

        b.len = 0;
        r = put_value(&b, PyList_GET_ITEM(values, i));
        if (r != 0) {
            break;
        }
        item = PyBytes_FromStringAndSize(b.data, b.len);
        if (item == NULL) {
            r = -1;
            break;
        }
        PyList_SET_ITEM(out, i, item);
    }
    PyMem_Free(b.data);
    if (r != 0) {
        Py_DECREF(out);
        if (r < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    return out;
}

PyDoc_STRVAR(tagged_keys_doc,
"tagged_keys(keys: list) -> list[bytes] | None\n\n"
"Each key as an image stores it: b'\\x01' + its UTF-8 for a str, b'\\x00' + itself\n"
"for bytes. None when some item is not an exact str or bytes, or a str does\n"
"not encode (a lone surrogate): the caller's per-key path names the error.");

static PyObject *
tagged_key(PyObject *k)
{
    /* A new reference, or NULL with an error set (MemoryError), or NULL with no
     * error set when this key is not for this path. */
    PyTypeObject *t = Py_TYPE(k);
    PyObject *utf8 = NULL, *item;
    const char *src;
    Py_ssize_t len;
    char tag;

    if (t == &PyUnicode_Type) {
#if PY_VERSION_HEX < 0x030C0000
        if (!PyUnicode_IS_READY(k)) {
            return NULL;
        }
#endif
        tag = 1;
        if (PyUnicode_IS_ASCII(k)) {
            src = (const char *)PyUnicode_DATA(k);
            len = PyUnicode_GET_LENGTH(k);
        }
        else {
            /* Not the str's own cached UTF-8 (PyUnicode_AsUTF8AndSize): that copy would
             * live as long as the key does. */
            utf8 = PyUnicode_AsUTF8String(k);
            if (utf8 == NULL) {
                if (!PyErr_ExceptionMatches(PyExc_MemoryError)) {
                    PyErr_Clear(); /* a lone surrogate: the per-key path raises it, named */
                }
                return NULL;
            }
            src = PyBytes_AS_STRING(utf8);
            len = PyBytes_GET_SIZE(utf8);
        }
    }
    else if (t == &PyBytes_Type) {
        tag = 0;
        src = PyBytes_AS_STRING(k);
        len = PyBytes_GET_SIZE(k);
    }
    else {
        return NULL;
    }
    item = PyBytes_FromStringAndSize(NULL, len + 1);
    if (item != NULL) {
        char *dst = PyBytes_AS_STRING(item);
        dst[0] = tag;
        memcpy(dst + 1, src, (size_t)len);
    }
    Py_XDECREF(utf8);
    return item;
}

static PyObject *
tagged_keys(PyObject *module, PyObject *keys)
{
    Py_ssize_t i, n;
    PyObject *out;

    if (!PyList_CheckExact(keys)) {
        PyErr_SetString(PyExc_TypeError, "tagged_keys() takes a list");
        return NULL;
    }
    n = PyList_GET_SIZE(keys);
    out = PyList_New(n);
    if (out == NULL) {
        return NULL;
    }
    /* Allocating the result may run a collection, whose finalizers may change the
     * list: the per-key path then reads it anew. Nothing in the loop allocates a
     * tracked object, so no collection runs there. */
    if (PyList_GET_SIZE(keys) != n) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    for (i = 0; i < n; i++) {
        PyObject *item = tagged_key(PyList_GET_ITEM(keys, i));
        if (item == NULL) {
            Py_DECREF(out);
            if (PyErr_Occurred()) {
                return NULL;
            }
            Py_RETURN_NONE;
        }
        PyList_SET_ITEM(out, i, item);
    }
    return out;
}

static PyMethodDef exact_methods[] = {
    {"plain_keys", (PyCFunction)plain_keys, METH_VARARGS, plain_keys_doc},
    {"encode_plain", (PyCFunction)encode_plain, METH_O, encode_plain_doc},
    {"tagged_keys", (PyCFunction)tagged_keys, METH_O, tagged_keys_doc},
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
    .m_doc = "The commit path's key check and plain encoder, and the compactor's key\n"
              "encoder, in C (see statelog.format.exact).",
    .m_size = 0,
    .m_methods = exact_methods,
    .m_slots = exact_slots,
};

PyMODINIT_FUNC
PyInit__exact(void)
{
    return PyModuleDef_Init(&exact_module);
}
