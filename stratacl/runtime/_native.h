/*
 * What the sources of stratacl.runtime._native share (internal; not installed). Each uses
 * the ones above it only:
 *
 *   _waits.c     atomics and fences, futex waits and wakes, the bounded waits
 *   _native.c    the descriptor readers the protocols share, and the constants
 *   _flightrec.c the flight recorder
 *   _agree.c     the communicators' collective protocol: barrier and call numbering, the
 *                agreement, the readiness scan, byte counts, point-to-point signals
 *   _p2pcall.c   one point-to-point call (p2p_core)
 *   _meshcall.c  the full-mesh call's state machine (mesh_start, mesh_advance)
 *   _maps.c      mmap at fixed addresses, hole punching, the parent-death signal
 *   _replay.c    the entries of calls described by records (mesh_call, mesh_resume, replay,
 *                p2p_replay), the barrier as a method and operations as methods
 *                (prepared_method); it uses the others, never the other way
 *   _module.c    the module: the method tables, the constants, the initialisers
 */
#ifndef STRATACL_NATIVE_H
#define STRATACL_NATIVE_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <linux/futex.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../collectives/_kernels.h"

/* A communicator hands its addresses over once, as an int64 array `cx`:
 *   [CX_COUNTER] barrier counter   [CX_GEN] futex word   [CX_ARRIVAL] this rank's arrival word
 *   [CX_N] members   [CX_ME] this rank's index
 *   [CX_TALLY] its T_* words   [CX_ROOTS] rooted calls per root   [CX_SENT], [CX_RECEIVED]
 *   point-to-point sequence numbers per peer   [CX_COUNTERS] its byte counters, CTR_*
 *   (the int64 arrays of runtime/communicator/_comm.py, all n long but the tally and the counters)
 *   [CX_BARRIERS] the rank's count of barriers completed natively (Runtime.native_calls)
 *   [CX_FLIGHT] the rank's flight recorder (0: none)   [CX_CTL] the control segment's base
 *   [CX_LOCAL_N] members on this rank's host (== CX_N on one host)   [CX_CARRIER] the host
 *   carrier's queue (runtime/services/_control.py, H_CARRIER; 0: the communicator spans no hosts;
 *   runtime/hosts/_carrier.py) [CX_CARRIER_ID] what this rank's entries in it name: its world rank
 *   * COMM_SLOTS + the communicator's slot + 1
 *   [CX_DESC + p*n + i] member i's descriptor, parity p
 * Descriptor fields are the F_* words of a descriptor in the control segment (runtime/services/_control.py).
 *
 * Every enumerator of this header is defined here only: _native exports each under its own name
 * (native_init in _native.c) and the Python side imports them from there (runtime/services/_control.py,
 * runtime/communicator/_comm.py, runtime/communicator/_p2p.py); tests/test_constants.py checks that none is missing. */
enum { CX_COUNTER, CX_GEN, CX_ARRIVAL, CX_N, CX_ME, CX_TALLY, CX_ROOTS, CX_SENT, CX_RECEIVED, CX_COUNTERS, CX_BARRIERS,
       CX_FLIGHT, CX_CTL, CX_LOCAL_N, CX_CARRIER, CX_CARRIER_ID, CX_DESC };
enum { CARRIER_QUEUE = 64 };     /* entries of a carrier's queue (runtime/services/_control.py) */
#define CARRIER_NO_READS (1ULL << 63)  /* an entry's mark: complete the barrier, read nothing */
enum { T_CALLS, T_SYNCS, T_NATIVE, T_WORDS };   /* calls, barrier numbers, native methods allowed */
enum { F_OP, F_DTYPE, F_COUNT, F_ROOT, F_REDOP, F_FLAGS, F_ADDR, F_NBYTES, F_SEG_VA, F_SEG_SIZE,
       F_SEG_OFF, F_EPOCH, F_AUX0, F_AUX1, F_AUX2, F_CALL, DESC_FIXED };

/* The flight recorder: a rank's last FLIGHT_ENTRIES collective calls, on any communicator, in
 * its region of the control segment (runtime/services/_control.py, Layout.flight), for the launcher to
 * read when a job fails. Word 0 counts the calls ever opened; entry s % FLIGHT_ENTRIES (after
 * FLIGHT_HEADER words) holds call s: FL_* words. flight_open writes one as a call publishes its
 * descriptor; every barrier this rank arrives at notes its number and time in the newest entry
 * of its communicator. FL_COMM is the communicator's barrier counter as an offset in the
 * control segment: whether barrier k has completed is that counter >= k * FL_N; the slot it is
 * in also lists the communicator's members (runtime/services/_control.py, Layout.slot_members). */
