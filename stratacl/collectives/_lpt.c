/*
 * The balanced partitioner's scheduling loop (collectives/_partition.py, ``balanced``): LPT list
 * scheduling of transfer units onto communication cores under a per-stripe fan-out cap.
 *
 *   lpt(order, cost, peer, cap, cores, core, slot, stripe)
 *
 * `order` is the units in scheduling order (a permutation of 0..U-1), `cost` their modeled
 * cost (float64), `peer` their peer as a dense index in [0, U), `cap` their fan-out cap (>= 1);
 * the results are written into the caller's int64 arrays `core`, `slot`, `stripe`.
 *
 * It is the Python loop it replaced, step for step, so policies are identical element for
 * element: a binary min-heap of (load, core, next stripe, next slot) with heapq's sift
 * algorithm and Python's tuple order (a NaN load compares neither below nor above anything,
 * as in Python); the popped core takes the first pending unit whose (stripe, peer) has fewer
 * than its cap cores, looking at most 4 x cores + 2 units deep, else moves to its next stripe;
 * taking a unit keeps the other pending units in order (a linked list). Cost per pop: the scan
 * (<= 4C + 2 fan-out lookups in a hash table of the (stripe, peer) pairs in use, at most U
 * entries) and O(log C) for the heap. The GIL stays held: a 1300-unit policy takes tens of us.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    double load;
    int64_t core, stripe, slot;
} Entry;

/* Python's (load, core, stripe, slot) < (...): the first unequal element decides */
static inline int entry_lt(const Entry *a, const Entry *b) {
    if (!(a->load == b->load)) return a->load < b->load;
    if (a->core != b->core) return a->core < b->core;
    if (a->stripe != b->stripe) return a->stripe < b->stripe;
    return a->slot < b->slot;
}

/* heapq._siftdown / _siftup, verbatim, so pops come in the same order as heapq's */
static void sift_down(Entry *h, Py_ssize_t start, Py_ssize_t pos) {
    Entry item = h[pos];
    while (pos > start) {
        Py_ssize_t parent = (pos - 1) >> 1;
        if (!entry_lt(&item, &h[parent])) break;
        h[pos] = h[parent];
        pos = parent;
    }
    h[pos] = item;
}

static void sift_up(Entry *h, Py_ssize_t n, Py_ssize_t pos) {
    Py_ssize_t start = pos;
    Entry item = h[pos];
    Py_ssize_t child = 2 * pos + 1;
    while (child < n) {
        Py_ssize_t right = child + 1;
        if (right < n && !entry_lt(&h[child], &h[right])) child = right;
        h[pos] = h[child];
        pos = child;
        child = 2 * pos + 1;
    }
    h[pos] = item;
    sift_down(h, start, pos);
}

static Entry heap_pop(Entry *h, Py_ssize_t *n) {
    Entry last = h[--*n];
    if (*n == 0) return last;
    Entry top = h[0];
    h[0] = last;
    sift_up(h, *n, 0);
    return top;
}

static void heap_push(Entry *h, Py_ssize_t *n, Entry e) {
    h[(*n)++] = e;
    sift_down(h, 0, *n - 1);
}

/* fan-out counts of (stripe, peer), key stripe * U + peer; open addressing, linear probing.
 * Only pairs some core took a unit in are stored, so at most U keys in >= 2U slots. */
typedef struct {
    int64_t *key; /* -1: empty */
    int64_t *count;
    uint64_t mask;
} Fan;

static inline uint64_t fan_slot(const Fan *f, int64_t key) {
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull;
    return (h ^ (h >> 29)) & f->mask;
}

static inline int64_t fan_get(const Fan *f, int64_t key) {
    for (uint64_t i = fan_slot(f, key);; i = (i + 1) & f->mask) {
        if (f->key[i] == key) return f->count[i];
        if (f->key[i] < 0) return 0;
    }
}

