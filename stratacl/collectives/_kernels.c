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
 *
 * How bytes are written: a phase whose writes, over all members of the communicator, add up to
 * more than the last-level cache cannot keep its destinations in cache, so it writes them with
 * streaming (non-temporal) stores, which skip reading each destination line before
 * overwriting it. On the 2-core hosts this project is measured on, that copies out-of-cache
 * working sets 1.2-1.8x faster than memcpy; in cache memcpy is faster (docs/performance.md).
 * A phase whose members all read the same sources (COPY_SHARED rows: broadcast, all_gather)
 * has more to lose: ordinary stores evict the shared source from a core's cache before the
 * next reader there gets to it. Where the last-level cache is not this VM's to count on, such
 * a phase streams once its writes pass the cores' private caches.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "_kernels.h"

#define TILE_BYTES (64 * 1024)
#define RELEASE_GIL_BYTES (256 * 1024)

/* ---- copies ---------------------------------------------------------------------------- */
#define STREAM_MIN_BYTES 4096          /* below this a streaming copy does not pay its fence */
static size_t stream_footprint = (size_t)32 << 20;   /* set from the cache size at import */
/* The same for phases whose sources every member reads (COPY_SHARED rows): set at import to
 * the cores' private caches where the last-level cache had to be capped (see below). */
static size_t shared_stream_footprint = (size_t)32 << 20;
static int have_avx2;

#if defined(__x86_64__)
/* `n` a multiple of 64, `d` 64-byte aligned */
__attribute__((target("avx2"))) static void stream_avx2(char *d, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += 64) {
        __m256i a = _mm256_loadu_si256((const __m256i *)(s + i));
        __m256i b = _mm256_loadu_si256((const __m256i *)(s + i + 32));
        _mm256_stream_si256((__m256i *)(d + i), a);
        _mm256_stream_si256((__m256i *)(d + i + 32), b);
    }
}

static void stream_sse2(char *d, const char *s, size_t n) {
    for (size_t i = 0; i < n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(s + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(s + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(s + i + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(s + i + 48));
        _mm_stream_si128((__m128i *)(d + i), a);
        _mm_stream_si128((__m128i *)(d + i + 16), b);
        _mm_stream_si128((__m128i *)(d + i + 32), c);
        _mm_stream_si128((__m128i *)(d + i + 48), e);
    }
}
#endif

/* How many CPUs a sysfs cpu list ("0-3,8-11") names; 0 when it cannot be read. */
static long cpus_in_list(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    long count = 0, a, b;
    int c;
    while (fscanf(f, "%ld", &a) == 1) {
        b = a;
        c = fgetc(f);
        if (c == '-') {
            if (fscanf(f, "%ld", &b) != 1) break;
            c = fgetc(f);
        }
        if (b >= a) count += b - a + 1;
        if (c != ',') break;
    }
    fclose(f);
    return count;
}

/* The most last-level cache a core is credited with. A virtual machine may be shown its host's
 * whole L3 (480 MiB for 2 vCPUs on an Intel host seen here), most of which other tenants' cores
 * use: there, copies beyond the private L2 already run at memory speed, and streaming stores
 * make 16 MiB all_to_all and broadcast at N = 8 1.5-1.9x faster (docs/performance.md). No
 * server part gives a core much more than 12 MiB of L3 (AMD's stacked-cache parts). */
#define LLC_PER_CORE_MAX ((size_t)16 << 20)

/* A cache size file of sysfs ("2048K", "480M"), in bytes; 0 when it cannot be read. */
static size_t sysfs_cache_size(const char *path) {
    FILE *f = fopen(path, "r");
    if (f == NULL) return 0;
    unsigned long v = 0;
    char unit = 0;
    int got = fscanf(f, "%lu%c", &v, &unit);
    fclose(f);
    if (got < 1) return 0;
    return (size_t)v << (unit == 'K' ? 10 : unit == 'M' ? 20 : unit == 'G' ? 30 : 0);
}

#define CACHE_DIR "/sys/devices/system/cpu/cpu0/cache/"

/* The last-level cache as the kernel describes it (sysfs, what lscpu prints), else glibc's
 * figure, else 0. Virtual machines can report the whole package's L3 through cpuid (glibc)
 * while sysfs has the slice this VM's cores share: sysfs first. */
static size_t last_level_cache(void) {
    size_t llc = sysfs_cache_size(CACHE_DIR "index3/size");
#ifdef _SC_LEVEL3_CACHE_SIZE
    if (llc == 0) {
        long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
        if (l3 > 0) llc = (size_t)l3;
    }
#endif
    return llc;
}

/* Copy n bytes; `stream`: with non-temporal stores where the host has them. Streaming stores
 * are weakly ordered: the fence makes them visible before any later store (a completion flag). */
static void copy_bytes(char *dst, const char *src, size_t n, int stream) {
#if defined(__x86_64__)
    if (stream && n >= STREAM_MIN_BYTES) {
        size_t head = (64 - ((uintptr_t)dst & 63)) & 63;
        memcpy(dst, src, head);
        size_t body = (n - head) & ~(size_t)63;
        if (have_avx2) stream_avx2(dst + head, src + head, body);
        else stream_sse2(dst + head, src + head, body);
        memcpy(dst + head + body, src + head + body, n - head - body);
        _mm_sfence();
        return;
    }
#endif
    memcpy(dst, src, n);
}


static int get_table(PyObject *obj, Py_buffer *view, Py_ssize_t cols) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) < 0) return -1;
    if (view->itemsize != 8 || (view->len / 8) % cols != 0) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "expected a C-contiguous int64 array with %zd columns", cols);
        return -1;
    }
    return 0;
}