enum { FL_SEQ, FL_COMM, FL_N, FL_ME, FL_OP, FL_CALL, FL_COUNT, FL_NBYTES, FL_ROOT, FL_K_ENTRY, FL_K_LAST,
       FL_T_ENTER, FL_T_LAST, FL_DST, FL_SRC, FL_RECV_CALL, FL_WORDS };
/* A point-to-point call's entry (flight_p2p): FL_OP one of OP_* below, FL_K_ENTRY 0, FL_K_LAST 0
 * while it runs and FL_K_DONE once it completed; FL_DST, FL_SRC the members it sends to and
 * receives from (-1: none), FL_CALL and FL_RECV_CALL its sequence numbers with them. A
 * collective's entry has FL_DST = FL_SRC = -1. */
enum { FL_K_DONE = -1 };
/* The point-to-point operations' codes: a send descriptor's F_OP is OP_SEND (runtime/communicator/_p2p.py);
 * runtime/pipeline/_protocol.py names them beside the collectives' codes. */
enum { OP_SEND = 100, OP_RECV, OP_SENDRECV };
enum { FLIGHT_HEADER = 8, FLIGHT_ENTRIES = 32 };

/* A communicator's per-peer point-to-point words, (n, PX_WORDS) addresses (runtime/communicator/_p2p.py),
 * and the stages where p2p_core stops. */
enum { PX_SEND_DESC, PX_SEND_FLAG, PX_RECV_FLAG, PX_RECV_DESC, PX_RECV_STATUS, PX_RECV_DONE, PX_SENT_DONE,
       PX_SENT_STATUS, PX_WORDS };
enum { P2P_DONE, P2P_RECV_WAIT, P2P_RECV_CHECK, P2P_SEND_WAIT };

/* A full-mesh call's stages: where mesh_advance stops for its caller, and resumes (_meshcall.c);
 * and its departures. */
enum { MESH_DONE, MESH_ENTER_WAIT, MESH_DISAGREE, MESH_SOURCES, MESH_RUN_FIRST, MESH_MIDDLE_WAIT, MESH_RUN_SECOND,
       MESH_DEPART_WAIT, MESH_START };
enum { MESH_NO_DEPARTURE, MESH_BARRIER, MESH_ROOT_READER, MESH_ROOT };
enum { MESH_NOT_RUN = -1 };                        /* replay: nothing done (debug logging is on) */

/* A prepared sendrecv's parameters (p2p_replay in _replay.c; built by runtime/communicator/_p2p.py,
 * check_sendrecv): the send's DESC_FIXED descriptor fields, then PP_*; and its call tuple, Q_*. */
enum { PP_ME = DESC_FIXED, PP_DST, PP_SRC, PP_DTYPE, PP_COUNT, PP_ITEMSIZE, PP_OUT, PP_N, PP_SENDS, PP_RECVS, PP_CX,
       PP_PX, PP_BASES, PP_READY, PP_PLAN, PP_PLAN_ROWS, PP_BYTES, PP_LEN = PP_BYTES + 3 };
enum { Q_PARAMS, Q_CX, Q_PX, Q_BASES, Q_READY, Q_PLAN, Q_PARAMS_ADDR, Q_LEN };
/* A prepared full-mesh call's parameters, one row per call parity (replay in _replay.c; built by
 * communicator/_mesh.py, MeshDriver.record): the descriptor's DESC_FIXED fields, then RP_*; its call tuple, R_*. */
enum { RP_OWN = DESC_FIXED, RP_ONLY, RP_DTYPE, RP_REDOP, RP_DEPARTURE, RP_ROOT, RP_WORD, RP_OUT, RP_EAGER_FROM,
       RP_EAGER_BYTES, RP_COUNTED, RP_CALLER_PHASES, RP_CX, RP_READY, RP_BASES, RP_PLAN, RP_PLAN_ROWS, RP_PLAN2, RP_PLAN2_ROWS, RP_BYTES,
       RP_LEN = RP_BYTES + 6 };
enum { R_PARAMS, R_CX, R_READY, R_BASES, R_PLAN, R_PLAN2, R_DIVISOR, R_STATS, R_PARAMS_ADDR, R_LEN };
/* What a prepared method replays (prepared_method's kind). */
enum { METHOD_MESH, METHOD_SENDRECV };
/* What native code reads of a communicator: one tuple, Communicator._native_view, laid out by NV_*
 * (runtime/communicator/_comm.py): its native words (cx), the slow half of an entry that waited
 * or disagreed (SlotProtocol.arrived), the prepared calls' dict (PreparedCalls), and where a
 * replayed mesh call or sendrecv goes on in Python when it stops (MeshDriver.resume,
 * PointToPoint.replayed). */
enum { NV_CX, NV_ARRIVED, NV_PREPARED, NV_MESH_STOPPED, NV_P2P_STOPPED, NV_LEN };

/* The next point-to-point sequence number with `peer` (u32, wrapping): `which` CX_SENT for a
 * send to it, CX_RECEIVED for a receive from it. The one place they are numbered (p2p_replay,
 * and Python through next_seq). */