static inline void fan_add(Fan *f, int64_t key) {
    uint64_t i = fan_slot(f, key);
    while (f->key[i] >= 0 && f->key[i] != key) i = (i + 1) & f->mask;
    f->key[i] = key;
    f->count[i] += 1;
}

/* the buffer of argument `name` as a C-contiguous array of `n` 8-byte items of kind 'i' (int64)
 * or 'f' (float64); n < 0: any length. ValueError otherwise. */
static int get_array(PyObject *obj, Py_buffer *view, const char *name, char kind, Py_ssize_t n, int writable) {
    int flags = PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, view, flags) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "lpt: %s must be a C-contiguous%s %s array, got %.100s", name,
                     writable ? " writable" : "", kind == 'f' ? "float64" : "int64", Py_TYPE(obj)->tp_name);
        return -1;
    }
    const char *fmt = view->format ? view->format : "B";
    if (*fmt == '@' || *fmt == '=' || (*fmt == '<' && PY_LITTLE_ENDIAN) || (*fmt == '>' && PY_BIG_ENDIAN)) fmt++;
    int ok = view->itemsize == 8 && fmt[0] != '\0' && fmt[1] == '\0' &&
             (kind == 'f' ? fmt[0] == 'd' : (fmt[0] == 'q' || (fmt[0] == 'l' && sizeof(long) == 8)));
    if (!ok) {
        PyErr_Format(PyExc_ValueError, "lpt: %s must be %s, got buffer format '%s' (itemsize %zd)", name,
                     kind == 'f' ? "float64" : "int64", view->format ? view->format : "B", view->itemsize);
        PyBuffer_Release(view);
        return -1;
    }
    if (n >= 0 && view->len / 8 != n) {
        PyErr_Format(PyExc_ValueError, "lpt: %s has %zd elements, expected %zd (one per unit)", name,
                     view->len / 8, n);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *lpt(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    static const char *names[] = {"order", "cost", "peer", "cap", "cores", "core", "slot", "stripe"};
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "lpt(order, cost, peer, cap, cores, core, slot, stripe) takes 8 arguments, "
                                      "got %zd", nargs);
        return NULL;
    }
    Py_ssize_t cores = PyNumber_AsSsize_t(args[4], NULL); /* out of range: clipped, then refused below */
    if (cores == -1 && PyErr_Occurred()) return NULL;
    if (cores < 1 || cores > PY_SSIZE_T_MAX / (Py_ssize_t)(8 * sizeof(Entry))) {
        PyErr_Format(PyExc_ValueError, "lpt: cores must be >= 1 (and fit in memory), got %S", args[4]);
        return NULL;
    }
    Py_buffer v[8];
    int got = 0;
    Py_ssize_t U = -1;
    PyObject *result = NULL;
    int64_t *next = NULL, *prev = NULL, *fan_mem = NULL, *out = NULL;
    Entry *heap = NULL;
    for (int i = 0; i < 8; i++) {
        if (i == 4) continue;
        if (get_array(args[i], &v[got], names[i], i == 1 ? 'f' : 'i', U, i >= 5) < 0) goto done;
        got++;
        if (U < 0) U = v[0].len / 8;
    }
    const int64_t *order = v[0].buf, *peer = v[2].buf, *cap = v[3].buf;
    const double *cost = v[1].buf;

    /* results go to a private array first, copied out at the end: outputs may alias inputs */
    out = PyMem_Malloc(sizeof(int64_t) * (3 * (size_t)U + 1));
    /* pending units: a doubly linked list over positions 0..U-1 of `order`, U the end */
    next = PyMem_Malloc(sizeof(int64_t) * ((size_t)U + 1));
    prev = PyMem_Malloc(sizeof(int64_t) * ((size_t)U + 1));
    heap = PyMem_Malloc(sizeof(Entry) * (size_t)cores);
    uint64_t slots = 16;
    while (slots < 2 * (uint64_t)U + 2) slots <<= 1;
    fan_mem = PyMem_Malloc(sizeof(int64_t) * 2 * slots);
    if (!out || !next || !prev || !heap || !fan_mem) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *core = out, *slot = out + U, *stripe = out + 2 * U;
    for (Py_ssize_t u = 0; u < U; u++) core[u] = -1;
    for (Py_ssize_t i = 0; i < U; i++) {
        int64_t u = order[i];
        if (u < 0 || u >= U || core[u] != -1) {
            PyErr_Format(PyExc_ValueError, "lpt: order must be a permutation of 0..%zd, got %lld %s position %zd",
                         U - 1, (long long)u, (u >= 0 && u < U) ? "a second time at" : "at", i);
            goto done;
        }
        core[u] = 0;
        if (peer[u] < 0 || peer[u] >= U) {
            PyErr_Format(PyExc_ValueError, "lpt: peer must be dense indices in [0, %zd), got %lld for unit %lld", U,
                         (long long)peer[u], (long long)u);
            goto done;
        }
        if (cap[u] < 1) {
            PyErr_Format(PyExc_ValueError, "lpt: cap must be >= 1 (else no core could take the unit), got %lld "
                                           "for unit %lld", (long long)cap[u], (long long)u);
            goto done;
        }
        next[i] = i + 1;
        prev[i] = i - 1;
    }
    int64_t head = 0; /* first pending position; U when none is left */
    Fan fan = {fan_mem, fan_mem + slots, slots - 1};
    memset(fan.key, 0xff, sizeof(int64_t) * slots);
    memset(fan.count, 0, sizeof(int64_t) * slots);

    Py_ssize_t n = cores;
    for (Py_ssize_t c = 0; c < cores; c++) heap[c] = (Entry){0.0, c, 0, 0};
    /* an entry's stripe never exceeds U: a core skips a stripe only when some unit went there */
    int64_t depth = 4 * (int64_t)cores;
    while (head < U) {
        Entry e = heap_pop(heap, &n);
        int64_t pick = -1, i = 0;
        for (int64_t p = head; p < U; p = next[p], i++) {
            int64_t u = order[p];
            if (fan_get(&fan, e.stripe * U + peer[u]) < cap[u]) {
                pick = p;
                break;
            }
            if (i > depth) break; /* the next eligible unit is far: this stripe is full for the core */
        }
        if (pick < 0) {
            heap_push(heap, &n, (Entry){e.load, e.core, e.stripe + 1, e.slot});
            continue;
        }
        if (prev[pick] >= 0) next[prev[pick]] = next[pick];
        else head = next[pick];
        if (next[pick] < U) prev[next[pick]] = prev[pick];
        int64_t u = order[pick];
        fan_add(&fan, e.stripe * U + peer[u]);
        core[u] = e.core;
        slot[u] = e.slot;
        stripe[u] = e.stripe;
        heap_push(heap, &n, (Entry){e.load + cost[u], e.core, e.stripe + 1, e.slot + 1});
    }
    memcpy(v[4].buf, core, sizeof(int64_t) * U);
    memcpy(v[5].buf, slot, sizeof(int64_t) * U);
    memcpy(v[6].buf, stripe, sizeof(int64_t) * U);
    result = Py_NewRef(Py_None);
done:
    PyMem_Free(out);
    PyMem_Free(next);
    PyMem_Free(prev);
    PyMem_Free(heap);
    PyMem_Free(fan_mem);
    for (int i = 0; i < got; i++) PyBuffer_Release(&v[i]);
    return result;
}

static PyMethodDef methods[] = {
    {"lpt", (PyCFunction)(void (*)(void))lpt, METH_FASTCALL,
     "lpt(order, cost, peer, cap, cores, core, slot, stripe): the balanced partitioner's LPT loop; "
     "fills core, slot, stripe (int64, one per unit)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_lpt", NULL, -1, methods};

PyMODINIT_FUNC PyInit__lpt(void) { return PyModule_Create(&moduledef); }
