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
 * The layer is split by concept, each file depending on those above it only through
 * _native.h: _waits.c (atomics, futexes, bounded waits), _flightrec.c (the flight recorder),
 * _agree.c (barriers, agreement, readiness, counting), _p2pcall.c (one point-to-point call),
 * _meshcall.c (the full-mesh state machine), _maps.c (mmap and the parent-death signal); this
 * file holds the descriptor readers they share and the constants. The Python entries of calls
 * described by records (mesh calls, replays, methods) are in _replay.c; _module.c makes the
 * module from all of them.
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
int read_fields(PyObject *o, int64_t out[DESC_FIXED], const char *what) {
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

/* Every enumerator of _native.h, exported under its own name: Python's one source for them. */
#define CONSTANT(name) {#name, name}
static const struct { const char *name; long value; } constants[] = {
    CONSTANT(CX_COUNTER), CONSTANT(CX_GEN), CONSTANT(CX_ARRIVAL), CONSTANT(CX_N), CONSTANT(CX_ME), CONSTANT(CX_TALLY),
    CONSTANT(CX_ROOTS), CONSTANT(CX_SENT), CONSTANT(CX_RECEIVED), CONSTANT(CX_COUNTERS), CONSTANT(CX_BARRIERS),
    CONSTANT(CX_FLIGHT), CONSTANT(CX_CTL), CONSTANT(CX_LOCAL_N), CONSTANT(CX_CARRIER), CONSTANT(CX_CARRIER_ID), CONSTANT(CX_DESC), CONSTANT(CARRIER_QUEUE),
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
    CONSTANT(NV_CX), CONSTANT(NV_ARRIVED), CONSTANT(NV_PREPARED), CONSTANT(NV_MESH_STOPPED), CONSTANT(NV_P2P_STOPPED),
    CONSTANT(NV_LEN),
    CONSTANT(MAP_FIXED_NOREPLACE),
};
#undef CONSTANT

/* Add the constants to the module: 0, or -1 with an exception set. */
int native_init(PyObject *m) {
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (PyModule_AddIntConstant(m, constants[i].name, constants[i].value) < 0) return -1;
    /* an unsigned 64-bit mark, past what a long holds */
    PyObject *mark = PyLong_FromUnsignedLongLong(CARRIER_NO_READS);
    if (mark == NULL || PyModule_AddObject(m, "CARRIER_NO_READS", mark) < 0) {
        Py_XDECREF(mark);
        return -1;
    }
    return 0;
}