/* copy_many(table, stream=-1): rows of (dst, src, nbytes), one copy each; stream 1: with
 * streaming stores, 0: without, -1: when the rows' bytes reach the cache-bypass footprint */
static PyObject *copy_many(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs < 1 || nargs > 2) { PyErr_SetString(PyExc_TypeError, "copy_many(table, stream=-1)"); return NULL; }
    long stream = nargs == 2 ? PyLong_AsLong(args[1]) : -1;
    if (stream == -1 && PyErr_Occurred()) return NULL;
    Py_buffer view;
    if (get_table(args[0], &view, 3) < 0) return NULL;
    const int64_t *t = (const int64_t *)view.buf;
    Py_ssize_t rows = view.len / 24;
    int64_t total = 0;
    for (Py_ssize_t r = 0; r < rows; r++) total += t[3 * r + 2] > 0 ? t[3 * r + 2] : 0;
    if (stream < 0) stream = (size_t)total >= stream_footprint;
    /* releasing the GIL costs microseconds: only worth it when the copies take longer */
    PyThreadState *ts = total >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    for (Py_ssize_t r = 0; r < rows; r++) {
        if (t[3 * r + 2] > 0)
            copy_bytes((char *)(uintptr_t)t[3 * r], (const char *)(uintptr_t)t[3 * r + 1], (size_t)t[3 * r + 2],
                       (int)stream);
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
                         double divisor, char *acc, int stream) {
    size_t item = type_size(t);
    size_t tile = TILE_BYTES / item;
    for (size_t start = 0; start < count; start += tile) {
        size_t m = count - start < tile ? count - start : tile;
        size_t off = start * item;
        memcpy(acc, srcs[0] + off, m * item);
        for (Py_ssize_t j = 1; j < nsrc; j++)
            step(t, acc, srcs[j] + off, m, op);
        if (op == OP_AVG) divide(t, acc, m, divisor);
        copy_bytes(dst + off, acc, m * item, stream);
    }
}

#define MAX_GROUP 4096

/* Check a plan against `n` members, then execute it (see run_plan below). Needs no GIL: the
 * caller decides whether to hold it. Returns NULL on success, else what was wrong. */
