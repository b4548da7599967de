/*
 * Data-movement kernels of the collectives: what a rank's cores execute.
 *
 *   copy_many(table)                         rows of (dst, src, nbytes): one memcpy each (the
 *                                            SDMA engine's descriptors)
 *   run_plan(plan, bases, dtype, op, divisor)
 *                                            one phase of compiled remote slices: copies and
 *                                            reduction groups at (rank, buffer, offset)
 *
 * A reduction group computes dst[i] = ((s0[i] op s1[i]) op s2[i]) ... in the order of its
 * sources, in the element type, tile by tile. Both release the GIL when the work is large.
 * Reductions follow numpy's semantics exactly, so results are bitwise equal to numpy applied
 * in the same order: integers wrap, bool sum/max are logical or and
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

/* dst = srcs[0] op srcs[1] op ... in that order, `count` elements, tile by tile through `acc`
 * (TILE_BYTES): each tile is read from every source before it is written, so dst may alias one */
static void reduce_tiles(char *dst, const char *const *srcs, Py_ssize_t nsrc, size_t count, int t, int op,
                         double divisor, char *acc) {
    size_t item = type_size(t);
    size_t tile = TILE_BYTES / item;
    for (size_t start = 0; start < count; start += tile) {
        size_t m = count - start < tile ? count - start : tile;
        size_t off = start * item;
        memcpy(acc, srcs[0] + off, m * item);
        for (Py_ssize_t j = 1; j < nsrc; j++)
            step(t, acc, srcs[j] + off, m, op);
        if (op == OP_AVG) divide(t, acc, m, divisor);
        memcpy(dst + off, acc, m * item);
    }
}

static int check_type_op(int t, int op) {
    if (type_size(t) == 0 || op < OP_SUM || op > OP_AVG) {
        PyErr_SetString(PyExc_ValueError, "bad dtype or reduce op code");
        return -1;
    }
    return 0;
}

/* run_plan(plan, bases, dtype, op, divisor): execute one phase of compiled remote slices
 * (collectives/_backend.py). `plan` rows are (kind, src_rank, src_buf, src_off, dst_rank,
 * dst_buf, dst_off, nbytes); an address is bases[buf * n + rank] + offset, `bases` being the
 * (3, n) table of every member's buffers. Kinds:
 *   COPY   memcpy, skipped when source and destination are the same bytes (in place)
 *   GROUP  a reduction into the destination of `nbytes`, over the next `src_rank` SRC rows,
 *          in their order, in `dtype`, with `op` (avg: the sum divided by `divisor`)
 * Returns the bytes the skipped copies would have moved. */
enum { K_COPY = 0, K_GROUP = 1, K_SRC = 2 };
#define MAX_GROUP 4096

static PyObject *run_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) { PyErr_SetString(PyExc_TypeError, "run_plan(plan, bases, dtype, op, divisor)"); return NULL; }
    int t = (int)PyLong_AsLong(args[2]);
    int op = (int)PyLong_AsLong(args[3]);
    double divisor = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer pv, bv;
    if (get_table(args[0], &pv, 8) < 0) return NULL;
    if (get_table(args[1], &bv, 3) < 0) { PyBuffer_Release(&pv); return NULL; }
    const int64_t *p = (const int64_t *)pv.buf;
    const int64_t *b = (const int64_t *)bv.buf;
    Py_ssize_t rows = pv.len / 64, n = bv.len / 24;
    int64_t total = 0, skipped = 0;
    int reduces = 0;
    const char *err = NULL;
    /* validate every row before touching memory: a bad plan is a bug, never a crash */
    for (Py_ssize_t r = 0; r < rows && err == NULL; r++) {
        const int64_t *row = p + 8 * r;
        if (row[0] == K_GROUP) {
            reduces = 1;
            if (row[1] < 1 || row[1] > MAX_GROUP || r + row[1] >= rows) err = "a reduction group's source count";
            total += row[7] * (row[1] + 1);
        } else if (row[0] == K_COPY || row[0] == K_SRC) {
            if (row[1] < 0 || row[1] >= n || row[2] < 0 || row[2] > 2) err = "a source rank or buffer";
            total += row[7];
        } else {
            err = "a row kind";
        }
        if (row[0] != K_SRC && (row[4] < 0 || row[4] >= n || row[5] < 0 || row[5] > 2 || row[7] < 0))
            err = "a destination rank, buffer or size";
    }
    if (err == NULL && reduces && check_type_op(t, op) < 0) err = "";
    if (err != NULL) {
        PyBuffer_Release(&pv);
        PyBuffer_Release(&bv);
        if (!PyErr_Occurred()) PyErr_Format(PyExc_ValueError, "run_plan: bad plan: %s", err);
        return NULL;
    }
    size_t item = reduces ? type_size(t) : 1;
    char *acc = reduces ? PyMem_RawMalloc(TILE_BYTES + MAX_GROUP * sizeof(char *)) : NULL;
    if (reduces && acc == NULL) { PyBuffer_Release(&pv); PyBuffer_Release(&bv); return PyErr_NoMemory(); }
    const char **srcs = reduces ? (const char **)(acc + TILE_BYTES) : NULL;
    PyThreadState *ts = total >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
#define ADDR(rank, buf, off) ((char *)(uintptr_t)(b[(buf) * n + (rank)] + (off)))
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int64_t *row = p + 8 * r;
        char *dst = ADDR(row[4], row[5], row[6]);
        if (row[0] == K_COPY) {
            const char *src = ADDR(row[1], row[2], row[3]);
            if (dst == src) skipped += row[7];
            else if (row[7] > 0) memcpy(dst, src, (size_t)row[7]);
        } else if (row[0] == K_GROUP) {
            Py_ssize_t m = (Py_ssize_t)row[1];
            for (Py_ssize_t j = 0; j < m; j++) {
                const int64_t *s = p + 8 * (r + 1 + j);
                srcs[j] = ADDR(s[1], s[2], s[3]);
            }
            if (row[7] > 0) reduce_tiles(dst, srcs, m, (size_t)row[7] / item, t, op, divisor, acc);
            r += m;
        }
    }
#undef ADDR
    if (ts != NULL) PyEval_RestoreThread(ts);
    PyMem_RawFree(acc);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&bv);
    return PyLong_FromLongLong(skipped);
}

static PyMethodDef methods[] = {
    {"copy_many", copy_many, METH_O, "Execute rows of (dst, src, nbytes) copies."},
    {"run_plan", (PyCFunction)(void (*)(void))run_plan, METH_FASTCALL,
     "Execute one phase of compiled remote slices (collectives/_backend.py)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&moduledef); }
