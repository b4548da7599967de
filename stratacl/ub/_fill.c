/*
 * Max-min fair rates by progressive filling (ub/_sharing.py, ``BandwidthSharing._fill``): the fabric
 * model's inner loop, called once per transfer that finishes in a phase.
 *
 *   fill(res, w, cap, tier_cap, active, x)
 *
 * res [F, K] int64: the resources transfer f crosses (column c, id in [0, R)); w [F, K]
 * float64: bytes of resource time per byte of f on it (0: f does not use that column);
 * cap [R] float64: each resource's capacity; tier_cap [F] float64: f's own cap; active [F]
 * bool: which transfers take part. x [F] float64 receives the rates (0 where not active).
 *
 * Every active transfer starts unfrozen; all unfrozen ones share one rising rate lam. A
 * resource fills at (cap - frozen load) / (its unfrozen weight); a transfer stops at its tier
 * cap. Each round: lam = the lowest fill level or tier cap; the transfers on resources whose
 * level is within 1e-12 of lam, and those whose cap is, freeze at lam; their weights leave the
 * resources' unfrozen sums and their load joins the frozen load. A round costs the resources
 * plus what it freezes, so a fill costs R x rounds + F x K, where recomputing every sum each
 * round cost F x K x rounds (hundreds of rounds: every port has its own level).
 *
 * A resource's unfrozen weight is kept as a compensated (Neumaier) sum, so that after many
 * transfers have left it, it is the sum of those still on it to within an ulp or two instead
 * of carrying the rounding of every subtraction; the rates then agree with a recomputation
 * of every sum each round (tests/test_fabric.py keeps that formulation as the reference) to
 * far inside the 1e-12 the rounds already tolerate. Deterministic: the same arrays give
 * bit-identical rates.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>

/* s + c += v, Neumaier's compensated summation */
static inline void add(double *s, double *c, double v) {
    double t = *s + v;
    *c += fabs(*s) >= fabs(v) ? (*s - t) + v : (v - t) + *s;
    *s = t;
}

typedef struct {
    double cap;
    int64_t flow;
} ByCap;

static int by_cap_cmp(const void *a, const void *b) {
    const ByCap *x = a, *y = b;
    if (x->cap < y->cap) return -1;
    if (x->cap > y->cap) return 1;
    return (x->flow > y->flow) - (x->flow < y->flow);      /* stable: ties in transfer order */
}

static int int64_cmp(const void *a, const void *b) {
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

static int get(PyObject *obj, Py_buffer *view, const char *what, Py_ssize_t item, int writable) {
    if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0)) < 0) return -1;
    if (view->itemsize != item) {
        PyErr_Format(PyExc_TypeError, "fill: %s has items of %zd bytes, expected %zd", what, view->itemsize, item);
        PyBuffer_Release(view);
        return -1;
    }
    return 0;
}