static const char *execute_plan(const int64_t *p, Py_ssize_t rows, const int64_t *b, Py_ssize_t n, int t, int op,
                                double divisor, int64_t *skipped_out) {
    int reduces = 0, shared = 0;
    /* validate every row before touching memory: a bad plan is a bug, never a crash */
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int64_t *row = p + PLAN_COLUMNS * r;
        if (row[COL_KIND] == K_GROUP) {
            reduces = 1;
            if (row[COL_SRC_RANK] < 1 || row[COL_SRC_RANK] > MAX_GROUP || r + row[COL_SRC_RANK] >= rows)
                return "a reduction group's source count";
        } else if (row[COL_KIND] == K_COPY || row[COL_KIND] == K_SRC || row[COL_KIND] == K_COPY_SHARED) {
            if (row[COL_SRC_RANK] < 0 || row[COL_SRC_RANK] >= n || row[COL_SRC_BUF] < 0 || row[COL_SRC_BUF] >= BUFFERS)
                return "a source rank or buffer";
            shared |= row[COL_KIND] == K_COPY_SHARED;
        } else {
            return "a row kind";
        }
        if (row[COL_KIND] != K_SRC && (row[COL_DST_RANK] < 0 || row[COL_DST_RANK] >= n || row[COL_DST_BUF] < 0 ||
                                       row[COL_DST_BUF] >= BUFFERS || row[COL_BYTES] < 0))
            return "a destination rank, buffer or size";
    }
    if (reduces && (type_size(t) == 0 || op < OP_SUM || op > OP_AVG)) return "bad dtype or reduce op code";
    /* every member writes about as much in a phase as this one: together, do they overflow the cache? */
    size_t written = 0;
    for (Py_ssize_t r = 0; r < rows; r++)
        if (p[PLAN_COLUMNS * r + COL_KIND] != K_SRC) written += (size_t)p[PLAN_COLUMNS * r + COL_BYTES];
    int stream = written * (size_t)n >= (shared ? shared_stream_footprint : stream_footprint);
    size_t item = reduces ? type_size(t) : 1;
    char *acc = reduces ? malloc(TILE_BYTES + MAX_GROUP * sizeof(char *)) : NULL;
    if (reduces && acc == NULL) return "out of memory for the reduction tile";
    const char **srcs = reduces ? (const char **)(acc + TILE_BYTES) : NULL;
    int64_t skipped = 0;
#define ADDR(rank, buf, off) ((char *)(uintptr_t)(b[(buf) * n + (rank)] + (off)))
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int64_t *row = p + PLAN_COLUMNS * r;
        char *dst = ADDR(row[COL_DST_RANK], row[COL_DST_BUF], row[COL_DST_OFF]);
        int64_t nbytes = row[COL_BYTES];
        if (row[COL_KIND] == K_COPY || row[COL_KIND] == K_COPY_SHARED) {
            const char *src = ADDR(row[COL_SRC_RANK], row[COL_SRC_BUF], row[COL_SRC_OFF]);
            if (dst == src) skipped += nbytes;
            else if (nbytes > 0) copy_bytes(dst, src, (size_t)nbytes, stream);
        } else if (row[COL_KIND] == K_GROUP) {
            Py_ssize_t m = (Py_ssize_t)row[COL_SRC_RANK];
            for (Py_ssize_t j = 0; j < m; j++) {
                const int64_t *s = p + PLAN_COLUMNS * (r + 1 + j);
                srcs[j] = ADDR(s[COL_SRC_RANK], s[COL_SRC_BUF], s[COL_SRC_OFF]);
            }
            if (nbytes > 0) reduce_tiles(dst, srcs, m, (size_t)nbytes / item, t, op, divisor, acc, stream);
            r += m;
        }
    }
#undef ADDR
    free(acc);
    *skipped_out = skipped;
    return NULL;
}

/* run_plan(plan, bases, dtype, op, divisor): execute one phase of compiled remote slices
 * (collectives/_backend.py). `plan` rows are PLAN_COLUMNS words (kind, src_rank, src_buf, src_off,
 * dst_rank, dst_buf, dst_off, nbytes: COL_*); an address is bases[buf * n + rank] + offset,
 * `bases` being the (BUFFERS, n) table of every member's buffers. Kinds:
 *   COPY   memcpy, skipped when source and destination are the same bytes (in place)
 *   COPY_SHARED  a COPY from a source every member of the phase reads (broadcast, all_gather):
 *          such a phase streams its writes from `shared_stream_footprint`
 *   GROUP  a reduction into the destination of `nbytes`, over the next `src_rank` SRC rows,
 *          in their order, in `dtype`, with `op` (avg: the sum divided by `divisor`)
 * Returns the bytes the skipped copies would have moved. */
static PyObject *run_plan(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) { PyErr_SetString(PyExc_TypeError, "run_plan(plan, bases, dtype, op, divisor)"); return NULL; }
    int t = (int)PyLong_AsLong(args[2]);
    int op = (int)PyLong_AsLong(args[3]);
    double divisor = PyFloat_AsDouble(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer pv, bv;
    if (get_table(args[0], &pv, PLAN_COLUMNS) < 0) return NULL;
    if (get_table(args[1], &bv, BUFFERS) < 0) { PyBuffer_Release(&pv); return NULL; }
    const int64_t *p = (const int64_t *)pv.buf;
    Py_ssize_t rows = pv.len / (8 * PLAN_COLUMNS);
    int64_t total = 0, skipped = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int64_t *row = p + PLAN_COLUMNS * r;
        total += row[COL_BYTES] * (row[COL_KIND] == K_GROUP ? row[COL_SRC_RANK] + 1 : 1);
    }
    const char *err;
    PyThreadState *ts = total >= RELEASE_GIL_BYTES ? PyEval_SaveThread() : NULL;
    err = execute_plan(p, rows, (const int64_t *)bv.buf, bv.len / (8 * BUFFERS), t, op, divisor, &skipped);
    if (ts != NULL) PyEval_RestoreThread(ts);
    PyBuffer_Release(&pv);
    PyBuffer_Release(&bv);
    if (err != NULL) {
        PyErr_Format(PyExc_ValueError, "run_plan: bad plan: %s", err);
        return NULL;
    }
    return PyLong_FromLongLong(skipped);
}

