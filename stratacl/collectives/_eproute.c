/*
 * Expert parallelism's per-call routing work (collectives/_ep.py), one pass each instead of a
 * dozen numpy passes over a few thousand entries: at 128 tokens of top-8 those passes, not the
 * bytes, were most of a dispatch's CPU.
 *
 *   count(topk_idx, experts, n, per_rank, per_expert)
 *                       check the routing (entries in [-1, experts), no expert twice in a row)
 *                       and count the tokens each member and each expert gets
 *   block(words, topk_idx, weights, head, n, experts, sent)
 *                       the sender's routing block (header, then records by destination)
 *   received(rec, sources, topk, me, local, cap, row, tids, idx, w, per_expert, slices)
 *                       a receiver's records: high-throughput (cap < 0) its local expert ids,
 *                       weights and per-expert counts; low-latency each (record, k)'s slot;
 *                       and the row copies of the dispatch, as slices
 *   slots(topk_idx, before, slots)
 *                       low-latency: each own (token, k)'s row in its expert's receive rows
 *   row_slices(me, n, peer, src_row, dst_row, row, slices)
 *                       row copies as slices: members after me first, runs merged
 *
 * Every array is the caller's (numpy, C-contiguous, of the dtype named in _ep.py); results are
 * written into them and the functions return counts. Layouts are the ones _ep.py documents,
 * element for element: the numpy code these replaced is in its tests' reference.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WEIGHT_WORDS 2

typedef struct {
    Py_buffer view[8];
    int held;
} Views;

static void release(Views *v) {
    for (int i = 0; i < v->held; i++) PyBuffer_Release(&v->view[i]);
    v->held = 0;
}

/* Borrow args[i]'s buffer (writable if asked) holding at least `min_bytes`; NULL on error. */
static void *borrow(Views *v, PyObject *arg, int writable, Py_ssize_t min_bytes, const char *what) {
    Py_buffer *b = &v->view[v->held];
    if (PyObject_GetBuffer(arg, b, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return NULL;
    v->held++;
    if (b->len < min_bytes) {
        PyErr_Format(PyExc_ValueError, "_eproute: %s holds %zd bytes, needs %zd", what, b->len, min_bytes);
        return NULL;
    }
    return b->buf;
}

static int ints(PyObject *const *args, Py_ssize_t first, Py_ssize_t count, int64_t *out) {
    for (Py_ssize_t i = 0; i < count; i++) {
        out[i] = PyLong_AsLongLong(args[first + i]);
        if (out[i] == -1 && PyErr_Occurred()) return -1;
    }
    return 0;
}

static int64_t record_words(int64_t k) { return 1 + k + (k + WEIGHT_WORDS - 1) / WEIGHT_WORDS; }

/* count(topk_idx [T, K] int64, experts, n, per_rank [n] int64 out, per_expert [E] int64 out) */
static PyObject *count(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t p[2];
    if (nargs != 5 || ints(args, 1, 2, p) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "count(topk_idx, experts, n, per_rank, per_expert)");
        return NULL;
    }
    int64_t experts = p[0], n = p[1];
    Views v = {.held = 0};
    Py_buffer *ib = &v.view[0];
    if (PyObject_GetBuffer(args[0], ib, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0) return NULL;
    v.held = 1;
    int64_t *per_rank = borrow(&v, args[3], 1, n * 8, "per_rank");
    int64_t *per_expert = per_rank ? borrow(&v, args[4], 1, experts * 8, "per_expert") : NULL;
    if (per_expert == NULL) { release(&v); return NULL; }
    const int64_t *idx = ib->buf;
    int64_t t_count = ib->ndim == 2 ? ib->shape[0] : 0, k = ib->ndim == 2 ? ib->shape[1] : 0;
    int64_t total = t_count * k, local = experts / n;
    for (int64_t i = 0; i < total; i++)
        if (idx[i] < -1 || idx[i] >= experts) {
            PyErr_Format(PyExc_ValueError, "expert index %lld is outside [-1, %lld)", (long long)idx[i],
                         (long long)experts);
            release(&v);
            return NULL;
        }
    int64_t *seen = malloc((size_t)(experts + n) * sizeof(int64_t));
    if (seen == NULL) { release(&v); return PyErr_NoMemory(); }
    int64_t *seen_rank = seen + experts;
    for (int64_t i = 0; i < experts + n; i++) seen[i] = -1;
    memset(per_rank, 0, (size_t)n * 8);
    memset(per_expert, 0, (size_t)experts * 8);
    int64_t twice = -1;
    for (int64_t t = 0; t < t_count && twice < 0; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e = idx[t * k + j];
            if (e < 0) continue;
            if (seen[e] == t) { twice = t; break; }
            seen[e] = t;
            per_expert[e]++;
            if (seen_rank[e / local] != t) { seen_rank[e / local] = t; per_rank[e / local]++; }
        }
    free(seen);
    release(&v);
    if (twice >= 0) {
        PyErr_Format(PyExc_ValueError, "token %lld picks the same expert twice", (long long)twice);
        return NULL;
    }
    Py_RETURN_NONE;
}

/* block(words int64 out, topk_idx [T, K], weights [T, K] float32, head [n + experts] (count's
 * per_rank, then per_expert), n, experts, sent out) -> words written: the header, then the
 * records by destination, each destination's in token order. `sent[r]`: record r's token. */
static PyObject *block(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t p[2];
    if (nargs != 7 || ints(args, 4, 2, p) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "block(words, topk_idx, weights, head, n, experts, sent)");
        return NULL;
    }
    int64_t n = p[0], experts = p[1], local = experts / n;
    Views v = {.held = 0};
    Py_buffer *ib = &v.view[0];
    if (PyObject_GetBuffer(args[1], ib, PyBUF_C_CONTIGUOUS | PyBUF_ND) < 0) return NULL;
    v.held = 1;
    int64_t t_count = ib->shape[0], k = ib->shape[1];
    const int64_t *per_rank = borrow(&v, args[3], 0, (n + experts) * 8, "head");
    if (per_rank == NULL) { release(&v); return NULL; }
    int64_t records = 0;
    for (int64_t d = 0; d < n; d++) records += per_rank[d];
    int64_t rw = record_words(k), head = n + experts, need = head + records * rw;
    int64_t *words = borrow(&v, args[0], 1, need * 8, "the routing block");
    const float *w = words ? borrow(&v, args[2], 0, t_count * k * 4, "topk_weights") : NULL;
    int64_t *sent = w ? borrow(&v, args[6], 1, records * 8, "sent") : NULL;
    int64_t *next = sent ? malloc((size_t)(2 * n) * sizeof(int64_t)) : NULL;
    if (next == NULL) {
        release(&v);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    int64_t *seen_rank = next + n;
    memcpy(words, per_rank, (size_t)(n + experts) * 8);
    for (int64_t d = 0, at = 0; d < n; d++) { next[d] = at; at += per_rank[d]; seen_rank[d] = -1; }
    int64_t *rec = words + head;
    for (int64_t t = 0; t < t_count; t++)
        for (int64_t j = 0; j < k; j++) {
            int64_t e = ((const int64_t *)ib->buf)[t * k + j];
            if (e < 0 || seen_rank[e / local] == t) continue;
            seen_rank[e / local] = t;
            int64_t r = next[e / local]++;
            int64_t *out = rec + r * rw;
            out[0] = t;
            memcpy(out + 1, (const int64_t *)ib->buf + t * k, (size_t)k * 8);
            memset(out + 1 + k, 0, (size_t)(rw - 1 - k) * 8);
            memcpy(out + 1 + k, w + t * k, (size_t)k * 4);
            sent[r] = t;
        }
    free(next);
    release(&v);
    return PyLong_FromLongLong(need);
}

/* Slices of row copies, runs of consecutive rows of one peer merged: (peer, src, dst, bytes). */
typedef struct {
    int64_t *out;
    int64_t count, row;
} Slices;

static void add_row(Slices *s, int64_t peer, int64_t src, int64_t dst) {
    if (s->count) {
        int64_t *last = s->out + (s->count - 1) * 4;
        if (last[0] == peer && last[1] + last[3] == src * s->row && last[2] + last[3] == dst * s->row) {
            last[3] += s->row;
            return;
        }
    }
    int64_t *next = s->out + s->count * 4;
    next[0] = peer; next[1] = src * s->row; next[2] = dst * s->row; next[3] = s->row;
    s->count++;
}

/* received(rec int64, sources [n] int64 (records from each member), topk, me, local, cap, row,
 *          tids [R] out, idx [R, K] int64 out, w [R, K] float32 out, per_expert [local] out,
 *          slices [R * K, 4] int64 out) -> slices written
 * High-throughput (cap < 0): idx the local expert ids (-1 where the expert is elsewhere), w
 * their weights (0 there), per_expert the (record, k) pairs per local expert; slices copy
 * source p's row tids[r] to row r. Low-latency: per_expert the rows each local expert gets,
 * idx each (record, k)'s destination row e * cap + slot (-1: elsewhere), slots counted sources
 * ascending, records in order; slices copy (record, k) pairs in that order. Slices list the
 * members after me first, as _ep.rows. */
static PyObject *received(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t p[5];
    if (nargs != 12 || ints(args, 2, 5, p) < 0) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_TypeError, "received(rec, sources, topk, me, local, cap, row, tids, idx, w, "
                                             "per_expert, slices)");
        return NULL;
    }
    int64_t k = p[0], me = p[1], local = p[2], cap = p[3], row = p[4];
    Views v = {.held = 0};
    Py_buffer *sb = &v.view[0];
    if (PyObject_GetBuffer(args[1], sb, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    v.held = 1;
    const int64_t *sources = sb->buf;
    int64_t n = sb->len / 8, records = 0;
    for (int64_t q = 0; q < n; q++) records += sources[q];
    int64_t rw = record_words(k);
    const int64_t *rec = borrow(&v, args[0], 0, records * rw * 8, "the records");
    int64_t *tids = rec ? borrow(&v, args[7], 1, records * 8, "tids") : NULL;
    int64_t *idx = tids ? borrow(&v, args[8], 1, records * k * 8, "idx") : NULL;
    float *w = idx ? borrow(&v, args[9], 1, records * k * 4, "w") : NULL;
    int64_t *per_expert = w ? borrow(&v, args[10], 1, local * 8, "per_expert") : NULL;
    int64_t *out = per_expert ? borrow(&v, args[11], 1, records * (cap < 0 ? 1 : k) * 32, "slices") : NULL;
    int64_t *start = out ? malloc((size_t)(n + 1) * sizeof(int64_t)) : NULL;
    if (start == NULL) {
        release(&v);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    memset(per_expert, 0, (size_t)local * 8);
    start[0] = 0;
    for (int64_t q = 0; q < n; q++) start[q + 1] = start[q] + sources[q];
    int64_t lo = me * local, hi = lo + local;
    for (int64_t r = 0; r < records; r++) {
        const int64_t *one = rec + r * rw;
        const float *weight = (const float *)(one + 1 + k);
        tids[r] = one[0];
        for (int64_t j = 0; j < k; j++) {
            int64_t e = one[1 + j];
            int here = e >= lo && e < hi;
            if (cap < 0) {
                idx[r * k + j] = here ? e - lo : -1;
                w[r * k + j] = here ? weight[j] : 0.0f;
            } else
                idx[r * k + j] = here ? (e - lo) * cap + per_expert[e - lo] : -1;
            if (here) per_expert[e - lo]++;
        }
    }
    Slices s = {out, 0, row};
    for (int64_t i = 1; i <= n; i++) {
        int64_t q = (me + i) % n;
        for (int64_t r = start[q]; r < start[q + 1]; r++) {
            if (cap < 0) { add_row(&s, q, tids[r], r); continue; }
            for (int64_t j = 0; j < k; j++)
                if (idx[r * k + j] >= 0) add_row(&s, q, tids[r], idx[r * k + j]);
        }
    }
    free(start);
    release(&v);
    return PyLong_FromLongLong(s.count);
}

/* slots(topk_idx [T, K], before [E] int64, slots [T, K] int64 out): before[e] plus the earlier
 * (token, k) pairs of e, in row-major order; -1 where no expert. */
static PyObject *slots(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "slots(topk_idx, before, slots)"); return NULL; }
    Views v = {.held = 0};
    Py_buffer *ib = &v.view[0];
    if (PyObject_GetBuffer(args[0], ib, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    v.held = 1;
    int64_t total = ib->len / 8;
    Py_buffer *bb = &v.view[1];
    if (PyObject_GetBuffer(args[1], bb, PyBUF_C_CONTIGUOUS) < 0) { release(&v); return NULL; }
    v.held = 2;
    int64_t experts = bb->len / 8;
    int64_t *out = borrow(&v, args[2], 1, total * 8, "slots");
    int64_t *next = out ? malloc((size_t)(experts ? experts : 1) * sizeof(int64_t)) : NULL;
    if (next == NULL) {
        release(&v);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    memcpy(next, bb->buf, (size_t)experts * 8);
    const int64_t *idx = ib->buf;
    for (int64_t i = 0; i < total; i++) {
        int64_t e = idx[i];
        out[i] = e >= 0 && e < experts ? next[e]++ : -1;
    }
    free(next);
    release(&v);
    Py_RETURN_NONE;
}

/* row_slices(me, n, peer [J], src_row [J], dst_row [J], row, slices [J, 4] out) -> slices
 * written: members after me first, each member's rows in the order given, runs merged. */
static PyObject *row_slices(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t p[2], row;
    if (nargs != 7 || ints(args, 0, 2, p) < 0 || ints(args, 5, 1, &row) < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "row_slices(me, n, peer, src_row, dst_row, row, slices)");
        return NULL;
    }
    int64_t me = p[0], n = p[1];
    Views v = {.held = 0};
    Py_buffer *pb = &v.view[0];
    if (PyObject_GetBuffer(args[2], pb, PyBUF_C_CONTIGUOUS) < 0) return NULL;
    v.held = 1;
    int64_t rows = pb->len / 8;
    const int64_t *peer = pb->buf;
    const int64_t *src = borrow(&v, args[3], 0, rows * 8, "src_row");
    const int64_t *dst = src ? borrow(&v, args[4], 0, rows * 8, "dst_row") : NULL;
    int64_t *out = dst ? borrow(&v, args[6], 1, rows * 32, "slices") : NULL;
    /* a stable counting sort by (peer - me - 1) mod n */
    int64_t *at = out ? malloc((size_t)(n + 1 + rows) * sizeof(int64_t)) : NULL;
    if (at == NULL) {
        release(&v);
        return PyErr_Occurred() ? NULL : PyErr_NoMemory();
    }
    int64_t *order = at + n + 1;
    memset(at, 0, (size_t)(n + 1) * 8);
    for (int64_t j = 0; j < rows; j++) {
        if (peer[j] < 0 || peer[j] >= n) {
            free(at);
            release(&v);
            PyErr_SetString(PyExc_ValueError, "row_slices: a peer is outside the communicator");
            return NULL;
        }
        at[((peer[j] - me - 1) % n + n) % n + 1]++;
    }
    for (int64_t b = 0; b < n; b++) at[b + 1] += at[b];
    for (int64_t j = 0; j < rows; j++) order[at[((peer[j] - me - 1) % n + n) % n]++] = j;
    Slices s = {out, 0, row};
    for (int64_t i = 0; i < rows; i++) add_row(&s, peer[order[i]], src[order[i]], dst[order[i]]);
    free(at);
    release(&v);
    return PyLong_FromLongLong(s.count);
}

static PyMethodDef methods[] = {
    {"count", (PyCFunction)(void (*)(void))count, METH_FASTCALL,
     "Check a routing and count the tokens per member and per expert."},
    {"block", (PyCFunction)(void (*)(void))block, METH_FASTCALL, "Write a sender's routing block."},
    {"received", (PyCFunction)(void (*)(void))received, METH_FASTCALL,
     "A receiver's records: local expert ids, weights or slots, counts, and the row copies."},
    {"slots", (PyCFunction)(void (*)(void))slots, METH_FASTCALL, "Low-latency receive slots of own (token, k)."},
    {"row_slices", (PyCFunction)(void (*)(void))row_slices, METH_FASTCALL, "Row copies as merged slices."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_eproute", NULL, -1, methods};

/* The record layout's one constant, exported: collectives/_ep.py reads it from here. */
PyMODINIT_FUNC PyInit__eproute(void) {
    PyObject *m = PyModule_Create(&moduledef);
    if (m != NULL && PyModule_AddIntConstant(m, "WEIGHT_WORDS", WEIGHT_WORDS) < 0) Py_CLEAR(m);
    return m;
}
