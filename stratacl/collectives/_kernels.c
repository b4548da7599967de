/*
 * Data-movement kernels of the collectives: what a rank's cores execute.
 *
 *   copy(dst, src, nbytes)                   one block
 *   copy_many(table)                         rows of (dst, src, nbytes): one memcpy each
 *   copy_chunks(dst, srcs, count, item, me)  every other member's chunk of a buffer
 *   reduce_into(dst, srcs, count, dtype, op, divisor)
 *                                            dst[i] = ((s0[i] op s1[i]) op s2[i]) ... in the
 *                                            order of `srcs`, in the element type, tile by tile
 *
 * Both release the GIL. Reductions follow numpy's semantics exactly, so results are bitwise
 * equal to numpy applied in the same order: integers wrap, bool sum/max are logical or and
 * prod/min logical and, min/max propagate NaN like np.minimum/np.maximum, float16 arithmetic
 * is done in float32 and rounded back once per operation (as numpy's half loops do), and avg
 * divides the sum by `divisor` in the element type.
 *
 * A tile is accumulated in a private buffer and written to dst once, so dst may alias one of
 * the sources (in-place all_reduce).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define TILE_BYTES (64 * 1024)
#define RELEASE_GIL_BYTES (256 * 1024)

/* dtype codes: as stratacl.collectives._reduce.DTYPES */
enum { T_BOOL = 1, T_U8, T_I8, T_I16, T_I32, T_I64, T_F16, T_F32, T_F64, T_U16, T_U32, T_U64 };
/* reduce op codes: as _reduce.REDUCE_OPS */
enum { OP_SUM = 1, OP_PROD, OP_MIN, OP_MAX, OP_AVG };

static int get_table(PyObject *obj, Py_buffer *view, Py_ssize_t cols) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != 8 || (view->len / 8) % cols != 0) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "expected a C-contiguous int64 array with %zd columns", cols);
        return -1;
    }
    return 0;
}

static PyObject *copy_many(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (get_table(arg, &view, 3) < 0) return NULL;
    const int64_t *t = (const int64_t *)view.buf;
    Py_ssize_t rows = view.len / 24;
    int64_t total = 0;
    for (Py_ssize_t r = 0; r < rows; r++) total += t[3 * r + 2] > 0 ? t[3 * r + 2] : 0;
    /* releasing the GIL costs microseconds: only worth it when the copies take longer */
    PyThreadState *ts = total >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (t[3 * r + 2] > 0)
            memcpy((void *)(uintptr_t)t[3 * r], (const void *)(uintptr_t)t[3 * r + 1], (size_t)t[3 * r + 2]);
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

/* copy(dst, src, nbytes): one block (point-to-point receive, broadcast). */
static PyObject *copy_one(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "copy(dst, src, nbytes)"); return NULL; }
    unsigned long long dst = PyLong_AsUnsignedLongLong(args[0]);
    unsigned long long src = PyLong_AsUnsignedLongLong(args[1]);
    long long nbytes = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    if (nbytes <= 0) Py_RETURN_NONE;
    PyThreadState *ts = nbytes >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    memcpy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, (size_t)nbytes);
    if (ts != NULL) PyEval_RestoreThread(ts);
    Py_RETURN_NONE;
}

/* copy_blocks(dst_base, dst_stride, srcs, src_offset, nbytes, first): for every member p,
 * visiting p = first, first+1, ... (mod n), copy `nbytes` from srcs[p] + src_offset to
 * dst_base + p * dst_stride, skipping a block already in place. Returns the bytes copied. */
static PyObject *copy_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "copy_blocks(dst_base, dst_stride, srcs, src_offset, nbytes, first)");
        return NULL;
    }
    unsigned long long dst = PyLong_AsUnsignedLongLong(args[0]);
    long long stride = PyLong_AsLongLong(args[1]);
    long long src_off = PyLong_AsLongLong(args[3]);
    long long nbytes = PyLong_AsLongLong(args[4]);
    long long first = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (get_table(args[2], &view, 1) < 0) return NULL;
    const int64_t *srcs = (const int64_t *)view.buf;
    Py_ssize_t n = view.len / 8;
    long long copied = 0;
    PyThreadState *ts = nbytes * n >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t k = 0; k < n && nbytes > 0; k++) {
        Py_ssize_t p = (Py_ssize_t)((first + k) % n);
        char *d = (char *)(uintptr_t)dst + p * stride;
        const char *s = (const char *)(uintptr_t)srcs[p] + src_off;
        if (d != s) { memcpy(d, s, (size_t)nbytes); copied += nbytes; }
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(copied);
}