/* The rows' loop of combine: acc[token[r]] += w[r] * rows[r] (or + rows[r]), float32, each
 * product rounded and then each sum (no fused multiply-add). The float16 conversions are exact
 * (float32 holds every float16), and the cast back rounds to nearest even either way, so the
 * vector form below gives the same bits as this one. */
static void combine_rows(float *acc, const void *rows, const int64_t *tok, const float *w,
                         Py_ssize_t nrows, Py_ssize_t hidden, int half) {
    for (Py_ssize_t r = 0; r < nrows; r++) {
        if (tok[r] < 0) continue;
        float *a = acc + tok[r] * hidden;
        float wr = w ? w[r] : 1.0f;
        if (half) {
            const _Float16 *x = (const _Float16 *)rows + r * hidden;
            if (w) for (Py_ssize_t i = 0; i < hidden; i++) { float m = wr * (float)x[i]; a[i] = a[i] + m; }
            else for (Py_ssize_t i = 0; i < hidden; i++) a[i] = a[i] + (float)x[i];
        } else {
            const float *x = (const float *)rows + r * hidden;
            if (w) for (Py_ssize_t i = 0; i < hidden; i++) { float m = wr * x[i]; a[i] = a[i] + m; }
            else for (Py_ssize_t i = 0; i < hidden; i++) a[i] = a[i] + x[i];
        }
    }
}

static void combine_cast(_Float16 *o, const float *acc, Py_ssize_t n) {
    for (Py_ssize_t i = 0; i < n; i++) o[i] = (_Float16)acc[i];
}

#if defined(__x86_64__)
/* The same, 8 lanes at a time with AVX2 and F16C (GCC 12 keeps the loop above scalar: one
 * conversion per element). */
__attribute__((target("avx2,f16c"))) static void combine_rows_avx2(
        float *acc, const void *rows, const int64_t *tok, const float *w, Py_ssize_t nrows, Py_ssize_t hidden,
        int half) {
    for (Py_ssize_t r = 0; r < nrows; r++) {
        if (tok[r] < 0) continue;
        float *a = acc + tok[r] * hidden;
        __m256 wv = _mm256_set1_ps(w ? w[r] : 1.0f);
        const _Float16 *xh = (const _Float16 *)rows + r * hidden;
        const float *xf = (const float *)rows + r * hidden;
        Py_ssize_t i = 0;
        for (; i + 8 <= hidden; i += 8) {
            __m256 x = half ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(xh + i))) : _mm256_loadu_ps(xf + i);
            if (w) x = _mm256_mul_ps(wv, x);
            _mm256_storeu_ps(a + i, _mm256_add_ps(_mm256_loadu_ps(a + i), x));
        }
        for (; i < hidden; i++) {
            float x = half ? (float)xh[i] : xf[i];
            if (w) { float m = w[r] * x; a[i] = a[i] + m; }
            else a[i] = a[i] + x;
        }
    }
}

