/*
 * Small native layer for StrataCL-emu: the few things Python cannot do on shared memory.
 *
 * - atomics and fences on words in shared mappings (the central barrier counter needs a
 *   fetch-add that every rank sees in one total order);
 * - futex wait/wake on shared (non-private) words, with the GIL released, so a waiting rank
 *   costs nothing while it sleeps;
 * - barriers and flag waits: a bounded spin that yields the CPU between polls (32 ranks share
 *   2 host cores), then futex sleeps;
 * - the communicator's protocols, owned here: barrier and call numbering (sync, enter), the
 *   readiness scan of peers' buffers, byte counting, one point-to-point call (p2p_core) and
 *   the full-mesh call's state machine (mesh_start, mesh_advance), which Python resumes;
 * - mmap/munmap at fixed addresses, hole punching and the parent-death signal.
 *
 * Every function takes raw addresses as Python ints; callers own the validity of the address.
 * The Python entries of calls described by records (mesh calls, replays, methods) are in
 * _replay.c, part of this module; _native.h is what the two share.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <sched.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "_native.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif
#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

static int parse_addr(PyObject *o, void **out) {
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return -1;
    *out = (void *)(uintptr_t)v;
    return 0;
}

static PyObject *fetch_add_u64(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p;
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "fetch_add_u64(addr, value)"); return NULL; }
    if (parse_addr(args[0], &p) < 0) return NULL;
    unsigned long long v = PyLong_AsUnsignedLongLong(args[1]);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    uint64_t old = __atomic_fetch_add((uint64_t *)p, (uint64_t)v, __ATOMIC_SEQ_CST);
    return PyLong_FromUnsignedLongLong(old);
}

static PyObject *load_u64(PyObject *self, PyObject *arg) {
    void *p;
    if (parse_addr(arg, &p) < 0) return NULL;
    return PyLong_FromUnsignedLongLong(__atomic_load_n((uint64_t *)p, __ATOMIC_SEQ_CST));
}

static PyObject *store_u64(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p;
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "store_u64(addr, value)"); return NULL; }
    if (parse_addr(args[0], &p) < 0) return NULL;
    unsigned long long v = PyLong_AsUnsignedLongLong(args[1]);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    __atomic_store_n((uint64_t *)p, (uint64_t)v, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyObject *load_u32(PyObject *self, PyObject *arg) {
    void *p;
    if (parse_addr(arg, &p) < 0) return NULL;
    return PyLong_FromUnsignedLong(__atomic_load_n((uint32_t *)p, __ATOMIC_SEQ_CST));
}

static PyObject *store_u32(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p;
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "store_u32(addr, value)"); return NULL; }
    if (parse_addr(args[0], &p) < 0) return NULL;
    unsigned long v = PyLong_AsUnsignedLong(args[1]);
    if (v == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    __atomic_store_n((uint32_t *)p, (uint32_t)v, __ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

static PyObject *fence(PyObject *self, PyObject *unused) {
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    Py_RETURN_NONE;
}

/* How many threads of the job sleep, or are about to, on a communicator's futex words (a u32
 * in the control segment's header, set once per process by set_sleepers). A wake of those
 * words is skipped while it is 0: in a busy loop waiters rarely sleep (they poll, yielding),
 * and FUTEX_WAKE on a shared mapping costs a system call and a page lookup even with nobody
 * to wake. Safe by the usual pairing: a waiter increments it (sequentially consistent), then
 * the kernel compares the word; a waker stores the word (sequentially consistent), then reads
 * it. Either the waker sees the sleeper, or the kernel sees the new value and does not sleep.
 * A sleeper that dies leaves it above 0: wakes are then made again, which is only slower. */
static uint32_t *sleepers;

static void wake_sleepers(uint32_t *word) {
    if (sleepers == NULL || __atomic_load_n(sleepers, __ATOMIC_SEQ_CST) != 0)
        syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* set_sleepers(addr): the count's address in this process (0: none, every wake is made). */
static PyObject *set_sleepers(PyObject *self, PyObject *arg) {
    void *p;
    if (parse_addr(arg, &p) < 0) return NULL;
    sleepers = (uint32_t *)p;
    Py_RETURN_NONE;
}

/* The control segment's failure word (runtime/_control.py, H_FAILED_KIND), nonzero once the
 * launcher recorded a rank's failure or began ending the job; set once per process by
 * watch_failures. Once it is set, a rank arrives at no barrier and starts no point-to-point
 * transfer: those return "not yet", and the caller's wait, which checks the job's health
 * first, raises. So every rank stops at its next barrier or transfer, also one whose peers
 * are all alive, instead of running on until the launcher's grace period ends it. */
static uint64_t *failure_word;

static inline int job_failed(void) {
    return failure_word != NULL && __atomic_load_n(failure_word, __ATOMIC_ACQUIRE) != 0;
}

/* watch_failures(addr): the failure word's address in this process (0: none). */
static PyObject *watch_failures(PyObject *self, PyObject *arg) {
    void *p;
    if (parse_addr(arg, &p) < 0) return NULL;
    failure_word = (uint64_t *)p;
    Py_RETURN_NONE;
}

/* futex_wait(addr, expected, timeout_s[, counted]) -> True if woken or the word changed, False
 * on timeout. ``counted``: the word is a communicator's, whose wakes are skipped when nobody
 * is counted asleep (see sleepers). */
static PyObject *futex_wait(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p;
    if (n != 3 && n != 4) {
        PyErr_SetString(PyExc_TypeError, "futex_wait(addr, expected, timeout_s[, counted])");
        return NULL;
    }
    if (parse_addr(args[0], &p) < 0) return NULL;
    unsigned long expected = PyLong_AsUnsignedLong(args[1]);
    if (expected == (unsigned long)-1 && PyErr_Occurred()) return NULL;
    double t = PyFloat_AsDouble(args[2]);
    if (t == -1.0 && PyErr_Occurred()) return NULL;
    if (t < 0) t = 0;
    int counted = n == 4 ? PyObject_IsTrue(args[3]) : 0;
    if (counted < 0) return NULL;
    uint32_t *count = counted ? sleepers : NULL;
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    long rc;
    int err;
    Py_BEGIN_ALLOW_THREADS
    if (count != NULL) __atomic_fetch_add(count, 1, __ATOMIC_SEQ_CST);
    rc = syscall(SYS_futex, (uint32_t *)p, FUTEX_WAIT, (uint32_t)expected, &ts, NULL, 0);
    err = errno;
    if (count != NULL) __atomic_fetch_sub(count, 1, __ATOMIC_SEQ_CST);
    Py_END_ALLOW_THREADS
    if (rc == 0) Py_RETURN_TRUE;
    if (err == EAGAIN || err == EINTR) Py_RETURN_TRUE;
    if (err == ETIMEDOUT) Py_RETURN_FALSE;
    errno = err;
    return PyErr_SetFromErrno(PyExc_OSError);
}

static PyObject *futex_wake(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p;
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "futex_wake(addr, count)"); return NULL; }
    if (parse_addr(args[0], &p) < 0) return NULL;
    long count = PyLong_AsLong(args[1]);
    if (count == -1 && PyErr_Occurred()) return NULL;
    long rc = syscall(SYS_futex, (uint32_t *)p, FUTEX_WAKE, (int)count, NULL, NULL, 0);
    if (rc < 0) return PyErr_SetFromErrno(PyExc_OSError);
    return PyLong_FromLong(rc);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sleep on the futex `word` while it still holds `seen`, at most until `end` (CLOCK_MONOTONIC
 * seconds). Returns 0 once `end` has passed, 1 after a wake-up, a change or a spurious return. */
