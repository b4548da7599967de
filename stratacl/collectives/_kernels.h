/*
 * The executor of compiled plans (_kernels.c), for other native modules: runtime/_native.c
 * runs a point-to-point receive's plan inside its single native call with it. Obtained with
 * PyCapsule_Import(STRATA_KERNELS_CAPSULE, 0).
 */
#ifndef STRATACL_KERNELS_H
#define STRATACL_KERNELS_H
#include <stdint.h>

#define STRATA_KERNELS_CAPSULE "stratacl.collectives._kernels._C_API"

/* The codes and layouts the collectives' Python shares with native code. Defined here only:
 * the _kernels module exports each (strata_kernels_constants) and Python imports them from it
 * (collectives/_reduce.py, _slices.py, _backend.py); tests/test_constants.py checks that every
 * enumerator below is exported. */
enum { T_BOOL = 1, T_U8, T_I8, T_I16, T_I32, T_I64, T_F16, T_F32, T_F64, T_U16, T_U32, T_U64 };  /* dtypes */
enum { OP_SUM = 1, OP_PROD, OP_MIN, OP_MAX, OP_AVG };                                        /* reduce ops */
/* A plan row: PLAN_COLUMNS int64 words. K_COPY (K_COPY_SHARED: every member reads the same
 * source) copies from (src rank, buffer, offset) to (dst rank, buffer, offset); K_GROUP opens a
 * reduction of the next `src rank` rows, K_SRC, into its destination. */
enum { K_COPY, K_GROUP, K_SRC, K_COPY_SHARED };
enum { COL_KIND, COL_SRC_RANK, COL_SRC_BUF, COL_SRC_OFF, COL_DST_RANK, COL_DST_BUF, COL_DST_OFF, COL_BYTES,
       PLAN_COLUMNS };
enum { BUF_IN, BUF_OUT, BUF_SCRATCH, BUFFERS };   /* rows of the (BUFFERS, n) member buffer table */
enum { CTR_LOCAL, CTR_PULLED, CTR_WRITTEN, COUNTERS };   /* a rank's byte counters (_backend.Counters) */

typedef struct {
    /* Check, then execute one phase: `rows` rows of 8 int64 (collectives/_backend.py) over
     * `bases`, the (3, n) member buffer table. Needs no GIL. NULL on success (with the bytes
     * of copies skipped in place in *skipped), else what was wrong with the plan. */
    const char *(*execute_plan)(const int64_t *plan, Py_ssize_t rows, const int64_t *bases, Py_ssize_t n,
                                int dtype, int op, double divisor, int64_t *skipped);
} StrataKernelsApi;

#endif