__attribute__((target("avx2,f16c"))) static void combine_cast_avx2(_Float16 *o, const float *acc, Py_ssize_t n) {
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(o + i), _mm256_cvtps_ph(_mm256_loadu_ps(acc + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) o[i] = (_Float16)acc[i];
}
#endif

/* MoE combine's reduction (ep/_buffer.py): out[t] = cast(0 + w_0 * rows[r_0] + w_1 * rows[r_1] ...),
 * over the rows r with token[r] == t in their order, in float32 (each product rounded, then each
 * sum: no fused multiply-add, as numpy computes w * x and then acc + that); weights None: the
 * rows themselves. token[r] < 0 skips row r. Rows and out are float16 or float32 (the same).
 * `acc` is the caller's float32 scratch of at least tokens x hidden elements: a buffer kept
 * across calls, whose pages are already there (a fresh one each call costs a page fault per
 * 4 KiB, more than the sums at a few hundred rows). */
static PyObject *combine(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "combine(out, rows, token, weight_or_None, dtype, acc)");
        return NULL;
    }
    int t = (int)PyLong_AsLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    if (t != T_F16 && t != T_F32) { PyErr_SetString(PyExc_ValueError, "combine: float16 or float32 only"); return NULL; }
    Py_buffer ov, rv, tv, av, wv = {0};
    if (PyObject_GetBuffer(args[0], &ov, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE | PyBUF_FORMAT) < 0) return NULL;
    if (PyObject_GetBuffer(args[1], &rv, PyBUF_C_CONTIGUOUS) < 0) { PyBuffer_Release(&ov); return NULL; }
    if (PyObject_GetBuffer(args[2], &tv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&ov); PyBuffer_Release(&rv); return NULL;
    }
    if (PyObject_GetBuffer(args[5], &av, PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) < 0) {
        PyBuffer_Release(&ov); PyBuffer_Release(&rv); PyBuffer_Release(&tv); return NULL;
    }
    int weighted = args[3] != Py_None;
    if (weighted && PyObject_GetBuffer(args[3], &wv, PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&ov); PyBuffer_Release(&rv); PyBuffer_Release(&tv); PyBuffer_Release(&av); return NULL;
    }
    size_t item = type_size(t);
    Py_ssize_t nrows = tv.len / 8;
    Py_ssize_t hidden = ov.ndim == 2 ? ov.shape[1] : -1;
    Py_ssize_t tokens = ov.ndim == 2 ? ov.shape[0] : 0;
    Py_ssize_t total = tokens * (hidden > 0 ? hidden : 0);
    const char *err = NULL;
    if (hidden < 0 || ov.itemsize != (Py_ssize_t)item || rv.len != nrows * hidden * (Py_ssize_t)item)
        err = "out must be [tokens, hidden] and rows [rows, hidden], of the dtype";
    else if (weighted && wv.len != nrows * 4)
        err = "weights must be one float32 per row";
    else if (av.len < total * (Py_ssize_t)sizeof(float))
        err = "acc must hold tokens x hidden float32";
    const int64_t *tok = (const int64_t *)tv.buf;
    for (Py_ssize_t r = 0; err == NULL && r < nrows; r++)
        if (tok[r] >= tokens) err = "a row's token is out of range";
    if (err == NULL) {
        float *acc = av.buf;
        const float *w = weighted ? (const float *)wv.buf : NULL;
        int half = t == T_F16;
        Py_BEGIN_ALLOW_THREADS
        memset(acc, 0, (size_t)total * sizeof(float));
#if defined(__x86_64__)
        if (__builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx2")) {
            combine_rows_avx2(acc, rv.buf, tok, w, nrows, hidden, half);
            if (half) combine_cast_avx2(ov.buf, acc, total);
        } else
#endif
        {
            combine_rows(acc, rv.buf, tok, w, nrows, hidden, half);
            if (half) combine_cast(ov.buf, acc, total);
        }
        if (!half && total) memcpy(ov.buf, acc, (size_t)total * sizeof(float));
        Py_END_ALLOW_THREADS
    }
    PyBuffer_Release(&ov); PyBuffer_Release(&rv); PyBuffer_Release(&tv); PyBuffer_Release(&av);
    if (weighted) PyBuffer_Release(&wv);
    if (err != NULL) { PyErr_Format(PyExc_ValueError, "combine: %s", err); return NULL; }
    Py_RETURN_NONE;
}

static const StrataKernelsApi api = {execute_plan};

/* Read, and with an argument >= 0 set, one of the footprints: returns the old value. */
static PyObject *footprint_setting(size_t *which, const char *usage, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs > 1) { PyErr_SetString(PyExc_TypeError, usage); return NULL; }
    long long v = nargs ? PyLong_AsLongLong(args[0]) : -1;
    if (v == -1 && PyErr_Occurred()) return NULL;
    size_t old = *which;
    if (v >= 0) *which = (size_t)v;
    return PyLong_FromSize_t(old);
}

/* stream_footprint(bytes=-1) -> the footprint from which phases write with streaming stores;
 * bytes >= 0 sets it (tests, experiments: 0 streams every copy of 4 KiB or more). */
static PyObject *set_stream_footprint(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return footprint_setting(&stream_footprint, "stream_footprint(bytes=-1)", args, nargs);
}