static int sleep_until(uint32_t *word, uint32_t seen, double end) {
    double left = end - now_s();
    if (left <= 0) return 0;
    struct timespec ts;
    ts.tv_sec = (time_t)left;
    ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
    uint32_t *count = sleepers;
    if (count != NULL) __atomic_fetch_add(count, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
    if (count != NULL) __atomic_fetch_sub(count, 1, __ATOMIC_SEQ_CST);
    return 1;
}

/* The one definition of a sequence number having reached `target`: u32 numbers that wrap
 * around, compared within half their range. Python asks it too (seq_reached below). */
static inline int seq_after(uint32_t value, uint32_t target) { return (uint32_t)(value - target) < 0x80000000u; }

/* Wait for the u32 sequence at `word` to reach `target`: `polls` yielding polls, then futex
 * sleeps on `word` until `seconds` have passed. 1: reached; 0: not yet. */
static int await_seq(uint32_t *word, uint32_t target, long polls, double seconds) {
    for (long i = 0; i < polls; i++) {
        if (seq_after(__atomic_load_n(word, __ATOMIC_ACQUIRE), target)) return 1;
        sched_yield();
    }
    double end = now_s() + seconds;
    for (;;) {
        uint32_t v = __atomic_load_n(word, __ATOMIC_ACQUIRE);
        if (seq_after(v, target)) return 1;
        if (!sleep_until(word, v, end)) return 0;
    }
}

/* seq_reached(value, target) -> True if the u32 sequence number `value` has reached `target`. */
static PyObject *seq_reached(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "seq_reached(value, target)"); return NULL; }
    unsigned long long v = PyLong_AsUnsignedLongLong(args[0]), t = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    return PyBool_FromLong(seq_after((uint32_t)v, (uint32_t)t));
}

/* wait_seq_u32(word, target, polls, seconds) -> True once the u32 sequence number at `word` has
 * reached `target` (wrap-around safe), False if `seconds` passed first. Sleeps on `word` itself. */
static PyObject *wait_seq_u32(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *word;
    if (n != 4) { PyErr_SetString(PyExc_TypeError, "wait_seq_u32(word, target, polls, seconds)"); return NULL; }
    if (parse_addr(args[0], &word) < 0) return NULL;
    unsigned long target = PyLong_AsUnsignedLong(args[1]);
    long polls = PyLong_AsLong(args[2]);
    double seconds = PyFloat_AsDouble(args[3]);
    if (PyErr_Occurred()) return NULL;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = await_seq((uint32_t *)word, (uint32_t)target, polls, seconds);
    Py_END_ALLOW_THREADS
    if (ok) Py_RETURN_TRUE;
    Py_RETURN_FALSE;
}

/* ---- one collective call in few native calls --------------------------------------------
 * A communicator hands its addresses over once, as an int64 array `cx` (_native.h). */

