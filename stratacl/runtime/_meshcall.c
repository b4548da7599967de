/*
 * The full-mesh call: its protocol's state machine (mesh_start, mesh_advance), advanced
 * here and nowhere else; _replay.c runs it and Python resumes it.
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

/* ---- the full-mesh call: its protocol, advanced here and nowhere else ----------------------
 * A full-mesh call is described by a row of RP_* parameters per call parity (_native.h; built
 * by runtime/communicator/_mesh.py) and advanced by mesh_advance from a MeshState:
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
        /* nothing is pulled after it: across hosts, the carriers read no bytes for it */
        if (!barrier_marked(c, s->k, polls, seconds, CARRIER_NO_READS)) return s->stage = MESH_DEPART_WAIT;
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