/* shared_stream_footprint(bytes=-1) -> the same for phases with COPY_SHARED rows. */
static PyObject *set_shared_stream_footprint(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    return footprint_setting(&shared_stream_footprint, "shared_stream_footprint(bytes=-1)", args, nargs);
}

static PyMethodDef methods[] = {
    {"combine", (PyCFunction)(void (*)(void))combine, METH_FASTCALL,
     "MoE combine's float32 reduction of rows into their tokens: combine(out, rows, token, weight_or_None, dtype, acc)."},
    {"copy_many", (PyCFunction)(void (*)(void))copy_many, METH_FASTCALL,
     "Execute rows of (dst, src, nbytes) copies (stream: 1 with streaming stores, 0 without, -1 by size)."},
    {"stream_footprint", (PyCFunction)(void (*)(void))set_stream_footprint, METH_FASTCALL,
     "The write footprint from which phases use streaming stores; an argument sets it, returns the old value."},
    {"shared_stream_footprint", (PyCFunction)(void (*)(void))set_shared_stream_footprint, METH_FASTCALL,
     "The same for phases whose sources every member reads; an argument sets it, returns the old value."},
    {"run_plan", (PyCFunction)(void (*)(void))run_plan, METH_FASTCALL,
     "Execute one phase of compiled remote slices (collectives/_backend.py)."},
    {NULL, NULL, 0, NULL},
};

/* Every enumerator of _kernels.h, exported under its own name: Python's one source for them. */
#define CONSTANT(name) {#name, name}
static const struct { const char *name; long value; } constants[] = {
    CONSTANT(T_BOOL), CONSTANT(T_U8), CONSTANT(T_I8), CONSTANT(T_I16), CONSTANT(T_I32), CONSTANT(T_I64),
    CONSTANT(T_F16), CONSTANT(T_F32), CONSTANT(T_F64), CONSTANT(T_U16), CONSTANT(T_U32), CONSTANT(T_U64),
    CONSTANT(OP_SUM), CONSTANT(OP_PROD), CONSTANT(OP_MIN), CONSTANT(OP_MAX), CONSTANT(OP_AVG),
    CONSTANT(K_COPY), CONSTANT(K_GROUP), CONSTANT(K_SRC), CONSTANT(K_COPY_SHARED),
    CONSTANT(COL_KIND), CONSTANT(COL_SRC_RANK), CONSTANT(COL_SRC_BUF), CONSTANT(COL_SRC_OFF), CONSTANT(COL_DST_RANK),
    CONSTANT(COL_DST_BUF), CONSTANT(COL_DST_OFF), CONSTANT(COL_BYTES), CONSTANT(PLAN_COLUMNS),
    CONSTANT(BUF_IN), CONSTANT(BUF_OUT), CONSTANT(BUF_SCRATCH), CONSTANT(BUFFERS),
    CONSTANT(CTR_LOCAL), CONSTANT(CTR_PULLED), CONSTANT(CTR_WRITTEN), CONSTANT(COUNTERS),
};
#undef CONSTANT

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) {
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) { Py_DECREF(m); return NULL; }
#if defined(__x86_64__)
    __builtin_cpu_init();
    have_avx2 = __builtin_cpu_supports("avx2");
#endif
    size_t llc = last_level_cache();
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    long sharing = cpus_in_list(CACHE_DIR "index3/shared_cpu_list");
    if (sharing <= 0) sharing = cpus;
    int capped = sharing > 0 && llc > (size_t)sharing * LLC_PER_CORE_MAX;
    if (capped) llc = (size_t)sharing * LLC_PER_CORE_MAX;
    if (llc > 0) stream_footprint = llc;
    shared_stream_footprint = stream_footprint;
    /* Where the reported L3 could not be believed, a source all readers share is safe only in
     * the cores' private caches: ordinary stores there evict it before the next reader on the
     * core gets to it, streaming stores leave it (docs/performance.md). */
    size_t l2 = sysfs_cache_size(CACHE_DIR "index2/size") * (size_t)(cpus > 0 ? cpus : 0);
    if (capped && l2 > 0 && l2 < shared_stream_footprint) shared_stream_footprint = l2;
    /* the executor for other native modules (runtime/_native.c runs point-to-point plans) */
    PyObject *cap = PyCapsule_New((void *)&api, STRATA_KERNELS_CAPSULE, NULL);
    if (cap == NULL || PyModule_AddObject(m, "_C_API", cap) < 0) {
        Py_XDECREF(cap);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