int get_i64_buffer(PyObject *o, Py_buffer *view, int writable, const char *what) {
    if (PyObject_GetBuffer(o, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (view->len % 8) {
        PyBuffer_Release(view);
        PyErr_Format(PyExc_ValueError, "%s: not an int64 buffer", what);
        return -1;
    }
    return 0;
}

/* A descriptor as DESC_FIXED int64 values, from a tuple of ints (what the hot paths build:
 * no array to allocate) or any int64 buffer. 0 on success, -1 with an exception set. */
static int read_fields(PyObject *o, int64_t out[DESC_FIXED], const char *what) {
    if (PyTuple_Check(o)) {
        if (PyTuple_GET_SIZE(o) != DESC_FIXED) {
            PyErr_Format(PyExc_ValueError, "%s: a descriptor has %d fields", what, DESC_FIXED);
            return -1;
        }
        for (int i = 0; i < DESC_FIXED; i++) {
            out[i] = PyLong_AsLongLong(PyTuple_GET_ITEM(o, i));
            if (out[i] == -1 && PyErr_Occurred()) return -1;
        }
        return 0;
    }
    Py_buffer view;
    if (get_i64_buffer(o, &view, 0, what) < 0) return -1;
    int ok = view.len == DESC_FIXED * 8;
    if (ok) memcpy(out, view.buf, DESC_FIXED * 8);
    PyBuffer_Release(&view);
    if (!ok) PyErr_Format(PyExc_ValueError, "%s: a descriptor has %d fields", what, DESC_FIXED);
    return ok ? 0 : -1;
}

/* ---- the flight recorder (_native.h, FL_*) ---------------------------------------------- */
static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t *flight_entry(int64_t *fl, uint64_t seq) {
    return fl + FLIGHT_HEADER + (seq % FLIGHT_ENTRIES) * FL_WORDS;
}

/* Take the next entry and fill what every entry has; the caller fills the rest and publishes
 * it (flight_publish). NULL: this communicator has no recorder. */
static int64_t *flight_begin(const int64_t *cx, uint64_t *seq) {
    int64_t *fl = (int64_t *)(uintptr_t)cx[CX_FLIGHT];
    if (fl == NULL) return NULL;
    *seq = __atomic_add_fetch((uint64_t *)fl, 1, __ATOMIC_RELAXED);
    int64_t *e = flight_entry(fl, *seq);
    __atomic_store_n(&e[FL_SEQ], 0, __ATOMIC_RELAXED);        /* not valid while it is written */
    e[FL_COMM] = cx[CX_COUNTER] - cx[CX_CTL];
    e[FL_N] = cx[CX_N];
    e[FL_ME] = cx[CX_ME];
    e[FL_K_LAST] = 0;
    e[FL_T_LAST] = 0;
    e[FL_T_ENTER] = now_ns();
    return e;
}

static void flight_publish(int64_t *e, uint64_t seq) {
    __atomic_store_n(&e[FL_SEQ], (int64_t)seq, __ATOMIC_RELEASE);
}

/* Open the entry of the collective call whose descriptor is `fields` (F_CALL set), entering at
 * barrier k (k >= 1: a point-to-point entry's FL_K_ENTRY is 0). */
void flight_open(const int64_t *cx, const int64_t *fields, uint64_t k) {
    uint64_t seq;
    int64_t *e = flight_begin(cx, &seq);
    if (e == NULL) return;
    e[FL_OP] = fields[F_OP];
    e[FL_CALL] = fields[F_CALL];
    e[FL_COUNT] = fields[F_COUNT];
    e[FL_NBYTES] = fields[F_NBYTES];
    e[FL_ROOT] = fields[F_ROOT];
    e[FL_K_ENTRY] = (int64_t)k;
    e[FL_DST] = e[FL_SRC] = -1;
    e[FL_RECV_CALL] = 0;
    flight_publish(e, seq);
}

/* Open the entry of a point-to-point call (`op`: OP_*) to member `dst` and from member `src`
 * (-1: none) with their sequence numbers; returns its number for flight_close (0: none). */
uint64_t flight_p2p(const int64_t *cx, int64_t op, int64_t dst, uint32_t send_seq, int64_t src, uint32_t recv_seq,
                    int64_t count, int64_t nbytes) {
    uint64_t seq;
    int64_t *e = flight_begin(cx, &seq);
    if (e == NULL) return 0;
    e[FL_OP] = op;
    e[FL_CALL] = send_seq;
    e[FL_RECV_CALL] = recv_seq;
    e[FL_COUNT] = count;
    e[FL_NBYTES] = nbytes;
    e[FL_ROOT] = -1;
    e[FL_K_ENTRY] = 0;
    e[FL_DST] = dst;
    e[FL_SRC] = src;
    flight_publish(e, seq);
    return seq;
}

/* The point-to-point call of entry `seq` completed (unless the entry was reused since). */
void flight_close(const int64_t *cx, uint64_t seq) {
    int64_t *fl = (int64_t *)(uintptr_t)cx[CX_FLIGHT];
    if (fl == NULL || seq == 0) return;
    int64_t *e = flight_entry(fl, seq);
    if (__atomic_load_n(&e[FL_SEQ], __ATOMIC_ACQUIRE) != (int64_t)seq) return;
    e[FL_T_LAST] = now_ns();
    __atomic_store_n(&e[FL_K_LAST], (int64_t)FL_K_DONE, __ATOMIC_RELEASE);
}

/* Note arriving at barrier k in the newest collective entry of this communicator. */
static void flight_arrive(const int64_t *cx, uint64_t k) {
    int64_t *fl = (int64_t *)(uintptr_t)cx[CX_FLIGHT];
    if (fl == NULL) return;
    uint64_t seq = __atomic_load_n((uint64_t *)fl, __ATOMIC_RELAXED);
    int64_t comm = cx[CX_COUNTER] - cx[CX_CTL];
    for (uint64_t back = 0; back < FLIGHT_ENTRIES && back < seq; back++) {
        int64_t *e = flight_entry(fl, seq - back);
        if (__atomic_load_n(&e[FL_SEQ], __ATOMIC_ACQUIRE) == (int64_t)(seq - back) && e[FL_COMM] == comm &&
            e[FL_K_ENTRY] > 0) {                               /* a collective's */
            e[FL_T_LAST] = now_ns();
            e[FL_K_LAST] = (int64_t)k;
            return;
        }
    }
}

/* Arrive at barrier number k and wait at most `seconds` for the others (GIL released by the
 * caller). 1: complete; 0: not yet (also, without arriving, once the job has failed: see
 * failure_word). */
int barrier(const int64_t *cx, uint64_t k, long polls, double seconds) {
    if (job_failed()) return 0;
    flight_arrive(cx, k);
    uint64_t *counter = (uint64_t *)(uintptr_t)cx[CX_COUNTER];
    uint32_t *gen = (uint32_t *)(uintptr_t)cx[CX_GEN];
    uint64_t target = k * (uint64_t)cx[CX_N];
    __atomic_store_n((uint32_t *)(uintptr_t)cx[CX_ARRIVAL], (uint32_t)k, __ATOMIC_SEQ_CST);
    if (__atomic_fetch_add(counter, 1, __ATOMIC_SEQ_CST) + 1 == target) {
        __atomic_store_n(gen, (uint32_t)k, __ATOMIC_SEQ_CST);
        wake_sleepers(gen);
        return 1;
    }
    for (long i = 0; i < polls; i++) {
        if (__atomic_load_n(counter, __ATOMIC_ACQUIRE) >= target) return 1;
        sched_yield();
    }
    double end = now_s() + seconds;
    for (;;) {
        uint32_t g = __atomic_load_n(gen, __ATOMIC_ACQUIRE);
        if (__atomic_load_n(counter, __ATOMIC_ACQUIRE) >= target) return 1;
        if (!sleep_until(gen, g, end)) return 0;
    }
}

/* 1 if every member's descriptor of parity p agrees with member 0's on F_OP..F_FLAGS and none
 * is flagged, else 0. */
int descriptors_agree(const int64_t *cx, int parity) {
    int64_t n = cx[CX_N];
    const int64_t *const *d = (const int64_t *const *)&cx[CX_DESC + parity * n];
    if (d[0][F_FLAGS]) return 0;
    for (int64_t i = 1; i < n; i++)
        for (int f = F_OP; f <= F_FLAGS; f++)
            if (d[i][f] != d[0][f]) return 0;
    return 1;
}

/* Fill `in` (bases' IN row) with every member's input address (`own` for this rank) from the
 * descriptors of slot `parity`; return the first member whose buffer this rank reads (`only`
 * >= 0: that member alone; `need` not NULL: where need[i]) and whose (segment, epoch) is not the
 * one `rd` records as checked ready, or -1. The one readiness scan: mesh calls and Python's
 * paths (sources below) use it. */
static long scan_sources(const int64_t *c, int parity, const int64_t *rd, int64_t *in, uint64_t own, long only,
                         const int64_t *need) {
    int64_t n = c[CX_N], me = c[CX_ME];
    const int64_t *const *d = (const int64_t *const *)&c[CX_DESC + parity * n];
    long found = -1;
    for (int64_t i = 0; i < n; i++) {
        if (i == me) { in[i] = (int64_t)own; continue; }
        in[i] = d[i][F_ADDR];
        if (found >= 0 || (only >= 0 && i != only) || (need != NULL && !need[i]) || d[i][F_NBYTES] == 0) continue;
        if (d[i][F_SEG_VA] != rd[2 * i] || d[i][F_EPOCH] != rd[2 * i + 1]) found = (long)i;
    }
    return found;
}

/* A phase's bytes into the counters (CTR_*): `moved` its local, pulled and written bytes, less
 * `skipped` bytes of copies found in place. The one place bytes are counted. */
void count_moved(const int64_t *c, const int64_t moved[3], int64_t skipped) {
    int64_t *ctr = (int64_t *)(uintptr_t)c[CX_COUNTERS];
    ctr[CTR_LOCAL] += moved[0] - skipped;
    ctr[CTR_PULLED] += moved[1];
    ctr[CTR_WRITTEN] += moved[2];
}

/* sync(cx, polls, seconds) -> k if barrier k, the communicator's next, is complete, or -k if
 * `seconds` passed first (the caller waits on with health checks). Numbers the barrier. */
static PyObject *sync_barrier(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3) { PyErr_SetString(PyExc_TypeError, "sync(cx, polls, seconds)"); return NULL; }
    Py_buffer cx;
    if (get_i64_buffer(args[0], &cx, 0, "sync") < 0) return NULL;
    long polls = PyLong_AsLong(args[1]);
    double seconds = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred()) { PyBuffer_Release(&cx); return NULL; }
    const int64_t *c = (const int64_t *)cx.buf;
    int64_t k = ++((int64_t *)(uintptr_t)c[CX_TALLY])[T_SYNCS];
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = barrier(c, (uint64_t)k, polls, seconds);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&cx);
    return PyLong_FromLongLong(ok ? k : -k);
}

/* enter(cx, polls, seconds, fields) -> (status, parity, k)
 * Number the communicator's next call and barrier, publish this rank's descriptor (`fields`:
 * DESC_FIXED ints, see read_fields; F_CALL is set here) in the call's slot, arrive at barrier
 * k and wait at most `seconds`. status 0: everyone arrived and all descriptors agree; 1: still
 * waiting (the caller continues with health checks); 2: they disagree or one is flagged (the
 * caller builds the message). */
