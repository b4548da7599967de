/*
 * The executor of compiled plans (_kernels.c), for other native modules: runtime/_native.c
 * runs a point-to-point receive's plan inside its single native call with it. Obtained with
 * PyCapsule_Import(STRATA_KERNELS_CAPSULE, 0).
 */
#ifndef STRATACL_KERNELS_H
#define STRATACL_KERNELS_H
#include <stdint.h>

#define STRATA_KERNELS_CAPSULE "stratacl.collectives._kernels._C_API"

typedef struct {
    /* Check, then execute one phase: `rows` rows of 8 int64 (collectives/_backend.py) over
     * `bases`, the (3, n) member buffer table. Needs no GIL. NULL on success (with the bytes
     * of copies skipped in place in *skipped), else what was wrong with the plan. */
    const char *(*execute_plan)(const int64_t *plan, Py_ssize_t rows, const int64_t *bases, Py_ssize_t n,
                                int dtype, int op, double divisor, int64_t *skipped);
} StrataKernelsApi;

#endif
