/* A read's check of stored values, without making the objects, in C.
 *
 * Every value a replay, a fold, a restore or a snapshot check reads is
 * decoded as a read decodes it (statelog/format/values.py, check_values),
 * which builds and drops a Python object per value: the largest cost of a
 * compaction pass's fold after the per-key dict. Most stored values use a
 * small part of msgpack that msgspec always decodes: nil, booleans, ints,
 * floats, ASCII strings, binaries, and arrays and maps of them nested a
 * little, with scalar map keys. This module proves that a value lies in that
 * part, reading its bytes once and making nothing. A value it cannot prove
 * (any extension, a non-ASCII string, a container as a map key, a map with
 * both str and bytes keys, deeper nesting, bytes that are not msgpack) is
 * left to msgspec, which decides and names the error: an answer of "not
 * proven" is never a verdict.
 *
 * So the one property that matters is soundness: a value proven here is one
 * msgspec decodes. tests/test_value_check.py holds it to that on generated
 * and mutated values. The GIL is held throughout and no Python code runs.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

/* Deeper values go to msgspec, whose limit is the interpreter's recursion limit. */
#define PROVEN_DEPTH 32

typedef const unsigned char *cur;

static cur plain_object(cur p, cur end, int depth, int is_key);

/* The big-endian unsigned int of width w at p, or -1 when fewer bytes remain. */
static inline int64_t
be_uint(cur p, cur end, int w)
{
    int64_t v = 0;
    int i;

    if (end - p < w) {
        return -1;
    }
    for (i = 0; i < w; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

static cur
skip(cur p, cur end, int64_t n)
{
    return (n < 0 || end - p < n) ? NULL : p + n;
}

static cur
ascii(cur p, cur end, int64_t n)
{
    cur q = skip(p, end, n);

    if (q == NULL) {
        return NULL;
    }
    for (; p < q; p++) {
        if (*p & 0x80) {
            return NULL;  /* UTF-8 beyond ASCII: msgspec's strict decoder decides */
        }
    }
    return q;
}

/* The kinds of map key a map may not mix: a str and a bytes key of the same
 * contents hash alike, and comparing them warns under `python -bb`. */
#define KEY_STR 1
#define KEY_BIN 2

/* n items (pairs when is_map) after p, each proven; the end of the last. */
static cur
items(cur p, cur end, int64_t n, int is_map, int depth)
{
    int64_t i;
    int keys = 0;

    if (n == 0) {
        return p;
    }
    if (n < 0 || depth >= PROVEN_DEPTH || (is_map ? 2 * n : n) > end - p) {
        return NULL;  /* every item takes at least one byte */
    }
    /* msgspec counts each container it enters against the interpreter's recursion
     * limit, from wherever the caller stands: so does the proof. */
    if (Py_EnterRecursiveCall(" proving a stored value")) {
        PyErr_Clear();
        return NULL;
    }
    for (i = 0; i < n && p != NULL; i++) {
        if (is_map) {
            unsigned char tag;

            if (p >= end) {
                p = NULL;
                break;
            }
            tag = *p;
            if ((tag >= 0xa0 && tag <= 0xbf) || (tag >= 0xd9 && tag <= 0xdb)) {
                keys |= KEY_STR;
            }
            else if (tag >= 0xc4 && tag <= 0xc6) {
                keys |= KEY_BIN;
            }
            p = keys == (KEY_STR | KEY_BIN) ? NULL : plain_object(p, end, depth + 1, 1);
            if (p == NULL) {
                break;
            }
        }
        p = plain_object(p, end, depth + 1, 0);
    }
    Py_LeaveRecursiveCall();
    return p;
}

/* Sized forms: the width of the length that follows the tag, by tag. */
static cur
sized(unsigned char tag, cur p, cur end, int depth, int is_key)
{
    int w;
    int64_t n;

    switch (tag) {
    case 0xc4: case 0xd9: w = 1; break;                      /* bin 8, str 8 */
    case 0xc5: case 0xda: case 0xdc: case 0xde: w = 2; break;  /* bin, str, array, map 16 */
    default: w = 4; break;                                   /* bin, str, array, map 32 */
    }
    n = be_uint(p, end, w);
    if (n < 0) {
        return NULL;
    }
    p += w;
    switch (tag) {
    case 0xc4: case 0xc5: case 0xc6:
        return skip(p, end, n);
    case 0xd9: case 0xda: case 0xdb:
        return ascii(p, end, n);
    default:
        /* A container as a map key is decoded into a tuple or refused as
         * unhashable, by rules that are msgspec's to apply. */
        if (is_key) {
            return NULL;
        }
        return items(p, end, n, tag == 0xde || tag == 0xdf, depth);
    }
}

/* The end of the one proven object at p, or NULL when it is not proven. */
static cur
plain_object(cur p, cur end, int depth, int is_key)
{
    unsigned char tag;

    if (p >= end) {
        return NULL;
    }
    tag = *p++;
    if (tag <= 0x7f || tag >= 0xe0) {
        return p;  /* positive and negative fixint */
    }
    if (tag >= 0xa0 && tag <= 0xbf) {
        return ascii(p, end, tag & 0x1f);
    }
    if (tag <= 0x9f) {  /* fixmap 0x80-0x8f, fixarray 0x90-0x9f */
        return is_key ? NULL : items(p, end, tag & 0x0f, tag <= 0x8f, depth);
    }
    switch (tag) {
    case 0xc0: case 0xc2: case 0xc3:
        return p;  /* nil, false, true */
    case 0xcc: case 0xd0:
        return skip(p, end, 1);
    case 0xcd: case 0xd1:
        return skip(p, end, 2);
    case 0xca: case 0xce: case 0xd2:
        return skip(p, end, 4);
    case 0xcb: case 0xcf: case 0xd3:
        return skip(p, end, 8);
    case 0xc4: case 0xc5: case 0xc6:  /* bin */
    case 0xd9: case 0xda: case 0xdb:  /* str */
    case 0xdc: case 0xdd:             /* array */
    case 0xde: case 0xdf:             /* map */
        return sized(tag, p, end, depth, is_key);
    default:
        return NULL;  /* 0xc1 (never used) and every extension */
    }
}

/* One whole object and nothing after it. */
static int
proven(const void *data, Py_ssize_t len)
{
    cur p = (cur)data;
    cur end = p + len;

    return plain_object(p, end, 0, 0) == end;
}

PyDoc_STRVAR(decodable_prefix_doc,
"decodable_prefix(values: list) -> int\n\n"
"How many leading items of values are each proven to be one msgpack object\n"
"that msgspec decodes (an exact bytes or a C-contiguous, unreleased memoryview\n"
"of the plain subset). The item after them is not proven, which is no verdict.");

static PyObject *
decodable_prefix(PyObject *module, PyObject *values)
{
    Py_ssize_t i, n;

    if (!PyList_CheckExact(values)) {
        PyErr_SetString(PyExc_TypeError, "decodable_prefix() takes a list");
        return NULL;
    }
    n = PyList_GET_SIZE(values);
    for (i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(values, i);
        int ok;

        if (PyBytes_CheckExact(v)) {
            ok = proven(PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
        }
        else if (Py_IS_TYPE(v, &PyMemoryView_Type)) {
            /* Asked for as msgspec asks: a released view refuses, where its stored
             * Py_buffer would still point at memory it no longer holds. */
            Py_buffer view;

            if (PyObject_GetBuffer(v, &view, PyBUF_CONTIG_RO) < 0) {
                PyErr_Clear();
                break;
            }
            ok = proven(view.buf, view.len);
            PyBuffer_Release(&view);
        }
        else {
            ok = 0;
        }
        if (!ok) {
            break;
        }
    }
    return PyLong_FromSsize_t(i);
}

static PyMethodDef msgcheck_methods[] = {
    {"decodable_prefix", (PyCFunction)decodable_prefix, METH_O, decodable_prefix_doc},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot msgcheck_slots[] = {
#ifdef Py_mod_multiple_interpreters
    /* The module keeps no state, so each interpreter may have its own GIL. */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef msgcheck_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "statelog.format._msgcheck",
    .m_doc = "A read's check of stored values in C (see statelog.format.values).",
    .m_size = 0,
    .m_methods = msgcheck_methods,
    .m_slots = msgcheck_slots,
};

PyMODINIT_FUNC
PyInit__msgcheck(void)
{
    return PyModuleDef_Init(&msgcheck_module);
}