static PyObject *enter(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 4) { PyErr_SetString(PyExc_TypeError, "enter(cx, polls, seconds, fields)"); return NULL; }
    int64_t fields[DESC_FIXED];
    long polls = PyLong_AsLong(args[1]);
    double seconds = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred() || read_fields(args[3], fields, "enter") < 0) return NULL;
    Py_buffer cx;
    if (get_i64_buffer(args[0], &cx, 0, "enter") < 0) return NULL;
    const int64_t *c = (const int64_t *)cx.buf;
    int64_t *t = (int64_t *)(uintptr_t)c[CX_TALLY];
    int64_t calls = ++t[T_CALLS], k = ++t[T_SYNCS];
    int parity = (int)(calls & 1), rc;
    fields[F_CALL] = calls;
    memcpy((int64_t *)(uintptr_t)c[CX_DESC + parity * c[CX_N] + c[CX_ME]], fields, DESC_FIXED * 8);
    flight_open(c, fields, (uint64_t)k);
    Py_BEGIN_ALLOW_THREADS
    if (!barrier(c, (uint64_t)k, polls, seconds)) rc = 1;
    else rc = descriptors_agree(c, parity) ? 0 : 2;
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&cx);
    return Py_BuildValue("(iiL)", rc, parity, (long long)k);
}

/* agree(cx, parity) -> True if the descriptors of slot `parity` agree (see enter). */
static PyObject *agree(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "agree(cx, parity)"); return NULL; }
    Py_buffer cx;
    if (get_i64_buffer(args[0], &cx, 0, "agree") < 0) return NULL;
    int parity = (int)PyLong_AsLong(args[1]);
    int ok = PyErr_Occurred() ? -1 : descriptors_agree((const int64_t *)cx.buf, parity & 1);
    PyBuffer_Release(&cx);
    if (ok < 0) return NULL;
    return PyBool_FromLong(ok);
}

/* sources(cx, parity, ready, src, own_addr, only, need) -> -1, or the first member whose
 * buffer needs the registration readiness check (scan_sources): fills src[i] with member i's
 * input address (own_addr for this rank); `ready` is the (n, 2) record of (segment va, epoch)
 * found ready per member; `need`: None, or an (n,) int64 array of the members read. The caller
 * checks the one returned, records it in ready, and calls again. */
static PyObject *sources(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 7) { PyErr_SetString(PyExc_TypeError, "sources(cx, parity, ready, src, own_addr, only, need)"); return NULL; }
    Py_buffer cx = {0}, ready = {0}, src = {0}, need = {0};
    long found = -2;
    int parity = (int)PyLong_AsLong(args[1]);
    unsigned long long own = PyLong_AsUnsignedLongLong(args[4]);
    long only = PyLong_AsLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    if (get_i64_buffer(args[0], &cx, 0, "sources") < 0) goto done;
    if (get_i64_buffer(args[2], &ready, 0, "sources") < 0) goto done;
    if (get_i64_buffer(args[3], &src, 1, "sources") < 0) goto done;
    if (args[6] != Py_None && get_i64_buffer(args[6], &need, 0, "sources") < 0) goto done;
    const int64_t *c = (const int64_t *)cx.buf;
    int64_t members = c[CX_N];
    if (ready.len != members * 16 || src.len != members * 8 || (need.buf != NULL && need.len != members * 8)) {
        PyErr_SetString(PyExc_ValueError, "sources: ready must be (n, 2), src and need (n,) int64");
        goto done;
    }
    found = scan_sources(c, parity & 1, (const int64_t *)ready.buf, (int64_t *)src.buf, own, only,
                         (const int64_t *)need.buf);
done:
    if (cx.buf) PyBuffer_Release(&cx);
    if (ready.buf) PyBuffer_Release(&ready);
    if (src.buf) PyBuffer_Release(&src);
    if (need.buf) PyBuffer_Release(&need);
    if (found == -2) return NULL;
    return PyLong_FromLong(found);
}

/* next_seq(cx, which, peer) -> the next point-to-point sequence number with member `peer`:
 * `which` CX_SENT (a send to it) or CX_RECEIVED (a receive from it). */
/* flight_p2p(cx, op, dst, send_seq, src, recv_seq, count, nbytes) -> the entry's number (0:
 * no recorder) and flight_close(cx, number): a point-to-point call's flight entry (FL_*). */
static PyObject *flight_p2p_py(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 8) {
        PyErr_SetString(PyExc_TypeError, "flight_p2p(cx, op, dst, send_seq, src, recv_seq, count, nbytes)");
        return NULL;
    }
    long long v[7];
    for (int i = 0; i < 7; i++) v[i] = PyLong_AsLongLong(args[i + 1]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer cx;
    if (get_i64_buffer(args[0], &cx, 0, "flight_p2p") < 0) return NULL;
    uint64_t seq = flight_p2p((const int64_t *)cx.buf, v[0], v[1], (uint32_t)v[2], v[3], (uint32_t)v[4], v[5], v[6]);
    PyBuffer_Release(&cx);
    return PyLong_FromUnsignedLongLong(seq);
}

static PyObject *flight_close_py(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "flight_close(cx, seq)"); return NULL; }
    unsigned long long seq = PyLong_AsUnsignedLongLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer cx;
    if (get_i64_buffer(args[0], &cx, 0, "flight_close") < 0) return NULL;
    flight_close((const int64_t *)cx.buf, seq);
    PyBuffer_Release(&cx);
    Py_RETURN_NONE;
}

static PyObject *next_seq_py(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3) { PyErr_SetString(PyExc_TypeError, "next_seq(cx, which, peer)"); return NULL; }
    long which = PyLong_AsLong(args[1]);
    long long peer = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer cx;
    if (get_i64_buffer(args[0], &cx, 0, "next_seq") < 0) return NULL;
    const int64_t *c = (const int64_t *)cx.buf;
    PyObject *r = NULL;
    if ((which != CX_SENT && which != CX_RECEIVED) || peer < 0 || peer >= c[CX_N])
        PyErr_SetString(PyExc_ValueError, "next_seq: which must be CX_SENT or CX_RECEIVED, peer a member");
    else
        r = PyLong_FromUnsignedLong(next_seq(c, (int)which, peer));
    PyBuffer_Release(&cx);
    return r;
}

/* count(cx, local, pulled, written, skipped): a phase run outside the mesh machine (a ring
 * step, all_to_all_v, a point-to-point receive) into the byte counters (count_moved). */
static PyObject *count(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 5) { PyErr_SetString(PyExc_TypeError, "count(cx, local, pulled, written, skipped)"); return NULL; }
    int64_t moved[3] = {PyLong_AsLongLong(args[1]), PyLong_AsLongLong(args[2]), PyLong_AsLongLong(args[3])};
    long long skipped = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer cx;
    if (get_i64_buffer(args[0], &cx, 0, "count") < 0) return NULL;
    count_moved((const int64_t *)cx.buf, moved, skipped);
    PyBuffer_Release(&cx);
    Py_RETURN_NONE;
}

/* The two signals of the point-to-point protocol, written here only (p2p_core, and Python's
 * path through post and received): a send publishes its descriptor, then the sequence number
 * that announces it; a receive publishes its status (0: received), then the sequence number
 * that tells the sender it is done. Each wakes whoever sleeps on the word. */
static void announce_send(void *desc, const int64_t fields[DESC_FIXED], uint32_t *flag, uint32_t seq) {
    memcpy(desc, fields, DESC_FIXED * 8);
    __atomic_store_n(flag, seq, __ATOMIC_SEQ_CST);
    wake_sleepers(flag);
}

