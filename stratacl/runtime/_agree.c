/*
 * The communicator's collective protocol: barriers and call numbering (sync, enter), the
 * agreement of descriptors, the readiness scan of peers' buffers, byte counting, and the
 * point-to-point signals Python's path uses (post, received).
 * Part of the module stratacl.runtime._native (_native.h, _module.c).
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

/* Hand barrier k of the communicator `cx` to the host's carrier: take a place in its queue
 * (u64 tail, u64 head, CARRIER_QUEUE entries: runtime/services/_control.py, H_CARRIER), wait (yielding)
 * while the queue is full, write the entry, ring. */
static void carrier_post(const int64_t *cx, uint64_t k, uint64_t mark) {
    uint64_t *q = (uint64_t *)(uintptr_t)cx[CX_CARRIER];
    uint64_t at = __atomic_fetch_add(&q[0], 1, __ATOMIC_SEQ_CST);
    while (at - __atomic_load_n(&q[1], __ATOMIC_ACQUIRE) >= CARRIER_QUEUE) sched_yield();
    __atomic_store_n(&q[8 + at % CARRIER_QUEUE], ((uint64_t)cx[CX_CARRIER_ID] << 32) | (uint32_t)k | mark,
                     __ATOMIC_RELEASE);
    ring_carrier();
}

/* Barrier k of the communicator `cx`: every member arrives once (the counter), the last sets the
 * generation word to k and wakes the sleepers. When the communicator spans hosts (CX_CARRIER),
 * the counter counts this host's members only and the last of them hands k to the host's
 * carrier (carrier_post): the carrier trades the hosts' words and bytes and sets the
 * generation word itself (runtime/hosts/_carrier.py), which is then the only completion. */
int barrier(const int64_t *cx, uint64_t k, long polls, double seconds) {
    return barrier_marked(cx, k, polls, seconds, 0);
}

int barrier_marked(const int64_t *cx, uint64_t k, long polls, double seconds, uint64_t mark) {
    if (job_failed()) return 0;
    flight_arrive(cx, k);
    uint64_t *counter = (uint64_t *)(uintptr_t)cx[CX_COUNTER];
    uint32_t *gen = (uint32_t *)(uintptr_t)cx[CX_GEN];
    int carried = cx[CX_CARRIER] != 0;
    uint64_t target = k * (uint64_t)cx[CX_LOCAL_N];
    __atomic_store_n((uint32_t *)(uintptr_t)cx[CX_ARRIVAL], (uint32_t)k, __ATOMIC_SEQ_CST);
    if (__atomic_fetch_add(counter, 1, __ATOMIC_SEQ_CST) + 1 == target) {
        if (!carried) {
            __atomic_store_n(gen, (uint32_t)k, __ATOMIC_SEQ_CST);
            wake_sleepers(gen);
            return 1;
        }
        carrier_post(cx, k, mark);
    }
    if (carried) return await_seq(gen, (uint32_t)k, polls, seconds);
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
long scan_sources(const int64_t *c, int parity, const int64_t *rd, int64_t *in, uint64_t own, long only,
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
void announce_send(void *desc, const int64_t fields[DESC_FIXED], uint32_t *flag, uint32_t seq) {
    memcpy(desc, fields, DESC_FIXED * 8);
    __atomic_store_n(flag, seq, __ATOMIC_SEQ_CST);
    wake_sleepers(flag);
    ring_carrier();
}

void announce_received(uint32_t *status_word, uint32_t status, uint32_t *done, uint32_t seq) {
    __atomic_store_n(status_word, status, __ATOMIC_SEQ_CST);
    __atomic_store_n(done, seq, __ATOMIC_SEQ_CST);
    wake_sleepers(done);
    ring_carrier();
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
 * (announce_received): status 0 received, else why not (runtime/communicator/_p2p.py, RECV_*). */
static PyObject *received(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 4) { PyErr_SetString(PyExc_TypeError, "received(status_addr, status, done_addr, seq)"); return NULL; }
    void *status_word, *done;
    if (parse_addr(args[0], &status_word) < 0 || parse_addr(args[2], &done) < 0) return NULL;
    unsigned long status = PyLong_AsUnsignedLong(args[1]), seq = PyLong_AsUnsignedLong(args[3]);
    if (PyErr_Occurred()) return NULL;
    announce_received((uint32_t *)status_word, (uint32_t)status, (uint32_t *)done, (uint32_t)seq);
    Py_RETURN_NONE;
}

/* carrier_post(cx, k): hand the host's carrier entry k of the communicator `cx` (carrier_post);
 * k = 0 names no barrier: the communicator is new, and its point-to-point words are to be
 * carried from now on (runtime/pipeline/_protocol.py, runtime/hosts/_carrier.py). */
static PyObject *carrier_post_py(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "carrier_post(cx, k)"); return NULL; }
    unsigned long k = PyLong_AsUnsignedLong(args[1]);
    if (PyErr_Occurred()) return NULL;
    Py_buffer cx;
    if (get_i64_buffer(args[0], &cx, 0, "carrier_post") < 0) return NULL;
    if (((const int64_t *)cx.buf)[CX_CARRIER]) carrier_post((const int64_t *)cx.buf, k, 0);
    PyBuffer_Release(&cx);
    Py_RETURN_NONE;
}

/* The protocol's Python entries. */
PyMethodDef agree_methods[] = {
    {"carrier_post", (PyCFunction)(void (*)(void))carrier_post_py, METH_FASTCALL, "Hand the host's carrier an entry of a communicator (0: a new one)."},
    {"sync", (PyCFunction)(void (*)(void))sync_barrier, METH_FASTCALL, "Arrive at a communicator barrier and wait (bounded)."},
    {"enter", (PyCFunction)(void (*)(void))enter, METH_FASTCALL, "Publish a descriptor, arrive, wait (bounded), compare descriptors."},
    {"agree", (PyCFunction)(void (*)(void))agree, METH_FASTCALL, "Do a slot's descriptors agree?"},
    {"sources", (PyCFunction)(void (*)(void))sources, METH_FASTCALL, "Members' input addresses; first one needing a readiness check."},
    {"post", (PyCFunction)(void (*)(void))post, METH_FASTCALL, "Publish a descriptor and its sequence number."},
    {"received", (PyCFunction)(void (*)(void))received, METH_FASTCALL, "Answer a send: status, then done."},
    {"next_seq", (PyCFunction)(void (*)(void))next_seq_py, METH_FASTCALL, "Number a point-to-point call with a peer."},
    {"count", (PyCFunction)(void (*)(void))count, METH_FASTCALL, "Count a phase's bytes (outside the mesh machine)."},
    {"flight_p2p", (PyCFunction)(void (*)(void))flight_p2p_py, METH_FASTCALL, "Open a point-to-point call's flight entry."},
    {"flight_close", (PyCFunction)(void (*)(void))flight_close_py, METH_FASTCALL, "A point-to-point call completed."},
    {NULL, NULL, 0, NULL},
};
