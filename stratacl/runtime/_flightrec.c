/*
 * The flight recorder (_native.h, FL_*): each rank's last calls and their progress, in the
 * control segment, written by the protocols and read by the launcher's root-cause block.
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

/* ---- the flight recorder (_native.h, FL_*) ---------------------------------------------- */
int64_t now_ns(void) {
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
void flight_arrive(const int64_t *cx, uint64_t k) {
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