static void announce_received(uint32_t *status_word, uint32_t status, uint32_t *done, uint32_t seq) {
    __atomic_store_n(status_word, status, __ATOMIC_SEQ_CST);
    __atomic_store_n(done, seq, __ATOMIC_SEQ_CST);
    wake_sleepers(done);
}

/* post(desc_addr, fields, flag_addr, seq): a send's announcement (announce_send); `fields` as
 * read_fields reads them. */
static PyObject *post(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 4) { PyErr_SetString(PyExc_TypeError, "post(desc_addr, fields, flag_addr, seq)"); return NULL; }
    void *desc, *flag;
    int64_t fields[DESC_FIXED];
    if (parse_addr(args[0], &desc) < 0 || parse_addr(args[2], &flag) < 0) return NULL;
    unsigned long seq = PyLong_AsUnsignedLong(args[3]);
    if (PyErr_Occurred() || read_fields(args[1], fields, "post") < 0) return NULL;
    announce_send(desc, fields, (uint32_t *)flag, (uint32_t)seq);
    Py_RETURN_NONE;
}

/* received(status_addr, status, done_addr, seq): a receive's answer to its sender
 * (announce_received): status 0 received, else why not (runtime/_p2p.py, RECV_*). */
static PyObject *received(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 4) { PyErr_SetString(PyExc_TypeError, "received(status_addr, status, done_addr, seq)"); return NULL; }
    void *status_word, *done;
    if (parse_addr(args[0], &status_word) < 0 || parse_addr(args[2], &done) < 0) return NULL;
    unsigned long status = PyLong_AsUnsignedLong(args[1]), seq = PyLong_AsUnsignedLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    announce_received((uint32_t *)status_word, (uint32_t)status, (uint32_t *)done, (uint32_t)seq);
    Py_RETURN_NONE;
}

/* ---- one point-to-point call in one native call ------------------------------------------
 * A communicator hands its per-peer words over once, as an int64 array `px` of (n, PX_WORDS)
 * addresses (runtime/_p2p.py). The protocol is the one _p2p.py describes; this is its common
 * case, and it stops, returning the stage, wherever Python must take over: a wait that needs
 * health checks, a descriptor that does not match or names a buffer not checked yet. */

const StrataKernelsApi *kernels;

/* The kernels' executor, imported on first use. 0, or -1 with an exception set. */
int load_kernels(void) {
    if (kernels == NULL)
        kernels = (const StrataKernelsApi *)PyCapsule_Import(STRATA_KERNELS_CAPSULE, 0);
    return kernels == NULL ? -1 : 0;
}

/* p2p(px, me, dst, send_seq, fields, src, recv_seq, dtype, count, itemsize, out_addr, plan,
 *     bases, ready, polls, seconds) -> stage
 * dst >= 0: publish `fields` (see read_fields) as this rank's send to dst and announce it
 * with send_seq. src >= 0: wait for src's send number recv_seq; if its descriptor carries
 * `count` elements of `dtype`, is not flagged and names a buffer `ready` already holds (or no
 * bytes), run the receive's `plan` (its IN base is the sender's address, OUT base `out_addr`)
 * and tell src it is done. Then, for a send, wait until dst has received it without error.
 * Returns P2P_DONE, or the stage where the caller continues: P2P_RECV_WAIT (nothing received
 * yet), P2P_RECV_CHECK (arrived, not handled here), P2P_SEND_WAIT (received; the send is
 * not confirmed within `seconds`, or dst reported an error). */
/* The body of p2p() on parsed arguments, with the GIL released: `w` the (n, PX_WORDS) words,
 * `plan` rows of 8 int64 (NULL: none), `b` the bases (3, n), `rd` the ready pairs (n, 2). */
int p2p_core(const int64_t *w, int64_t n, long me, long dst, uint32_t send_seq, const int64_t *fields, long src,
                    uint32_t recv_seq, int dtype, long long count, long long itemsize, int64_t out_addr,
                    const int64_t *plan, Py_ssize_t rows, int64_t *b, const int64_t *rd, long polls, double seconds) {
#define WORD(peer, which) ((uint32_t *)(uintptr_t)w[(peer) * PX_WORDS + (which)])
    if (job_failed()) return src >= 0 ? P2P_RECV_WAIT : P2P_SEND_WAIT;    /* the caller's wait raises */
    if (dst >= 0) announce_send((void *)(uintptr_t)w[dst * PX_WORDS + PX_SEND_DESC], fields, WORD(dst, PX_SEND_FLAG),
                                send_seq);
    if (src >= 0) {
        const int64_t *d = (const int64_t *)(uintptr_t)w[src * PX_WORDS + PX_RECV_DESC];
        if (!await_seq(WORD(src, PX_RECV_FLAG), recv_seq, polls, seconds)) return P2P_RECV_WAIT;
        if (d[F_FLAGS] || d[F_DTYPE] != dtype || d[F_COUNT] != count ||
            (count * itemsize > 0 && (plan == NULL || d[F_SEG_VA] != rd[2 * src] || d[F_EPOCH] != rd[2 * src + 1])))
            return P2P_RECV_CHECK;
        if (count * itemsize > 0) {
            int64_t skipped = 0;
            b[BUF_IN * n + src] = d[F_ADDR];   /* the sender's buffer */
            b[BUF_OUT * n + me] = out_addr;    /* this rank's */
            if (kernels->execute_plan(plan, rows, b, n, dtype, 0, 1.0, &skipped) != NULL)
                return P2P_RECV_CHECK;       /* nothing was written; Python's path raises */
        }
        announce_received(WORD(src, PX_RECV_STATUS), 0, WORD(src, PX_RECV_DONE), recv_seq);
    }
    if (dst < 0 || (await_seq(WORD(dst, PX_SENT_DONE), send_seq, polls, seconds) &&
                    __atomic_load_n(WORD(dst, PX_SENT_STATUS), __ATOMIC_ACQUIRE) == 0))
        return P2P_DONE;
    return P2P_SEND_WAIT;
#undef WORD
}

