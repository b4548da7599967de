/*
 * Words in shared memory: atomics and fences, futex waits and wakes with the GIL released,
 * the sleepers' count and the job's failure word, and the bounded waits every protocol uses
 * (a spin that yields the CPU between polls, then futex sleeps).
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

int parse_addr(PyObject *o, void **out) {
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
uint32_t *sleepers;               /* _native.h: wake_sleepers */


/* set_sleepers(addr): the count's address in this process (0: none, every wake is made). */
static PyObject *set_sleepers(PyObject *self, PyObject *arg) {
    void *p;
    if (parse_addr(arg, &p) < 0) return NULL;
    sleepers = (uint32_t *)p;
    Py_RETURN_NONE;
}

/* The control segment's failure word (runtime/services/_control.py, H_FAILED_KIND), nonzero once the
 * launcher recorded a rank's failure or began ending the job; set once per process by
 * watch_failures. Once it is set, a rank arrives at no barrier and starts no point-to-point
 * transfer: those return "not yet", and the caller's wait, which checks the job's health
 * first, raises. So every rank stops at its next barrier or transfer, also one whose peers
 * are all alive, instead of running on until the launcher's grace period ends it. */
uint64_t *failure_word;            /* _native.h: job_failed */


/* The bell of this host's carrier (a u32 in the control segment's header, H_CARRIER_BELL), set
 * once per process by set_carrier_bell when the job spans hosts, else NULL. Rung after every
 * word the carrier forwards to other hosts is written: a barrier's last local arrival, a
 * point-to-point announcement (runtime/hosts/_carrier.py scans its ranks' words when woken). */
uint32_t *carrier_bell;            /* _native.h: ring_carrier */

void ring_carrier(void) {
    if (carrier_bell == NULL) return;
    __atomic_fetch_add(carrier_bell, 1, __ATOMIC_SEQ_CST);
    syscall(SYS_futex, carrier_bell, FUTEX_WAKE, 1, NULL, NULL, 0);
}

/* set_carrier_bell(addr): the bell's address in this process (0: the job is on one host). */
static PyObject *set_carrier_bell(PyObject *self, PyObject *arg) {
    void *p;
    if (parse_addr(arg, &p) < 0) return NULL;
    carrier_bell = (uint32_t *)p;
    Py_RETURN_NONE;
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

double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Sleep on the futex `word` while it still holds `seen`, at most until `end` (CLOCK_MONOTONIC
 * seconds). Returns 0 once `end` has passed, 1 after a wake-up, a change or a spurious return. */
int sleep_until(uint32_t *word, uint32_t seen, double end) {
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

/* Wait for the u32 sequence at `word` to reach `target`: `polls` yielding polls, then futex
 * sleeps on `word` until `seconds` have passed. 1: reached; 0: not yet. */
int await_seq(uint32_t *word, uint32_t target, long polls, double seconds) {
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

/* The waits' Python entries. */
PyMethodDef wait_methods[] = {
    {"fetch_add_u64", (PyCFunction)(void (*)(void))fetch_add_u64, METH_FASTCALL, "Atomic fetch-add on a u64; returns the old value."},
    {"load_u64", load_u64, METH_O, "Sequentially consistent load of a u64."},
    {"store_u64", (PyCFunction)(void (*)(void))store_u64, METH_FASTCALL, "Sequentially consistent store of a u64."},
    {"load_u32", load_u32, METH_O, "Sequentially consistent load of a u32."},
    {"store_u32", (PyCFunction)(void (*)(void))store_u32, METH_FASTCALL, "Sequentially consistent store of a u32."},
    {"cas_u64", (PyCFunction)(void (*)(void))cas_u64, METH_FASTCALL,
     "Atomic compare-and-swap on a u64 (one-sided atomic_compare_swap); returns the value found."},
    {"fence", fence, METH_NOARGS, "Full memory fence."},
    {"futex_wait", (PyCFunction)(void (*)(void))futex_wait, METH_FASTCALL, "Wait on a shared futex word."},
    {"futex_wake", (PyCFunction)(void (*)(void))futex_wake, METH_FASTCALL, "Wake waiters of a shared futex word."},
    {"wait_seq_u32", (PyCFunction)(void (*)(void))wait_seq_u32, METH_FASTCALL, "Wait for a u32 sequence flag."},
    {"seq_reached", (PyCFunction)(void (*)(void))seq_reached, METH_FASTCALL, "Has a u32 sequence number reached a target?"},
    {"set_sleepers", set_sleepers, METH_O, "Where this job counts the sleepers on communicator words."},
    {"watch_failures", watch_failures, METH_O, "Where this job records its first failure (H_FAILED_KIND)."},
    {"set_carrier_bell", set_carrier_bell, METH_O, "Where this host's carrier is rung (H_CARRIER_BELL; 0: one host)."},
    {NULL, NULL, 0, NULL},
};