/* copy_chunks(dst, srcs, count, itemsize, me): the gather phase of all_reduce. Chunk p is
 * elements [count*p/n, count*(p+1)/n); for every member p != me (p = me+1, me+2, ... mod n)
 * copy chunk p from srcs[p] to dst, both at the chunk's byte offset. Returns the bytes copied. */
static PyObject *copy_chunks(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) { PyErr_SetString(PyExc_TypeError, "copy_chunks(dst, srcs, count, itemsize, me)"); return NULL; }
    unsigned long long dst = PyLong_AsUnsignedLongLong(args[0]);
    long long count = PyLong_AsLongLong(args[2]);
    long long item = PyLong_AsLongLong(args[3]);
    long long me = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (get_table(args[1], &view, 1) < 0) return NULL;
    const int64_t *srcs = (const int64_t *)view.buf;
    long long n = (long long)(view.len / 8);
    long long copied = 0;
    PyThreadState *ts = count * item >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (long long k = 1; k < n; k++) {
        long long p = (me + k) % n;
        long long a = count * p / n, b = count * (p + 1) / n;
        if (b > a) {
            memcpy((char *)(uintptr_t)dst + a * item, (const char *)(uintptr_t)srcs[p] + a * item, (size_t)((b - a) * item));
            copied += (b - a) * item;
        }
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    PyBuffer_Release(&view);
    return PyLong_FromLongLong(copied);
}

/* one accumulation step acc[i] = acc[i] op s[i], for every type */
#define INT_LOOP(T, UT)                                                                         \
    static void step_##T(T *acc, const T *s, size_t n, int op) {                               \
        size_t i;                                                                               \
        switch (op) {                                                                           \
        case OP_SUM: for (i = 0; i < n; i++) acc[i] = (T)((UT)acc[i] + (UT)s[i]); break;       \
        case OP_PROD: for (i = 0; i < n; i++) acc[i] = (T)((UT)acc[i] * (UT)s[i]); break;      \
        case OP_MIN: for (i = 0; i < n; i++) acc[i] = acc[i] <= s[i] ? acc[i] : s[i]; break;   \
        case OP_MAX: for (i = 0; i < n; i++) acc[i] = acc[i] >= s[i] ? acc[i] : s[i]; break;   \
        }                                                                                       \
    }
INT_LOOP(uint8_t, uint8_t)
INT_LOOP(int8_t, uint8_t)
INT_LOOP(int16_t, uint16_t)
INT_LOOP(uint16_t, uint16_t)
INT_LOOP(int32_t, uint32_t)
INT_LOOP(uint32_t, uint32_t)
INT_LOOP(int64_t, uint64_t)
INT_LOOP(uint64_t, uint64_t)

static void step_bool(uint8_t *acc, const uint8_t *s, size_t n, int op) {
    size_t i;
    if (op == OP_SUM || op == OP_MAX)
        for (i = 0; i < n; i++) acc[i] = (acc[i] || s[i]) ? 1 : 0;
    else
        for (i = 0; i < n; i++) acc[i] = (acc[i] && s[i]) ? 1 : 0;
}

#define FLOAT_LOOP(T, NAME)                                                                     \
    static void step_##NAME(T *acc, const T *s, size_t n, int op) {                            \
        size_t i;                                                                               \
        switch (op) {                                                                           \
        case OP_SUM: case OP_AVG: for (i = 0; i < n; i++) acc[i] = acc[i] + s[i]; break;       \
        case OP_PROD: for (i = 0; i < n; i++) acc[i] = acc[i] * s[i]; break;                    \
        case OP_MIN:                                                                            \
            for (i = 0; i < n; i++) acc[i] = (acc[i] <= s[i] || isnan(acc[i])) ? acc[i] : s[i]; \
            break;                                                                              \
        case OP_MAX:                                                                            \
            for (i = 0; i < n; i++) acc[i] = (acc[i] >= s[i] || isnan(acc[i])) ? acc[i] : s[i]; \
            break;                                                                              \
        }                                                                                       \
    }
FLOAT_LOOP(float, f32)
FLOAT_LOOP(double, f64)

static void step_f16(_Float16 *acc, const _Float16 *s, size_t n, int op) {
    size_t i;
    switch (op) {
    case OP_SUM: case OP_AVG:
        for (i = 0; i < n; i++) acc[i] = (_Float16)((float)acc[i] + (float)s[i]);
        break;
    case OP_PROD:
        for (i = 0; i < n; i++) acc[i] = (_Float16)((float)acc[i] * (float)s[i]);
        break;
    case OP_MIN:
        for (i = 0; i < n; i++) {
            float a = (float)acc[i], b = (float)s[i];
            acc[i] = (a <= b || isnan(a)) ? acc[i] : s[i];
        }
        break;
    case OP_MAX:
        for (i = 0; i < n; i++) {
            float a = (float)acc[i], b = (float)s[i];
            acc[i] = (a >= b || isnan(a)) ? acc[i] : s[i];
        }
        break;
    }
}