static PyObject *p2p(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 16) {
        PyErr_SetString(PyExc_TypeError, "p2p(px, me, dst, send_seq, fields, src, recv_seq, dtype, count, itemsize, "
                                         "out_addr, plan, bases, ready, polls, seconds)");
        return NULL;
    }
    if (load_kernels() < 0) return NULL;
    long me = PyLong_AsLong(args[1]), dst = PyLong_AsLong(args[2]), src = PyLong_AsLong(args[5]);
    unsigned long send_seq = PyLong_AsUnsignedLong(args[3]), recv_seq = PyLong_AsUnsignedLong(args[6]);
    int dtype = (int)PyLong_AsLong(args[7]);
    long long count = PyLong_AsLongLong(args[8]), itemsize = PyLong_AsLongLong(args[9]);
    unsigned long long out_addr = PyLong_AsUnsignedLongLong(args[10]);
    long polls = PyLong_AsLong(args[14]);
    double seconds = PyFloat_AsDouble(args[15]);
    if (PyErr_Occurred()) return NULL;
    int64_t fields[DESC_FIXED];
    if (dst >= 0 && read_fields(args[4], fields, "p2p") < 0) return NULL;
    Py_buffer px = {0}, plan = {0}, bases = {0}, ready = {0};
    int stage = -1;
    if (get_i64_buffer(args[0], &px, 0, "p2p") < 0) goto done;
    if (src >= 0 && args[11] != Py_None && get_i64_buffer(args[11], &plan, 0, "p2p") < 0) goto done;
    if (get_i64_buffer(args[12], &bases, 1, "p2p") < 0) goto done;
    if (get_i64_buffer(args[13], &ready, 0, "p2p") < 0) goto done;
    Py_ssize_t n = px.len / (8 * PX_WORDS);
    if (me < 0 || me >= n || dst >= n || src >= n || bases.len != 24 * n || ready.len != 16 * n ||
        (plan.buf != NULL && plan.len % 64)) {
        PyErr_SetString(PyExc_ValueError, "p2p: inconsistent arguments");
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    stage = p2p_core((const int64_t *)px.buf, n, me, dst, (uint32_t)send_seq, fields, src, (uint32_t)recv_seq, dtype,
                     count, itemsize, (int64_t)out_addr, (const int64_t *)plan.buf, plan.len / 64,
                     (int64_t *)bases.buf, (const int64_t *)ready.buf, polls, seconds);
    Py_END_ALLOW_THREADS
done:
    if (px.buf) PyBuffer_Release(&px);
    if (plan.buf) PyBuffer_Release(&plan);
    if (bases.buf) PyBuffer_Release(&bases);
    if (ready.buf) PyBuffer_Release(&ready);
    if (stage < 0) return NULL;
    return PyLong_FromLong(stage);
}

/* ---- the full-mesh call: its protocol, advanced here and nowhere else ----------------------
 * A full-mesh call is described by a row of RP_* parameters per call parity (_native.h; built
 * by runtime/_mesh.py) and advanced by mesh_advance from a MeshState:
 *
 *     (mesh_start: number the call, publish its descriptor, number the entry barrier k)
 *     arrive at barrier k ------------------------------ not all there in time: MESH_ENTER_WAIT
 *     every descriptor agrees -------------------------- no: MESH_DISAGREE (the caller raises)
 *     every peer buffer read was checked ready --------- no: MESH_SOURCES
 *     phase 1 (RP_PLAN), its bytes counted ------------- the caller's engine: MESH_RUN_FIRST
 *     with RP_PLAN2: arrive at barrier k + 1 ----------- MESH_MIDDLE_WAIT
 *                    phase 2, its bytes counted -------- the caller's engine: MESH_RUN_SECOND
 *     depart: MESH_BARRIER       arrive at the next barrier -------------- MESH_DEPART_WAIT
 *             MESH_ROOT_READER   count this reader done on the root's word
 *             MESH_ROOT          wait for every reader on it -------------- MESH_DEPART_WAIT
 *     count the call (RP_COUNTED) ---------------------- MESH_DONE
 *
 * Where it stops, the caller does what needs Python (a wait with health checks, the
 * mismatch's message, a peer buffer's registration check, a phase on the SDMA engine) and
 * resumes from the same state. So the numbering of the call and of its barriers (T_CALLS;
 * T_SYNCS, taken as this rank arrives at each barrier), the root's departure count, the byte
 * counters and the call count are kept here alone. */

/* Number a mesh call whose parameters are `rows` (one RP_LEN row per parity) and publish its
 * descriptor: the state to advance it from. Needs no GIL; the caller copied an eager input. */
MeshState mesh_start(const int64_t *rows) {
    const int64_t *c = (const int64_t *)(uintptr_t)rows[RP_CX];
    int64_t n = c[CX_N], me = c[CX_ME];
    int64_t *t = (int64_t *)(uintptr_t)c[CX_TALLY], *roots = (int64_t *)(uintptr_t)c[CX_ROOTS];
    uint64_t calls = (uint64_t)++t[T_CALLS];
    MeshState s = {MESH_START, (int)(calls & 1), (uint64_t)++t[T_SYNCS], 0, 0};
    const int64_t *p = rows + s.parity * RP_LEN;
    if (p[RP_DEPARTURE] >= MESH_ROOT_READER) s.target = (uint32_t)((uint64_t)(roots[p[RP_ROOT]] + 1) * (uint64_t)(n - 1));
    if (p[RP_OUT] >= 0) ((int64_t *)(uintptr_t)p[RP_BASES])[BUF_OUT * n + me] = p[RP_OUT];
    int64_t *mine = (int64_t *)(uintptr_t)c[CX_DESC + s.parity * n + me];
    memcpy(mine, p, DESC_FIXED * 8);
    mine[F_CALL] = (int64_t)calls;
    flight_open(c, mine, s.k);
    return s;
}

/* Advance a mesh call from state `s` to its end or the next stop (the module comment above).
 * Needs no GIL. Returns the stage, also left in s->stage; *err: a bad plan's message. */
int mesh_advance(const int64_t *rows, MeshState *s, double divisor, long polls, double seconds, const char **err) {
    const int64_t *p = rows + s->parity * RP_LEN;
    const int64_t *c = (const int64_t *)(uintptr_t)p[RP_CX];
    int64_t n = c[CX_N];
    int64_t *t = (int64_t *)(uintptr_t)c[CX_TALLY], *roots = (int64_t *)(uintptr_t)c[CX_ROOTS];
    int64_t *b = (int64_t *)(uintptr_t)p[RP_BASES];
    const int64_t *plan = (const int64_t *)(uintptr_t)p[RP_PLAN], *plan2 = (const int64_t *)(uintptr_t)p[RP_PLAN2];
    int dtype = (int)p[RP_DTYPE], redop = (int)p[RP_REDOP], departure = (int)p[RP_DEPARTURE];
    int caller = p[RP_CALLER_PHASES] != 0;
    uint32_t *word = (uint32_t *)(uintptr_t)p[RP_WORD];
    *err = NULL;
    switch (s->stage) {
    case MESH_START: break;
    case MESH_ENTER_WAIT: goto agree;
    case MESH_SOURCES: goto sources;
    case MESH_RUN_FIRST: goto first_done;
    case MESH_MIDDLE_WAIT: goto second;
    case MESH_RUN_SECOND: goto second_done;
    case MESH_DEPART_WAIT: goto done;
    default: *err = "no stage to resume from"; return s->stage;
    }
    if (!barrier(c, s->k, polls, seconds)) return s->stage = MESH_ENTER_WAIT;
agree:
    if (!descriptors_agree(c, s->parity)) return s->stage = MESH_DISAGREE;
sources:
    if (scan_sources(c, s->parity, (const int64_t *)(uintptr_t)p[RP_READY], b + BUF_IN * n, (uint64_t)p[RP_OWN],
                     (long)p[RP_ONLY], NULL) >= 0)
        return s->stage = MESH_SOURCES;
    s->skipped = 0;
    if (plan != NULL) {
        if (caller) return s->stage = MESH_RUN_FIRST;
        if ((*err = kernels->execute_plan(plan, p[RP_PLAN_ROWS], b, n, dtype, redop, divisor, &s->skipped)) != NULL)
            return s->stage;
    }
first_done:
    count_moved(c, p + RP_BYTES, s->skipped);
    if (plan2 == NULL) goto depart;
    s->k = (uint64_t)++t[T_SYNCS];
    if (!barrier(c, s->k, polls, seconds)) return s->stage = MESH_MIDDLE_WAIT;
second:
    s->skipped = 0;
    if (caller) return s->stage = MESH_RUN_SECOND;
    if ((*err = kernels->execute_plan(plan2, p[RP_PLAN2_ROWS], b, n, dtype, redop, divisor, &s->skipped)) != NULL)
        return s->stage;
second_done:
    count_moved(c, p + RP_BYTES + 3, s->skipped);
depart:
    if (departure == MESH_BARRIER) {
        s->k = (uint64_t)++t[T_SYNCS];
        if (!barrier(c, s->k, polls, seconds)) return s->stage = MESH_DEPART_WAIT;
    } else if (departure == MESH_ROOT_READER) {
        roots[p[RP_ROOT]]++;
        if (__atomic_add_fetch(word, 1, __ATOMIC_SEQ_CST) == s->target) wake_sleepers(word);
    } else if (departure == MESH_ROOT) {
        roots[p[RP_ROOT]]++;
        if (!await_seq(word, s->target, polls, seconds)) return s->stage = MESH_DEPART_WAIT;
    }
done:
    ++*(int64_t *)(uintptr_t)p[RP_COUNTED];
    return s->stage = MESH_DONE;
}

