/* Byte planes split and joined in one pass each, the float rotation fused in (lightning_nvcomp/codec/planes.py says
 * what the layout is). numpy needs several strided passes for either; these loops run at memory speed and release
 * the GIL, so the segment threads run them side by side.
 *
 * Built against the limited API (one abi3 binary for every Python); pointers come as integers from planes.py, which
 * checks every buffer's size and contiguity before a call. */
#define Py_LIMITED_API 0x030A0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_WIDTH 8

/* The rotation: the 16 bits a number's top two bytes form turned left by one bit (split) or right (join). */
static inline uint16_t rotl1(uint16_t v) { return (uint16_t)((v << 1) | (v >> 15)); }
static inline uint16_t rotr1(uint16_t v) { return (uint16_t)((v >> 1) | (v << 15)); }

static void split_planes(uint8_t *src, uint8_t **rows, Py_ssize_t n, int width, int rotated) {
    if (width == 4) {
        uint8_t *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
        for (Py_ssize_t i = 0; i < n; i++) {
            uint32_t v;
            memcpy(&v, src + 4 * i, 4);
            uint16_t top = (uint16_t)(v >> 16);
            if (rotated) top = rotl1(top);
            r0[i] = (uint8_t)v;
            r1[i] = (uint8_t)(v >> 8);
            r2[i] = (uint8_t)top;
            r3[i] = (uint8_t)(top >> 8);
        }
    } else if (width == 2) {
        uint8_t *r0 = rows[0], *r1 = rows[1];
        for (Py_ssize_t i = 0; i < n; i++) {
            uint16_t v;
            memcpy(&v, src + 2 * i, 2);
            if (rotated) v = rotl1(v);
            r0[i] = (uint8_t)v;
            r1[i] = (uint8_t)(v >> 8);
        }
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            const uint8_t *number = src + (Py_ssize_t)width * i;
            for (int k = 0; k < width - 2; k++) rows[k][i] = number[k];
            uint16_t top = (uint16_t)(number[width - 2] | (number[width - 1] << 8));
            if (rotated) top = rotl1(top);
            rows[width - 2][i] = (uint8_t)top;
            rows[width - 1][i] = (uint8_t)(top >> 8);
        }
    }
}

/* What a join does with each number it makes: store it, or combine it with the number already there (a delta's
 * transform undone: XOR, or the wrapping sum of the two as unsigned integers of the number's width). */
enum { STORE = 0, XOR = 1, ADD = 2 };

#define PUT(type, at, value, op)                                                                                   \
    do {                                                                                                           \
        type v_ = (value), o_;                                                                                     \
        if ((op) != STORE) {                                                                                       \
            memcpy(&o_, (at), sizeof(type));                                                                       \
            v_ = (op) == XOR ? (type)(o_ ^ v_) : (type)(o_ + v_);                                                  \
        }                                                                                                          \
        memcpy((at), &v_, sizeof(type));                                                                           \
    } while (0)

/* Inlined with a constant op, each loop is compiled once per op (no branch per number). */
static inline __attribute__((always_inline)) void join_with(uint8_t *out, uint8_t **rows, Py_ssize_t n, int width,
                                                             int rotated, int op) {
    if (width == 4) {
        const uint8_t *r0 = rows[0], *r1 = rows[1], *r2 = rows[2], *r3 = rows[3];
        for (Py_ssize_t i = 0; i < n; i++) {
            uint16_t top = (uint16_t)(r2[i] | (r3[i] << 8));
            if (rotated) top = rotr1(top);
            PUT(uint32_t, out + 4 * i, (uint32_t)r0[i] | ((uint32_t)r1[i] << 8) | ((uint32_t)top << 16), op);
        }
    } else if (width == 2) {
        const uint8_t *r0 = rows[0], *r1 = rows[1];
        for (Py_ssize_t i = 0; i < n; i++) {
            uint16_t v = (uint16_t)(r0[i] | (r1[i] << 8));
            if (rotated) v = rotr1(v);
            PUT(uint16_t, out + 2 * i, v, op);
        }
    } else {
        uint8_t number[MAX_WIDTH];
        for (Py_ssize_t i = 0; i < n; i++) {
            for (int k = 0; k < width - 2; k++) number[k] = rows[k][i];
            uint16_t top = (uint16_t)(rows[width - 2][i] | (rows[width - 1][i] << 8));
            if (rotated) top = rotr1(top);
            number[width - 2] = (uint8_t)top;
            number[width - 1] = (uint8_t)(top >> 8);
            uint8_t *at = out + (Py_ssize_t)width * i;
            if (op == STORE) {
                memcpy(at, number, (size_t)width);
            } else if (op == XOR) {
                for (int k = 0; k < width; k++) at[k] ^= number[k];
            } else { /* ADD: planes.py allows it on 8-byte numbers only */
                uint64_t v;
                memcpy(&v, number, 8);
                PUT(uint64_t, at, v, ADD);
            }
        }
    }
}

static void join_planes(uint8_t *out, uint8_t **rows, Py_ssize_t n, int width, int rotated, int op) {
    switch (op) {
    case XOR:
        join_with(out, rows, n, width, rotated, XOR);
        break;
    case ADD:
        join_with(out, rows, n, width, rotated, ADD);
        break;
    default:
        join_with(out, rows, n, width, rotated, STORE);
    }
}

static void split_pass(uint8_t *src, uint8_t **rows, Py_ssize_t n, int width, int rotated, int op) {
    (void)op;
    split_planes(src, rows, n, width, rotated);
}

typedef void (*planes_pass)(uint8_t *buffer, uint8_t **rows, Py_ssize_t n, int width, int rotated, int op);

/* Parse (buffer address, n, rotated, [op,] row addresses...) and run the pass on them without the GIL. */
static PyObject *run(PyObject *args, planes_pass pass, int with_op) {
    uint8_t *rows[MAX_WIDTH];
    Py_ssize_t count = PyTuple_Size(args), first = 3 + with_op;
    if (count < first + 2 || count > first + MAX_WIDTH) {
        PyErr_SetString(PyExc_ValueError, "expected a buffer, a count, a flag, [an op,] and 2 to 8 rows");
        return NULL;
    }
    uint8_t *buffer = PyLong_AsVoidPtr(PyTuple_GetItem(args, 0));
    Py_ssize_t n = PyLong_AsSsize_t(PyTuple_GetItem(args, 1));
    int rotated = PyObject_IsTrue(PyTuple_GetItem(args, 2));
    long op = with_op ? PyLong_AsLong(PyTuple_GetItem(args, 3)) : STORE;
    int width = (int)(count - first);
    for (int k = 0; k < width; k++) rows[k] = PyLong_AsVoidPtr(PyTuple_GetItem(args, first + k));
    if (PyErr_Occurred()) return NULL;
    if (op < STORE || op > ADD || (op == ADD && width != 2 && width != 4 && width != 8)) {
        PyErr_SetString(PyExc_ValueError, "op: 0 (store), 1 (xor) or 2 (add, on numbers of 2, 4 or 8 bytes)");
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    pass(buffer, rows, n, width, rotated, (int)op);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *split(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, split_pass, 0);
}

static PyObject *join(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, join_planes, 1);
}

static PyMethodDef methods[] = {
    {"split", split, METH_VARARGS, "split(src, n, rotated, *rows): n numbers at src into their byte rows."},
    {"join", join, METH_VARARGS, "join(out, n, rotated, op, *rows): byte rows of n numbers into out (op: 0 store, 1 xor, 2 add)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_planes", NULL, 0, methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__planes(void) { return PyModule_Create(&module); }