static size_t type_size(int t) {
    switch (t) {
    case T_BOOL: case T_U8: case T_I8: return 1;
    case T_I16: case T_U16: case T_F16: return 2;
    case T_I32: case T_U32: case T_F32: return 4;
    case T_I64: case T_U64: case T_F64: return 8;
    }
    return 0;
}

static void step(int t, void *acc, const void *s, size_t n, int op) {
    switch (t) {
    case T_BOOL: step_bool(acc, s, n, op); break;
    case T_U8: step_uint8_t(acc, s, n, op); break;
    case T_I8: step_int8_t(acc, s, n, op); break;
    case T_I16: step_int16_t(acc, s, n, op); break;
    case T_U16: step_uint16_t(acc, s, n, op); break;
    case T_I32: step_int32_t(acc, s, n, op); break;
    case T_U32: step_uint32_t(acc, s, n, op); break;
    case T_I64: step_int64_t(acc, s, n, op); break;
    case T_U64: step_uint64_t(acc, s, n, op); break;
    case T_F16: step_f16(acc, s, n, op); break;
    case T_F32: step_f32(acc, s, n, op); break;
    case T_F64: step_f64(acc, s, n, op); break;
    }
}

static void divide(int t, void *acc, size_t n, double divisor) {
    size_t i;
    if (t == T_F32) { float d = (float)divisor; float *a = acc; for (i = 0; i < n; i++) a[i] = a[i] / d; }
    else if (t == T_F64) { double *a = acc; for (i = 0; i < n; i++) a[i] = a[i] / divisor; }
    else if (t == T_F16) {
        _Float16 *a = acc;
        float d = (float)(_Float16)divisor;
        for (i = 0; i < n; i++) a[i] = (_Float16)((float)a[i] / d);
    }
}

/* reduce_into(dst, srcs, count, dtype, op, divisor) */
static PyObject *reduce_into(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) { PyErr_SetString(PyExc_TypeError, "reduce_into(dst, srcs, count, dtype, op, divisor)"); return NULL; }
    unsigned long long dst = PyLong_AsUnsignedLongLong(args[0]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (get_table(args[1], &view, 1) < 0) return NULL;
    long long count = PyLong_AsLongLong(args[2]);
    int t = (int)PyLong_AsLong(args[3]);
    int op = (int)PyLong_AsLong(args[4]);
    double divisor = PyFloat_AsDouble(args[5]);
    size_t item = type_size(t);
    if (PyErr_Occurred() || item == 0 || op < OP_SUM || op > OP_AVG || count < 0) {
        PyBuffer_Release(&view);
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "reduce_into: bad dtype, op or count");
        return NULL;
    }
    const int64_t *srcs = (const int64_t *)view.buf;
    Py_ssize_t nsrc = view.len / 8;
    size_t tile = TILE_BYTES / item;
    char *acc = PyMem_RawMalloc(TILE_BYTES);
    if (acc == NULL) { PyBuffer_Release(&view); return PyErr_NoMemory(); }
    PyThreadState *ts = (int64_t)count * (int64_t)item * nsrc >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (size_t start = 0; start < (size_t)count; start += tile) {
        size_t m = (size_t)count - start < tile ? (size_t)count - start : tile;
        size_t off = start * item;
        memcpy(acc, (const char *)(uintptr_t)srcs[0] + off, m * item);
        for (Py_ssize_t j = 1; j < nsrc; j++)
            step(t, acc, (const char *)(uintptr_t)srcs[j] + off, m, op);
        if (op == OP_AVG) divide(t, acc, m, divisor);
        memcpy((char *)(uintptr_t)dst + off, acc, m * item);
    }
    if (ts != NULL) PyEval_RestoreThread(ts);
    PyMem_RawFree(acc);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"copy", (PyCFunction)(void (*)(void))copy_one, METH_FASTCALL, "Copy one block of bytes."},
    {"copy_chunks", (PyCFunction)(void (*)(void))copy_chunks, METH_FASTCALL, "The gather phase of all_reduce."},
    {"copy_many", copy_many, METH_O, "Execute rows of (dst, src, nbytes) copies."},
    {"copy_blocks", (PyCFunction)(void (*)(void))copy_blocks, METH_FASTCALL,
     "Copy one equal block from every member into a strided destination."},
    {"reduce_into", (PyCFunction)(void (*)(void))reduce_into, METH_FASTCALL,
     "dst = reduction of the sources in order, numpy semantics."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&moduledef); }