static inline uint32_t next_seq(const int64_t *cx, int which, int64_t peer) {
    return (uint32_t)++((int64_t *)(uintptr_t)cx[which])[peer];
}

extern const StrataKernelsApi *kernels;
int load_kernels(void);
int get_i64_buffer(PyObject *o, Py_buffer *view, int writable, const char *what);
int barrier(const int64_t *cx, uint64_t k, long polls, double seconds);
/* barrier with `mark` ORed into the entry the host's carrier gets (CARRIER_NO_READS: a call's
 * departure, after which nothing is pulled: the carrier reads no far bytes for it) */
int barrier_marked(const int64_t *cx, uint64_t k, long polls, double seconds, uint64_t mark);
void flight_open(const int64_t *cx, const int64_t *fields, uint64_t k);
uint64_t flight_p2p(const int64_t *cx, int64_t op, int64_t dst, uint32_t send_seq, int64_t src, uint32_t recv_seq,
                    int64_t count, int64_t nbytes);
void flight_close(const int64_t *cx, uint64_t seq);
int descriptors_agree(const int64_t *cx, int parity);
int p2p_core(const int64_t *w, int64_t n, long me, long dst, uint32_t send_seq, const int64_t *fields, long src,
             uint32_t recv_seq, int dtype, long long count, long long itemsize, int64_t out_addr,
             const int64_t *plan, Py_ssize_t rows, int64_t *b, const int64_t *rd, long polls, double seconds);
void count_moved(const int64_t *c, const int64_t moved[3], int64_t skipped);

/* A full-mesh call in flight (mesh_start, mesh_advance): its stage, call parity, the barrier
 * number it waits on, the root's departure target, and the bytes a phase skipped in place. */
typedef struct {
    int stage, parity;
    uint64_t k;
    uint32_t target;
    int64_t skipped;
} MeshState;
MeshState mesh_start(const int64_t *rows);
int mesh_advance(const int64_t *rows, MeshState *s, double divisor, long polls, double seconds, const char **err);

/* What the sources of the layer share (each defined once, in the file named). */
extern uint32_t *sleepers;             /* _waits.c: threads asleep on communicator words */
extern uint64_t *failure_word;         /* _waits.c: the job's failure word, once watched */

/* Wake the sleepers of a shared word; skipped while nobody sleeps (_waits.c, sleepers). */
static inline void wake_sleepers(uint32_t *word) {
    if (sleepers == NULL || __atomic_load_n(sleepers, __ATOMIC_SEQ_CST) != 0)
        syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

/* The launcher recorded a failure or began ending the job (_waits.c, failure_word). */
static inline int job_failed(void) {
    return failure_word != NULL && __atomic_load_n(failure_word, __ATOMIC_ACQUIRE) != 0;
}

/* u32 sequence numbers compared modulo 2^32. */
static inline int seq_after(uint32_t value, uint32_t target) { return (uint32_t)(value - target) < 0x80000000u; }

int parse_addr(PyObject *o, void **out);                                      /* _waits.c */
double now_s(void);                                                           /* _waits.c */
int sleep_until(uint32_t *word, uint32_t seen, double end);                   /* _waits.c */
void ring_carrier(void);                                                       /* _waits.c */
int await_seq(uint32_t *word, uint32_t target, long polls, double seconds);  /* _waits.c */
int read_fields(PyObject *o, int64_t out[DESC_FIXED], const char *what);      /* _native.c */
int64_t now_ns(void);                                                         /* _flightrec.c */
void flight_arrive(const int64_t *cx, uint64_t k);                            /* _flightrec.c */
void announce_send(void *desc, const int64_t fields[DESC_FIXED], uint32_t *flag, uint32_t seq);   /* _agree.c */
void announce_received(uint32_t *status_word, uint32_t status, uint32_t *done, uint32_t seq);     /* _agree.c */
long scan_sources(const int64_t *c, int parity, const int64_t *rd, int64_t *in, uint64_t own, long only,
                  const int64_t *need);                                       /* _agree.c */

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

/* The module (_module.c) is the sources' method tables and initialisers. */
extern PyMethodDef wait_methods[];     /* _waits.c: atomics, futexes, waits */
extern PyMethodDef agree_methods[];    /* _agree.c: barriers, agreement, readiness, counting */
extern PyMethodDef p2p_methods[];      /* _p2pcall.c: one point-to-point call */
extern PyMethodDef map_methods[];      /* _maps.c: mmap, addresses, the parent-death signal */
extern PyMethodDef record_methods[];   /* _replay.c: calls described by records */
int native_init(PyObject *module);     /* _native.c: the constants: 0 or -1 */
int replay_init(PyObject *module);     /* _replay.c: the barrier method, interned names: 0 or -1 */

#endif