/* data_address(array) -> the address of the first byte of any buffer-protocol object. */
static PyObject *data_address(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_RECORDS_RO) < 0) return NULL;
    PyObject *r = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)view.buf);
    PyBuffer_Release(&view);
    return r;
}

/* mmap_at(addr, length, prot, flags, fd, offset) -> addr; raises OSError on failure or if the
 * kernel placed the mapping elsewhere. */
static PyObject *mmap_at(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p;
    if (n != 6) { PyErr_SetString(PyExc_TypeError, "mmap_at(addr, length, prot, flags, fd, offset)"); return NULL; }
    if (parse_addr(args[0], &p) < 0) return NULL;
    unsigned long long len = PyLong_AsUnsignedLongLong(args[1]);
    if (len == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int prot = (int)PyLong_AsLong(args[2]);
    int flags = (int)PyLong_AsLong(args[3]);
    int fd = (int)PyLong_AsLong(args[4]);
    long long off = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    void *r;
    Py_BEGIN_ALLOW_THREADS
    r = mmap(p, (size_t)len, prot, flags, fd, (off_t)off);
    Py_END_ALLOW_THREADS
    if (r == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
    if (p != NULL && r != p) {
        munmap(r, (size_t)len);
        errno = EEXIST;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)r);
}

static PyObject *munmap_at(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p;
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "munmap_at(addr, length)"); return NULL; }
    if (parse_addr(args[0], &p) < 0) return NULL;
    unsigned long long len = PyLong_AsUnsignedLongLong(args[1]);
    if (len == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (munmap(p, (size_t)len) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *punch_hole(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3) { PyErr_SetString(PyExc_TypeError, "punch_hole(fd, offset, length)"); return NULL; }
    int fd = (int)PyLong_AsLong(args[0]);
    long long off = PyLong_AsLongLong(args[1]);
    long long len = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *set_pdeathsig(PyObject *self, PyObject *arg) {
    long sig = PyLong_AsLong(arg);
    if (sig == -1 && PyErr_Occurred()) return NULL;
    if (prctl(PR_SET_PDEATHSIG, (unsigned long)sig, 0, 0, 0) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* The protocol primitives' Python entries (the module is made in _module.c). */
PyMethodDef native_methods[] = {
    {"fetch_add_u64", (PyCFunction)(void (*)(void))fetch_add_u64, METH_FASTCALL, "Atomic fetch-add on a u64; returns the old value."},
    {"load_u64", load_u64, METH_O, "Sequentially consistent load of a u64."},
    {"store_u64", (PyCFunction)(void (*)(void))store_u64, METH_FASTCALL, "Sequentially consistent store of a u64."},
    {"load_u32", load_u32, METH_O, "Sequentially consistent load of a u32."},
    {"store_u32", (PyCFunction)(void (*)(void))store_u32, METH_FASTCALL, "Sequentially consistent store of a u32."},
    {"fence", fence, METH_NOARGS, "Full memory fence."},
    {"futex_wait", (PyCFunction)(void (*)(void))futex_wait, METH_FASTCALL, "Wait on a shared futex word."},
    {"futex_wake", (PyCFunction)(void (*)(void))futex_wake, METH_FASTCALL, "Wake waiters of a shared futex word."},
    {"wait_seq_u32", (PyCFunction)(void (*)(void))wait_seq_u32, METH_FASTCALL, "Wait for a u32 sequence flag."},
    {"sync", (PyCFunction)(void (*)(void))sync_barrier, METH_FASTCALL, "Arrive at a communicator barrier and wait (bounded)."},
    {"enter", (PyCFunction)(void (*)(void))enter, METH_FASTCALL, "Publish a descriptor, arrive, wait (bounded), compare descriptors."},
    {"agree", (PyCFunction)(void (*)(void))agree, METH_FASTCALL, "Do a slot's descriptors agree?"},
    {"sources", (PyCFunction)(void (*)(void))sources, METH_FASTCALL, "Members' input addresses; first one needing a readiness check."},
    {"post", (PyCFunction)(void (*)(void))post, METH_FASTCALL, "Publish a descriptor and its sequence number."},
    {"received", (PyCFunction)(void (*)(void))received, METH_FASTCALL, "Answer a send: status, then done."},
    {"next_seq", (PyCFunction)(void (*)(void))next_seq_py, METH_FASTCALL, "Number a point-to-point call with a peer."},
    {"count", (PyCFunction)(void (*)(void))count, METH_FASTCALL, "Count a phase's bytes (outside the mesh machine)."},
    {"seq_reached", (PyCFunction)(void (*)(void))seq_reached, METH_FASTCALL, "Has a u32 sequence number reached a target?"},
    {"p2p", (PyCFunction)(void (*)(void))p2p, METH_FASTCALL, "One point-to-point call's common case (see _p2p.py)."},
    {"flight_p2p", (PyCFunction)(void (*)(void))flight_p2p_py, METH_FASTCALL, "Open a point-to-point call's flight entry."},
    {"flight_close", (PyCFunction)(void (*)(void))flight_close_py, METH_FASTCALL, "A point-to-point call completed."},
    {"data_address", data_address, METH_O, "Address of a buffer's first byte."},
    {"mmap_at", (PyCFunction)(void (*)(void))mmap_at, METH_FASTCALL, "mmap at a fixed address."},
    {"munmap_at", (PyCFunction)(void (*)(void))munmap_at, METH_FASTCALL, "munmap a range."},
    {"punch_hole", (PyCFunction)(void (*)(void))punch_hole, METH_FASTCALL, "Release the pages of a file range."},
    {"set_sleepers", set_sleepers, METH_O, "Where this job counts the sleepers on communicator words."},
    {"watch_failures", watch_failures, METH_O, "Where this job records its first failure (H_FAILED_KIND)."},
    {"set_pdeathsig", set_pdeathsig, METH_O, "Deliver a signal to this process when its parent dies."},
    {NULL, NULL, 0, NULL},
};

/* Every enumerator of _native.h, exported under its own name: Python's one source for them. */
#define CONSTANT(name) {#name, name}
static const struct { const char *name; long value; } constants[] = {
    CONSTANT(CX_COUNTER), CONSTANT(CX_GEN), CONSTANT(CX_ARRIVAL), CONSTANT(CX_N), CONSTANT(CX_ME), CONSTANT(CX_TALLY),
    CONSTANT(CX_ROOTS), CONSTANT(CX_SENT), CONSTANT(CX_RECEIVED), CONSTANT(CX_COUNTERS), CONSTANT(CX_BARRIERS),
    CONSTANT(CX_FLIGHT), CONSTANT(CX_CTL), CONSTANT(CX_DESC),
    CONSTANT(FL_SEQ), CONSTANT(FL_COMM), CONSTANT(FL_N), CONSTANT(FL_ME), CONSTANT(FL_OP), CONSTANT(FL_CALL),
    CONSTANT(FL_COUNT), CONSTANT(FL_NBYTES), CONSTANT(FL_ROOT), CONSTANT(FL_K_ENTRY), CONSTANT(FL_K_LAST),
    CONSTANT(FL_T_ENTER), CONSTANT(FL_T_LAST), CONSTANT(FL_DST), CONSTANT(FL_SRC), CONSTANT(FL_RECV_CALL),
    CONSTANT(FL_K_DONE), CONSTANT(OP_SEND), CONSTANT(OP_RECV), CONSTANT(OP_SENDRECV), CONSTANT(FL_WORDS), CONSTANT(FLIGHT_HEADER), CONSTANT(FLIGHT_ENTRIES),
    CONSTANT(T_CALLS), CONSTANT(T_SYNCS), CONSTANT(T_NATIVE), CONSTANT(T_WORDS),
    CONSTANT(F_OP), CONSTANT(F_DTYPE), CONSTANT(F_COUNT), CONSTANT(F_ROOT), CONSTANT(F_REDOP), CONSTANT(F_FLAGS),
    CONSTANT(F_ADDR), CONSTANT(F_NBYTES), CONSTANT(F_SEG_VA), CONSTANT(F_SEG_SIZE), CONSTANT(F_SEG_OFF),
    CONSTANT(F_EPOCH), CONSTANT(F_AUX0), CONSTANT(F_AUX1), CONSTANT(F_AUX2), CONSTANT(F_CALL), CONSTANT(DESC_FIXED),
    CONSTANT(PX_SEND_DESC), CONSTANT(PX_SEND_FLAG), CONSTANT(PX_RECV_FLAG), CONSTANT(PX_RECV_DESC),
    CONSTANT(PX_RECV_STATUS), CONSTANT(PX_RECV_DONE), CONSTANT(PX_SENT_DONE), CONSTANT(PX_SENT_STATUS),
    CONSTANT(PX_WORDS),
    CONSTANT(P2P_DONE), CONSTANT(P2P_RECV_WAIT), CONSTANT(P2P_RECV_CHECK), CONSTANT(P2P_SEND_WAIT),
    CONSTANT(MESH_DONE), CONSTANT(MESH_ENTER_WAIT), CONSTANT(MESH_DISAGREE), CONSTANT(MESH_SOURCES),
    CONSTANT(MESH_RUN_FIRST), CONSTANT(MESH_MIDDLE_WAIT), CONSTANT(MESH_RUN_SECOND), CONSTANT(MESH_DEPART_WAIT),
    CONSTANT(MESH_START),
    CONSTANT(MESH_NO_DEPARTURE), CONSTANT(MESH_BARRIER), CONSTANT(MESH_ROOT_READER), CONSTANT(MESH_ROOT),
    CONSTANT(MESH_NOT_RUN),
    CONSTANT(PP_ME), CONSTANT(PP_DST), CONSTANT(PP_SRC), CONSTANT(PP_DTYPE), CONSTANT(PP_COUNT), CONSTANT(PP_ITEMSIZE),
    CONSTANT(PP_OUT), CONSTANT(PP_N), CONSTANT(PP_SENDS), CONSTANT(PP_RECVS), CONSTANT(PP_CX), CONSTANT(PP_PX),
    CONSTANT(PP_BASES), CONSTANT(PP_READY), CONSTANT(PP_PLAN), CONSTANT(PP_PLAN_ROWS), CONSTANT(PP_BYTES),
    CONSTANT(PP_LEN),
    CONSTANT(Q_PARAMS), CONSTANT(Q_CX), CONSTANT(Q_PX), CONSTANT(Q_BASES), CONSTANT(Q_READY), CONSTANT(Q_PLAN),
    CONSTANT(Q_PARAMS_ADDR), CONSTANT(Q_LEN),
    CONSTANT(RP_OWN), CONSTANT(RP_ONLY), CONSTANT(RP_DTYPE), CONSTANT(RP_REDOP), CONSTANT(RP_DEPARTURE),
    CONSTANT(RP_ROOT), CONSTANT(RP_WORD), CONSTANT(RP_OUT), CONSTANT(RP_EAGER_FROM), CONSTANT(RP_EAGER_BYTES),
    CONSTANT(RP_COUNTED), CONSTANT(RP_CALLER_PHASES), CONSTANT(RP_CX), CONSTANT(RP_READY), CONSTANT(RP_BASES), CONSTANT(RP_PLAN),
    CONSTANT(RP_PLAN_ROWS), CONSTANT(RP_PLAN2), CONSTANT(RP_PLAN2_ROWS), CONSTANT(RP_BYTES), CONSTANT(RP_LEN),
    CONSTANT(R_PARAMS), CONSTANT(R_CX), CONSTANT(R_READY), CONSTANT(R_BASES), CONSTANT(R_PLAN), CONSTANT(R_PLAN2),
    CONSTANT(R_DIVISOR), CONSTANT(R_STATS), CONSTANT(R_PARAMS_ADDR), CONSTANT(R_LEN),
    CONSTANT(METHOD_MESH), CONSTANT(METHOD_SENDRECV),
    CONSTANT(MAP_FIXED_NOREPLACE),
};
#undef CONSTANT

/* Add the constants to the module: 0, or -1 with an exception set. */
int native_init(PyObject *m) {
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) return -1;
    return 0;
}

/* ---- one-sided atomics (runtime/_onesided.py) --------------------------------------------
 * Kept apart from the protocols above, with a method table of its own that the module adds
 * (_module.c). A compare-and-swap is the one atomic the word helpers above lack: shmem's
 * atomic_compare_swap and the signal words' modeled timestamps (a running maximum) need it. */

/* cas_u64(addr, expected, desired) -> the value the word held: `desired` was stored if and only
 * if that value equals `expected` (sequentially consistent; `addr` must be 8-byte aligned). */
static PyObject *cas_u64(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p;
    if (n != 3) { PyErr_SetString(PyExc_TypeError, "cas_u64(addr, expected, desired)"); return NULL; }
    if (parse_addr(args[0], &p) < 0) return NULL;
    unsigned long long expected = PyLong_AsUnsignedLongLong(args[1]);
    if (expected == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    unsigned long long desired = PyLong_AsUnsignedLongLong(args[2]);
    if (desired == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    uint64_t seen = (uint64_t)expected;
    __atomic_compare_exchange_n((uint64_t *)p, &seen, (uint64_t)desired, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return PyLong_FromUnsignedLongLong(seen);
}

PyMethodDef onesided_methods[] = {
    {"cas_u64", (PyCFunction)(void (*)(void))cas_u64, METH_FASTCALL,
     "Atomic compare-and-swap on a u64; returns the value found."},
    {NULL, NULL, 0, NULL},
};