static PyObject *fill(PyObject *self, PyObject *args) {
    PyObject *o_res, *o_w, *o_cap, *o_tier, *o_active, *o_x, *result = NULL;
    Py_ssize_t K;
    if (!PyArg_ParseTuple(args, "OOnOOOO", &o_res, &o_w, &K, &o_cap, &o_tier, &o_active, &o_x)) return NULL;
    Py_buffer vres, vw, vcap, vtier, vact, vx;
    if (get(o_res, &vres, "res", 8, 0) < 0) return NULL;
    if (get(o_w, &vw, "w", 8, 0) < 0) goto e0;
    if (get(o_cap, &vcap, "cap", 8, 0) < 0) goto e1;
    if (get(o_tier, &vtier, "tier_cap", 8, 0) < 0) goto e2;
    if (get(o_active, &vact, "active", 1, 0) < 0) goto e3;
    if (get(o_x, &vx, "x", 8, 1) < 0) goto e4;

    const int64_t *res = vres.buf;
    const double *w = vw.buf, *cap = vcap.buf, *tier = vtier.buf;
    const char *active = vact.buf;
    double *x = vx.buf;
    Py_ssize_t F = vact.len, R = vcap.len / 8;
    if (K < 1 || vres.len / 8 != F * K || vw.len / 8 != F * K || vtier.len / 8 != F || vx.len / 8 != F) {
        PyErr_SetString(PyExc_ValueError, "fill: res and w must be [F, K], tier_cap, active and x [F]");
        goto e5;
    }
    for (Py_ssize_t i = 0; i < F * K; i++) {
        if (res[i] < 0 || res[i] >= R) {
            PyErr_Format(PyExc_ValueError, "fill: resource id %lld outside [0, %zd)", (long long)res[i], R);
            goto e5;
        }
    }

    double *wsum = calloc(R, sizeof(double)), *load = calloc(R, sizeof(double));
    double *dl = calloc(R, sizeof(double)), *wc = calloc(R, sizeof(double));
    int64_t *users = calloc(R, sizeof(int64_t)), *start = calloc(R + 1, sizeof(int64_t));
    int64_t *by_r = malloc((F * K + 1) * sizeof(int64_t)), *stop = malloc((F + 1) * sizeof(int64_t));
    int64_t *touched = malloc((R + 1) * sizeof(int64_t)), *mark = calloc(F + 1, sizeof(int64_t));
    char *free_ = malloc(F + 1), *seen = calloc(R + 1, 1);
    ByCap *order = malloc((F + 1) * sizeof(ByCap));
    if (!wsum || !load || !dl || !wc || !users || !start || !by_r || !stop || !touched || !mark || !free_ || !seen ||
        !order) {
        PyErr_NoMemory();
        goto done;
    }
    Py_ssize_t left = 0, nc = 0;
    for (Py_ssize_t f = 0; f < F; f++) {
        x[f] = 0.0;
        free_[f] = active[f] != 0;
        if (!free_[f]) continue;
        left++;
        order[nc].cap = tier[f];
        order[nc++].flow = f;
        for (Py_ssize_t c = 0; c < K; c++) {
            double wf = w[f * K + c];
            if (wf > 0) {
                int64_t r = res[f * K + c];
                add(&wsum[r], &wc[r], wf);
                users[r]++;
                start[r + 1]++;
            }
        }
    }
    for (Py_ssize_t r = 0; r < R; r++) start[r + 1] += start[r];
    {
        int64_t *fillpos = touched;          /* scratch: next slot per resource */
        for (Py_ssize_t r = 0; r < R; r++) fillpos[r] = start[r];
        for (Py_ssize_t f = 0; f < F; f++) {
            if (!free_[f]) continue;
            for (Py_ssize_t c = 0; c < K; c++)
                if (w[f * K + c] > 0) by_r[fillpos[res[f * K + c]]++] = f;
        }
    }
    qsort(order, nc, sizeof(ByCap), by_cap_cmp);
    Py_ssize_t low = 0;
    int64_t round = 0;
    const double slack = 1 + 1e-12;
    while (left > 0) {
        round++;
        while (!free_[order[low].flow]) low++;
        double lmin = INFINITY;
        for (Py_ssize_t r = 0; r < R; r++) {
            if (users[r] > 0) {
                double level = (cap[r] - load[r]) / (wsum[r] + wc[r]);
                if (level < lmin) lmin = level;
            }
        }
        double tc = order[low].cap;
        double lam = tc < lmin ? tc : lmin;         /* Python's min(lmin, tc): the first on a tie */
        double thr = lam * slack;
        Py_ssize_t ns = 0;
        for (Py_ssize_t r = 0; r < R; r++) {
            if (users[r] > 0 && (cap[r] - load[r]) / (wsum[r] + wc[r]) <= thr) {
                for (int64_t i = start[r]; i < start[r + 1]; i++) {
                    int64_t f = by_r[i];
                    if (free_[f] && mark[f] != round) {
                        mark[f] = round;
                        stop[ns++] = f;
                    }
                }
            }
        }
        for (Py_ssize_t i = low; i < nc && order[i].cap <= thr; i++) {
            int64_t f = order[i].flow;
            if (free_[f] && mark[f] != round) {
                mark[f] = round;
                stop[ns++] = f;
            }
        }
        qsort(stop, ns, sizeof(int64_t), int64_cmp);
        Py_ssize_t nt = 0;
        for (Py_ssize_t i = 0; i < ns; i++) {
            int64_t f = stop[i];
            x[f] = lam;
            free_[f] = 0;
            for (Py_ssize_t c = 0; c < K; c++) {
                double wf = w[f * K + c];
                if (wf > 0) {
                    int64_t r = res[f * K + c];
                    if (!seen[r]) {
                        seen[r] = 1;
                        touched[nt++] = r;
                    }
                    dl[r] += wf * lam;
                    add(&wsum[r], &wc[r], -wf);
                    users[r]--;
                }
            }
        }
        for (Py_ssize_t i = 0; i < nt; i++) {
            int64_t r = touched[i];
            load[r] += dl[r];
            dl[r] = 0;
            seen[r] = 0;
        }
        left -= ns;
        if (ns == 0) {
            PyErr_SetString(PyExc_RuntimeError, "fill: a round froze nothing (capacities must be positive)");
            goto done;
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    free(wsum); free(load); free(dl); free(wc); free(users); free(start); free(by_r); free(stop); free(touched);
    free(mark); free(free_); free(seen); free(order);
e5: PyBuffer_Release(&vx);
e4: PyBuffer_Release(&vact);
e3: PyBuffer_Release(&vtier);
e2: PyBuffer_Release(&vcap);
e1: PyBuffer_Release(&vw);
e0: PyBuffer_Release(&vres);
    return result;
}

static PyMethodDef methods[] = {
    {"fill", fill, METH_VARARGS, "fill(res, w, K, cap, tier_cap, active, x): max-min fair rates into x"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fill", "Progressive filling (ub/_sharing.py).", -1,
                                    methods};

PyMODINIT_FUNC PyInit__fill(void) { return PyModule_Create(&module); }
