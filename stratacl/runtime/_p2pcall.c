/*
 * One point-to-point call in one native call (p2p_core), and the kernels' table it runs
 * plans with (load_kernels).
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

/* ---- one point-to-point call in one native call ------------------------------------------
 * A communicator hands its per-peer words over once, as an int64 array `px` of (n, PX_WORDS)
 * addresses (communicator/_p2p.py). The protocol is the one communicator/_p2p.py describes; this is its common
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

/* The point-to-point call's Python entry. */
PyMethodDef p2p_methods[] = {
    {"p2p", (PyCFunction)(void (*)(void))p2p, METH_FASTCALL, "One point-to-point call's common case (communicator/_p2p.py)."},
    {NULL, NULL, 0, NULL},
};
