/*
 * Calls described by records, and the common case of a repeated call with no Python: the
 * barrier as a method, every full-mesh call's entry (mesh_call, mesh_resume; a prepared one's
 * record is replayed), a prepared sendrecv, and the prepared operations as methods. Part of
 * stratacl.runtime._native (see _native.h); communicator/_mesh.py and _p2p.py build the records.
 *
 *   comm.op(arrays, scalars)       PreparedMethod (operations as methods)
 *     -> key, prepared entry, identity and layout test          else: the Python operation
 *     -> replay (full mesh) or p2p_replay (sendrecv)
 *          -> mesh_start, mesh_advance / p2p_core (_meshcall.c, _p2pcall.c)
 *          -> a stop where Python must act: the communicator's NV_MESH_STOPPED / NV_P2P_STOPPED
 * A communicator is read through its _native_view, one tuple laid out by NV_* (_native.h).
 */
#include "_native.h"

#include <stddef.h>
#include <string.h>

/* numpy's array struct is read directly (shape, strides, dtype, flags): the attributes would
 * build tuples and a flags object on every call. Only the struct's accessors are used, no
 * numpy C API table, so no import_array. */
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/ndarraytypes.h>

/* ---- the barrier as a method ----------------------------------------------------------------
 * Communicator.barrier is `barrier_method`, bound like a Python function (an instancemethod).
 * At N = 32 on two cores every microsecond of a rank's Python costs about 16 of the barrier's,
 * so the common case, `comm.barrier()` with no keywords, no worker thread, no modeled clock (the
 * communicator's T_NATIVE word) and no debug logging, is all here: number the call and the
 * barrier (its T_CALLS and T_SYNCS words), publish the descriptor {op, call}, arrive, wait one
 * slice, compare, count the call (the rank's word at CX_BARRIERS). Anything else calls the Python
 * operation (set_barrier's `slow`); a wait past the slice or a disagreement calls the
 * communicator's NV_ARRIVED("barrier", parity, k, status). */
static PyObject *debug_check, *debug_level, *debug_cache, *barrier_slow;
static PyObject *s_view, *s_barrier, *s_bytes_eager;

/* Item `i` (NV_*) of what native code reads of communicator `comm`, its _native_view: a new
 * reference, or NULL with an exception set. */
static PyObject *view_item(PyObject *comm, int i) {
    PyObject *v = PyObject_GetAttr(comm, s_view);
    if (v == NULL) return NULL;
    if (!PyTuple_Check(v) || PyTuple_GET_SIZE(v) != NV_LEN) {
        Py_DECREF(v);
        PyErr_SetString(PyExc_TypeError, "a communicator's _native_view must be a tuple of NV_LEN items");
        return NULL;
    }
    PyObject *item = Py_NewRef(PyTuple_GET_ITEM(v, i));
    Py_DECREF(v);
    return item;
}

/* set_barrier(op_code, polls, seconds, debug_check, debug_level, debug_cache, slow): the
 * barrier's operation code (F_OP), its yielding polls and the wait before Python takes over,
 * the logging check (debug_check(debug_level) true: take the Python path, which logs), with
 * the dict in which the logger caches that answer (None: none), read first: calling the check
 * is a Python call on every operation; and the Python operation, called for anything else. */
static int64_t barrier_code;
static long barrier_polls;
static double barrier_seconds;

static PyObject *set_barrier(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 7) {
        PyErr_SetString(PyExc_TypeError, "set_barrier(op_code, polls, seconds, debug_check, debug_level, debug_cache, slow)");
        return NULL;
    }
    barrier_code = PyLong_AsLongLong(args[0]);
    barrier_polls = PyLong_AsLong(args[1]);
    barrier_seconds = PyFloat_AsDouble(args[2]);
    if (PyErr_Occurred()) return NULL;
    Py_INCREF(args[3]); Py_INCREF(args[4]);
    Py_XSETREF(debug_check, args[3]);
    Py_XSETREF(debug_level, args[4]);
    Py_XSETREF(debug_cache, PyDict_Check(args[5]) ? Py_NewRef(args[5]) : NULL);
    Py_XSETREF(barrier_slow, Py_NewRef(args[6]));
    Py_RETURN_NONE;
}

/* 1 if debug logging is on, 0 if not (or not set up), -1 with an exception set. */
static int debugging(void) {
    if (debug_check == NULL) return 0;
    if (debug_cache != NULL) {
        PyObject *known = PyDict_GetItemWithError(debug_cache, debug_level);     /* borrowed */
        if (known == Py_True) return 1;
        if (known == Py_False) return 0;
        if (PyErr_Occurred()) return -1;
    }
    PyObject *v = PyObject_CallOneArg(debug_check, debug_level);
    int debug = v == NULL ? -1 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    return debug;
}

/* counts[key] += d (from 0). 0, or -1 with an exception set. */
static int dict_add(PyObject *counts, PyObject *key, long long d) {
    PyObject *old = PyDict_GetItemWithError(counts, key);
    long long before = old == NULL ? 0 : PyLong_AsLongLong(old);
    PyObject *now = PyErr_Occurred() ? NULL : PyLong_FromLongLong(before + d);
    int rc = now == NULL ? -1 : PyDict_SetItem(counts, key, now);
    Py_XDECREF(now);
    return rc;
}

static PyObject *barrier_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    if (nargs < 1) { PyErr_SetString(PyExc_TypeError, "barrier: needs the communicator"); return NULL; }
    PyObject *comm = args[0];
    Py_buffer cx;
    const int64_t *c = NULL;
    if (nargs == 1 && (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) && debug_check != NULL) {
        PyObject *cxo = view_item(comm, NV_CX);
        if (cxo == NULL) return NULL;
        int rc = get_i64_buffer(cxo, &cx, 0, "barrier");
        Py_DECREF(cxo);
        if (rc < 0) return NULL;
        c = (const int64_t *)cx.buf;
        int debug = ((const int64_t *)(uintptr_t)c[CX_TALLY])[T_NATIVE] ? debugging() : 1;
        if (debug) {
            PyBuffer_Release(&cx);
            if (debug < 0) return NULL;
            c = NULL;
        }
    }
    if (c == NULL) {
        if (barrier_slow == NULL) { PyErr_SetString(PyExc_RuntimeError, "barrier: set_barrier was not called"); return NULL; }
        return PyObject_Vectorcall(barrier_slow, args, nargs, kwnames);
    }
    int64_t *t = (int64_t *)(uintptr_t)c[CX_TALLY];
    int64_t fields[DESC_FIXED] = {0};
    fields[F_OP] = barrier_code;
    uint64_t call = (uint64_t)++t[T_CALLS], k = (uint64_t)++t[T_SYNCS];
    fields[F_CALL] = (int64_t)call;
    int parity = (int)(call & 1), rc;
    memcpy((int64_t *)(uintptr_t)c[CX_DESC + parity * c[CX_N] + c[CX_ME]], fields, DESC_FIXED * 8);
    flight_open(c, fields, k);
    Py_BEGIN_ALLOW_THREADS
    if (!barrier(c, k, barrier_polls, barrier_seconds)) rc = 1;
    else rc = descriptors_agree(c, parity) ? 0 : 2;
    Py_END_ALLOW_THREADS
    if (rc) {
        PyObject *a = Py_BuildValue("(OiKi)", s_barrier, parity, (unsigned long long)k, rc);
        PyObject *arrived = a == NULL ? NULL : view_item(comm, NV_ARRIVED);
        PyObject *r = arrived == NULL ? NULL : PyObject_Call(arrived, a, NULL);
        Py_XDECREF(a);
        Py_XDECREF(arrived);
        if (r == NULL) { PyBuffer_Release(&cx); return NULL; }
        Py_DECREF(r);
    }
    ++*(int64_t *)(uintptr_t)c[CX_BARRIERS];
    PyBuffer_Release(&cx);
    Py_RETURN_NONE;
}

/* ---- a prepared sendrecv, replayed --------------------------------------------------------
 * p2p_replay(comm, call) -> None once done, else (stage, send_seq, recv_seq, flight entry)
 * sendrecv repeated on the same arrays and peers (runtime/communicator/_p2p.py, check_sendrecv): number
 * the send and the receive (the communicator's words at CX_SENT and CX_RECEIVED), then
 * p2p_core, the receive's byte counts and both halves' call counts. A stage other than
 * P2P_DONE is returned with the sequence numbers and the call's flight entry (flight_p2p), for
 * the Python path to go on from (and close the entry).
 *   call = (params, cx, px, bases, ready, plan, params' address)
 *   params (int64): the send's DESC_FIXED fields (F_CALL: its sequence number, set here), then PP_*
 *   (_native.h) */
/* PP_N: members; PP_SENDS, PP_RECVS: the rank's words counting sends and receives completed
 * natively (Runtime.native_calls); PP_CX .. PP_PLAN_ROWS: the addresses of the arrays `call`
 * holds (cx, px, bases, ready, the plan's table: 0 for none) and the table's rows, checked when
 * the call was built */

/* The parameters of a replay's call tuple (`at`: the index of their address), NULL with an
 * exception set if it is not such a tuple. */
static const int64_t *call_params(PyObject *call, Py_ssize_t len, Py_ssize_t at, const char *what) {
    if (!PyTuple_Check(call) || PyTuple_GET_SIZE(call) != len) {
        PyErr_Format(PyExc_TypeError, "%s: call is not the tuple the communicator builds", what);
        return NULL;
    }
    const int64_t *p = (const int64_t *)PyLong_AsVoidPtr(PyTuple_GET_ITEM(call, at));
    return p == NULL && !PyErr_Occurred() ? (PyErr_Format(PyExc_ValueError, "%s: no parameters", what), NULL) : p;
}

static PyObject *p2p_replay_impl(PyObject *call) {
    if (load_kernels() < 0) return NULL;
    const int64_t *p = call_params(call, Q_LEN, Q_PARAMS_ADDR, "p2p_replay");
    if (p == NULL) return NULL;
    Py_ssize_t n = (Py_ssize_t)p[PP_N];
    const int64_t *c = (const int64_t *)(uintptr_t)p[PP_CX];
    if (c[CX_N] != n || p[PP_ME] < 0 || p[PP_ME] >= n || p[PP_DST] < 0 || p[PP_DST] >= n || p[PP_SRC] < 0 ||
        p[PP_SRC] >= n) {
        PyErr_SetString(PyExc_ValueError, "p2p_replay: inconsistent call");
        return NULL;
    }
    uint32_t send_seq = next_seq(c, CX_SENT, p[PP_DST]), recv_seq = next_seq(c, CX_RECEIVED, p[PP_SRC]);
    int64_t fields[DESC_FIXED];
    memcpy(fields, p, sizeof fields);
    fields[F_CALL] = send_seq;
    uint64_t entry = flight_p2p(c, OP_SENDRECV, p[PP_DST], send_seq, p[PP_SRC], recv_seq, p[PP_COUNT],
                                p[PP_COUNT] * p[PP_ITEMSIZE]);
    int stage;
    Py_BEGIN_ALLOW_THREADS
    stage = p2p_core((const int64_t *)(uintptr_t)p[PP_PX], n, (long)p[PP_ME], (long)p[PP_DST], send_seq, fields,
                     (long)p[PP_SRC], recv_seq, (int)p[PP_DTYPE], p[PP_COUNT], p[PP_ITEMSIZE], p[PP_OUT],
                     (const int64_t *)(uintptr_t)p[PP_PLAN], p[PP_PLAN_ROWS], (int64_t *)(uintptr_t)p[PP_BASES],
                     (const int64_t *)(uintptr_t)p[PP_READY], barrier_polls, barrier_seconds);
    Py_END_ALLOW_THREADS
    if (stage == P2P_DONE || stage == P2P_SEND_WAIT) {        /* received */
        count_moved(c, p + PP_BYTES, 0);
        ++*(int64_t *)(uintptr_t)p[PP_RECVS];
    }
    if (stage != P2P_DONE)
        return Py_BuildValue("(iLLK)", stage, (long long)send_seq, (long long)recv_seq, (unsigned long long)entry);
    ++*(int64_t *)(uintptr_t)p[PP_SENDS];
    flight_close(c, entry);
    Py_RETURN_NONE;
}

static PyObject *p2p_replay(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "p2p_replay(comm, call)"); return NULL; }
    return p2p_replay_impl(args[1]);
}

/* ---- full-mesh calls: the Python entries of the mesh machine (_meshcall.c, mesh_advance) ------
 * mesh_call(call) -> None once done, else the state (stage, parity, k, target) it stopped at
 * mesh_resume(call, state, skipped) -> the same, from a stop the caller has dealt with
 *   (`skipped`: the bytes a phase the caller ran found in place)
 * replay(comm, call) -> mesh_call's result, or (MESH_NOT_RUN, ...) with nothing done when
 *   debug logging is on: then the operation's Python path runs, which logs the descriptor
 *   call = (params, cx, ready, bases, plan, plan2, divisor, stats, params' address): R_*
 *   params (int64, one row per call parity): the descriptor's DESC_FIXED fields (F_CALL set
 *   by mesh_start), then RP_* (_native.h); the rows differ only where an eager input has a
 *   slot per parity. A call's record is built once by runtime/communicator/_mesh.py (for a prepared call,
 *   once for all its repetitions), and every full-mesh call runs through here. */

static PyObject *mesh_advance_from(PyObject *call, const int64_t *rows, MeshState *s) {
    double divisor = PyFloat_AsDouble(PyTuple_GET_ITEM(call, R_DIVISOR));
    if (divisor == -1.0 && PyErr_Occurred()) return NULL;
    const char *err;
    Py_BEGIN_ALLOW_THREADS
    mesh_advance(rows, s, divisor, barrier_polls, barrier_seconds, &err);
    Py_END_ALLOW_THREADS
    if (err != NULL) {
        PyErr_Format(PyExc_ValueError, "mesh call: bad plan: %s", err);
        return NULL;
    }
    if (s->stage == MESH_DONE) Py_RETURN_NONE;
    return Py_BuildValue("(iiKk)", s->stage, s->parity, (unsigned long long)s->k, (unsigned long)s->target);
}

static PyObject *mesh_call_impl(PyObject *call) {
    if (load_kernels() < 0) return NULL;
    const int64_t *p = call_params(call, R_LEN, R_PARAMS_ADDR, "mesh_call");
    if (p == NULL) return NULL;
    const int64_t *c = (const int64_t *)(uintptr_t)p[RP_CX];
    for (int parity = 0; parity < 2; parity++) {
        const int64_t *row = p + parity * RP_LEN;
        if (row[RP_DEPARTURE] < MESH_NO_DEPARTURE || row[RP_DEPARTURE] > MESH_ROOT || row[RP_ROOT] < 0 ||
            row[RP_ROOT] >= c[CX_N]) {
            PyErr_SetString(PyExc_ValueError, "mesh_call: inconsistent call");
            return NULL;
        }
    }
    MeshState s = mesh_start(p);
    const int64_t *row = p + s.parity * RP_LEN;
    if (row[RP_EAGER_BYTES] > 0) {     /* published, not yet arrived: nobody reads the slot yet */
        memcpy((void *)(uintptr_t)row[RP_OWN], (const void *)(uintptr_t)row[RP_EAGER_FROM], (size_t)row[RP_EAGER_BYTES]);
        if (dict_add(PyTuple_GET_ITEM(call, R_STATS), s_bytes_eager, row[RP_EAGER_BYTES]) < 0) return NULL;
    }
    return mesh_advance_from(call, p, &s);
}

static PyObject *mesh_call(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 1) { PyErr_SetString(PyExc_TypeError, "mesh_call(call)"); return NULL; }
    return mesh_call_impl(args[0]);
}

static PyObject *mesh_resume(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 3) { PyErr_SetString(PyExc_TypeError, "mesh_resume(call, state, skipped)"); return NULL; }
    const int64_t *p = call_params(args[0], R_LEN, R_PARAMS_ADDR, "mesh_resume");
    if (p == NULL) return NULL;
    MeshState s = {0};
    unsigned long long k;
    unsigned long target;
    long long skipped = PyLong_AsLongLong(args[2]);
    if ((skipped == -1 && PyErr_Occurred()) || !PyArg_ParseTuple(args[1], "iiKk", &s.stage, &s.parity, &k, &target))
        return NULL;
    if (s.parity != 0 && s.parity != 1) { PyErr_SetString(PyExc_ValueError, "mesh_resume: bad state"); return NULL; }
    s.k = k;
    s.target = (uint32_t)target;
    s.skipped = skipped;
    return mesh_advance_from(args[0], p, &s);
}

static PyObject *replay_impl(PyObject *call) {
    int debug = debugging();
    if (debug < 0) return NULL;
    if (debug) return Py_BuildValue("(iiKk)", MESH_NOT_RUN, 0, 0ULL, 0UL);
    return mesh_call_impl(call);
}

static PyObject *replay(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 2) { PyErr_SetString(PyExc_TypeError, "replay(comm, call)"); return NULL; }
    return replay_impl(args[1]);
}

/* ---- operations as methods ---------------------------------------------------------------
 * A prepared call still paid for its Python around the replay: the collective wrapper, the
 * operation's frame, the key, the lookup and the identity and layout test. Each is cheap alone
 * (about 1 us together in a quiet process) but with 32 ranks on two cores every switch leaves
 * the interpreter's working set cold, and they came to about 5 us of CPU per rank and call.
 * A PreparedMethod is the operation's common case as the method itself (bound like a
 * function, through an instancemethod): positional arguments only, no worker thread, no
 * modeled clock. It builds the key the operation builds, finds the entry in the prepared calls
 * (the communicator's NV_PREPARED),
 * tests it as PreparedCall.holds does and runs its replay; anything else (keywords, a first
 * call, a changed array, a call that cannot be replayed) calls the Python operation, and a
 * replay that stops early goes on in Python (NV_MESH_STOPPED, NV_P2P_STOPPED).
 *   spec: one letter per parameter, 'a' an array (keyed by identity, tested by layout), 's' a
 *   scalar (keyed by value: int or str exactly, else the Python operation). */
#define METHOD_MAX_PARAMS 4

/* The last entry found is kept, as what the method reads of it (its weak references and
 * layouts, the call to replay and, for a mesh call, its MeshCall; an entry's fields never change),
 * with a weak reference to its communicator and the call's parameters: a loop that repeats one
 * call finds it without building the key, looking it up or reading an attribute. The arrays
 * are kept as plain pointers, compared by identity only (the entry's weak references then prove
 * they are the entry's arrays); the scalars are kept as references, so that a pointer can never
 * stand for a different value. */
typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *name, *defaults, *wrapped, *params;
    PyObject *last_refs, *last_layouts, *last_call, *last_rp, *last_comm, *last_params[METHOD_MAX_PARAMS];
    char spec[METHOD_MAX_PARAMS + 1];
    int nparams, kind;
} PreparedMethod;

static PyObject *s_refs, *s_layouts, *s_args, *s_replay, *s_call;

static PyTypeObject *ndarray_type;        /* numpy.ndarray, set by prepared_method */

/* 1 if tuple `t` holds exactly the nd integers v, 0 if not, -1 with an exception set. */
static int tuple_is(PyObject *t, const npy_intp *v, int nd) {
    if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != nd) return 0;
    for (int i = 0; i < nd; i++) {
        Py_ssize_t x = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, i));
        if (x == -1 && PyErr_Occurred()) return -1;
        if (x != v[i]) return 0;
    }
    return 1;
}

/* 1 if array `a` still has `layout` (_prepared._layout: shape, strides, dtype, writeable), 0 if
 * not, -1 with an exception set. */
static int layout_holds(PyObject *a, PyObject *layout) {
    if (!PyObject_TypeCheck(a, ndarray_type) || !PyTuple_Check(layout) || PyTuple_GET_SIZE(layout) != 4) return 0;
    PyArrayObject *arr = (PyArrayObject *)a;
    int nd = PyArray_NDIM(arr), ok;
    if ((ok = tuple_is(PyTuple_GET_ITEM(layout, 0), PyArray_DIMS(arr), nd)) != 1) return ok;
    if ((ok = tuple_is(PyTuple_GET_ITEM(layout, 1), PyArray_STRIDES(arr), nd)) != 1) return ok;
    PyObject *dtype = (PyObject *)PyArray_DESCR(arr), *want = PyTuple_GET_ITEM(layout, 2);
    if (dtype != want && (ok = PyObject_RichCompareBool(dtype, want, Py_EQ)) != 1) return ok;
    PyObject *writeable = PyArray_FLAGS(arr) & NPY_ARRAY_WRITEABLE ? Py_True : Py_False;
    return PyTuple_GET_ITEM(layout, 3) == writeable;
}

/* PreparedCall.holds, on an entry's weak references and layouts: every array is the entry's,
 * with the same shape, strides, dtype and writability. */
static int entry_holds(PyObject *refs, PyObject *layouts, PyObject *const *arrays, int n) {
    if (!PyTuple_Check(refs) || !PyTuple_Check(layouts) || PyTuple_GET_SIZE(refs) != n || PyTuple_GET_SIZE(layouts) != n)
        return 0;
    int ok = 1;
    for (int i = 0; ok == 1 && i < n; i++) {
        if (PyWeakref_GetObject(PyTuple_GET_ITEM(refs, i)) != arrays[i]) ok = 0;
        else ok = layout_holds(arrays[i], PyTuple_GET_ITEM(layouts, i));
    }
    return ok;
}

/* 1 if this call has the parameters of the last entry found, on the same communicator. */
static int same_as_last(PreparedMethod *m, PyObject *comm, PyObject *const *params) {
    if (m->last_refs == NULL || PyWeakref_GetObject(m->last_comm) != comm) return 0;
    for (int i = 0; i < m->nparams; i++) {
        if (params[i] == m->last_params[i]) continue;
        if (m->spec[i] == 'a' || Py_TYPE(params[i]) != Py_TYPE(m->last_params[i]) ||
            PyObject_RichCompareBool(params[i], m->last_params[i], Py_EQ) != 1) {
            PyErr_Clear();
            return 0;
        }
    }
    return 1;
}

/* Remember an entry found for `comm` and `params` (NULL comm: forget the last one). What was
 * remembered before is released only once the method holds the new entry, since releasing
 * an object can run Python code that calls the method again. */
static void remember(PreparedMethod *m, PyObject *comm, PyObject *const *params, PyObject *refs, PyObject *layouts,
                     PyObject *call, PyObject *rp) {
    PyObject *ref = comm == NULL ? NULL : PyWeakref_NewRef(comm, NULL);
    if (comm != NULL && ref == NULL) PyErr_Clear();      /* not weakly referenceable: forget */
    PyObject *old[5 + METHOD_MAX_PARAMS] = {m->last_comm, m->last_refs, m->last_layouts, m->last_call, m->last_rp};
    for (int i = 0; i < m->nparams; i++) {
        old[5 + i] = m->spec[i] == 's' ? m->last_params[i] : NULL;
        m->last_params[i] = ref == NULL ? NULL : m->spec[i] == 's' ? Py_NewRef(params[i]) : params[i];
    }
    m->last_comm = ref;
    m->last_refs = ref == NULL ? NULL : Py_NewRef(refs);
    m->last_layouts = ref == NULL ? NULL : Py_NewRef(layouts);
    m->last_call = ref == NULL ? NULL : Py_XNewRef(call);
    m->last_rp = ref == NULL ? NULL : Py_XNewRef(rp);
    for (size_t i = 0; i < sizeof old / sizeof old[0]; i++) Py_XDECREF(old[i]);
}

/* The prepared entry of this call, as what the method runs: 1 with new references in *call
 * (the tuple the replay takes) and *rp (a mesh call's MeshCall, else NULL); 0 when there is none
 * to replay; -1 with an exception set. */
static int prepared_call(PreparedMethod *m, PyObject *comm, PyObject *const *params, PyObject **call, PyObject **rp) {
    PyObject *arrays[METHOD_MAX_PARAMS];
    int narrays = 0, ok;
    for (int i = 0; i < m->nparams; i++)
        if (m->spec[i] == 'a') arrays[narrays++] = params[i];
    if (same_as_last(m, comm, params)) {        /* else, or if it no longer holds: look it up */
        if ((ok = entry_holds(m->last_refs, m->last_layouts, arrays, narrays)) < 0) return -1;
        if (ok) {
            if (m->last_call == NULL) return 0;
            *call = Py_NewRef(m->last_call);
            *rp = Py_XNewRef(m->last_rp);
            return 1;
        }
    }
    PyObject *key = PyTuple_New(m->nparams + 1);
    if (key == NULL) return -1;
    PyTuple_SET_ITEM(key, 0, Py_NewRef(m->name));
    for (int i = 0; i < m->nparams; i++) {
        PyObject *v = params[i];
        if (m->spec[i] == 'a') {
            v = PyLong_FromVoidPtr(v);
            if (v == NULL) { Py_DECREF(key); return -1; }
        } else if (PyLong_CheckExact(v) || PyUnicode_CheckExact(v)) {
            Py_INCREF(v);
        } else {
            Py_DECREF(key);
            return 0;
        }
        PyTuple_SET_ITEM(key, i + 1, v);
    }
    PyObject *entries = view_item(comm, NV_PREPARED);
    if (entries != NULL && !PyDict_Check(entries)) {
        Py_CLEAR(entries);
        PyErr_SetString(PyExc_TypeError, "a communicator's NV_PREPARED must be a dict");
    }
    PyObject *entry = entries == NULL ? NULL : PyDict_GetItemWithError(entries, key);   /* borrowed */
    Py_XINCREF(entry);
    Py_XDECREF(entries);
    Py_DECREF(key);
    if (entry == NULL) return PyErr_Occurred() ? -1 : 0;
    PyObject *refs = PyObject_GetAttr(entry, s_refs), *layouts = refs ? PyObject_GetAttr(entry, s_layouts) : NULL;
    PyObject *eargs = layouts ? PyObject_GetAttr(entry, s_args) : NULL;
    Py_DECREF(entry);
    ok = eargs == NULL ? -1 : entry_holds(refs, layouts, arrays, narrays);
    *call = *rp = NULL;
    if (ok == 1 && m->kind == METHOD_SENDRECV) {
        *call = Py_NewRef(eargs);
    } else if (ok == 1) {
        PyObject *replay = PyObject_GetAttr(eargs, s_replay);
        if (replay == NULL) {
            ok = -1;
        } else if (replay != Py_None) {        /* else the entry is not replayed: Python's */
            *rp = replay;
            if ((*call = PyObject_GetAttr(replay, s_call)) == NULL) { Py_CLEAR(*rp); ok = -1; }
        } else {
            Py_DECREF(replay);
        }
    }
    if (ok == 1) remember(m, comm, params, refs, layouts, *call, *rp);
    Py_XDECREF(refs);
    Py_XDECREF(layouts);
    Py_XDECREF(eargs);
    if (ok == 1 && *call == NULL) return 0;
    return ok;
}

static PyObject *method_vectorcall(PreparedMethod *m, PyObject *const *args, size_t nargsf, PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t ndefaults = PyTuple_GET_SIZE(m->defaults);
    PyObject *params[METHOD_MAX_PARAMS] = {NULL};
    if (nargs < 1 || nargs - 1 > m->nparams) goto slow;
    PyObject *comm = args[0];
    for (int i = 0; i < nargs - 1; i++) params[i] = args[i + 1];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {        /* the operation's own parameters by name */
        PyObject *kw = PyTuple_GET_ITEM(kwnames, k);
        int i = 0;
        while (i < m->nparams && PyTuple_GET_ITEM(m->params, i) != kw) i++;     /* both interned, as a rule */
        if (i == m->nparams)
            for (i = 0; i < m->nparams && PyUnicode_Compare(PyTuple_GET_ITEM(m->params, i), kw) != 0; i++) {}
        if (i == m->nparams || params[i] != NULL) goto slow;    /* async_op, path, a repeat: Python's */
        params[i] = args[nargs + k];
    }
    for (int i = 0; i < m->nparams; i++) {
        if (params[i] != NULL) continue;
        if (i < m->nparams - ndefaults) goto slow;               /* missing: Python raises */
        params[i] = PyTuple_GET_ITEM(m->defaults, i - (m->nparams - ndefaults));
    }
    int p2p = m->kind == METHOD_SENDRECV;
    PyObject *rp, *call;                    /* rp: a mesh call's MeshCall, which holds its call */
    int found = prepared_call(m, comm, params, &call, &rp);
    if (found < 0) return NULL;
    if (!found) goto slow;
    /* no modeled clock, no worker thread: the communicator's T_NATIVE word, through the call's cx */
    const int64_t *p = p2p ? call_params(call, Q_LEN, Q_PARAMS_ADDR, "p2p_replay")
                           : call_params(call, R_LEN, R_PARAMS_ADDR, "replay");
    const int64_t *cx = p == NULL ? NULL : (const int64_t *)(uintptr_t)p[p2p ? PP_CX : RP_CX];
    int now = cx == NULL ? -1 : ((const int64_t *)(uintptr_t)cx[CX_TALLY])[T_NATIVE] != 0;
    PyObject *r = NULL;
    if (now == 1) {
        r = p2p ? p2p_replay_impl(call) : replay_impl(call);
        if (!p2p && r != NULL && r != Py_None && PyLong_AsLong(PyTuple_GET_ITEM(r, 0)) == MESH_NOT_RUN) {
            Py_CLEAR(r);
            now = 0;                        /* debug logging: the Python operation, which logs */
        } else if (r != NULL && r != Py_None) {
            PyObject *stopped = view_item(comm, p2p ? NV_P2P_STOPPED : NV_MESH_STOPPED), *cont = NULL;
            if (stopped != NULL)
                cont = p2p ? PyObject_CallFunctionObjArgs(stopped, call, r, params[0], params[1], params[2], params[3],
                                                          NULL)
                           : PyObject_CallFunctionObjArgs(stopped, rp, r, NULL);
            Py_XDECREF(stopped);
            Py_DECREF(r);
            r = cont;
        }
    }
    Py_DECREF(call);
    Py_XDECREF(rp);
    if (now == 0) goto slow;
    if (r == NULL) return NULL;
    Py_DECREF(r);
    Py_RETURN_NONE;
slow:                                       /* the Python operation */
    if (nargs < 1) { PyErr_SetString(PyExc_TypeError, "needs the communicator"); return NULL; }
    return PyObject_Vectorcall(m->wrapped, args, nargs, kwnames);
}

static void method_dealloc(PreparedMethod *m) {
    Py_XDECREF(m->name);
    Py_XDECREF(m->defaults);
    Py_XDECREF(m->wrapped);
    remember(m, NULL, NULL, NULL, NULL, NULL, NULL);
    Py_XDECREF(m->params);
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *method_doc(PreparedMethod *m, void *closure) { return PyObject_GetAttrString(m->wrapped, "__doc__"); }
static PyObject *method_wrapped(PreparedMethod *m, void *closure) { return Py_NewRef(m->wrapped); }
static PyObject *method_name(PreparedMethod *m, void *closure) { return Py_NewRef(m->name); }

static PyGetSetDef method_getset[] = {
    {"__doc__", (getter)method_doc, NULL, NULL, NULL},
    {"__name__", (getter)method_name, NULL, NULL, NULL},
    {"__wrapped__", (getter)method_wrapped, NULL, NULL, NULL},     /* inspect.signature follows it */
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject PreparedMethodType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stratacl.runtime._native.PreparedMethod",
    .tp_basicsize = sizeof(PreparedMethod),
    .tp_dealloc = (destructor)method_dealloc,
    .tp_vectorcall_offset = offsetof(PreparedMethod, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_getset = method_getset,
    .tp_doc = "An operation's prepared common case as a method (see _replay.c).",
};

/* prepared_method(name, params, spec, defaults, slow, kind, op) -> an instancemethod for a
 * class body: `name` the operation (the key's first item), `params` its parameters' names,
 * `spec` their kinds (see above), `defaults` the trailing parameters' defaults, `kind`
 * METHOD_MESH or METHOD_SENDRECV, `op` the Python operation: called, with the communicator
 * first, for anything but the common case; its docstring and signature are the method's. */
static PyObject *prepared_method(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 6 || !PyUnicode_Check(args[0]) || !PyTuple_Check(args[1]) || !PyUnicode_Check(args[2]) ||
        !PyTuple_Check(args[3]) || !PyCallable_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "prepared_method(name, params, spec, defaults, kind, op)");
        return NULL;
    }
    PyObject *name = args[0], *names = args[1], *defaults = args[3], *op = args[5];
    if (ndarray_type == NULL) {
        PyObject *numpy = PyImport_ImportModule("numpy");
        PyObject *t = numpy == NULL ? NULL : PyObject_GetAttrString(numpy, "ndarray");
        Py_XDECREF(numpy);
        if (t == NULL) return NULL;
        if (!PyType_Check(t)) { Py_DECREF(t); PyErr_SetString(PyExc_TypeError, "numpy.ndarray is not a type"); return NULL; }
        ndarray_type = (PyTypeObject *)t;
    }
    const char *spec = PyUnicode_AsUTF8(args[2]);
    int kind = (int)PyLong_AsLong(args[4]);
    if (spec == NULL || (kind == -1 && PyErr_Occurred())) return NULL;
    size_t np = strlen(spec);
    if (np > METHOD_MAX_PARAMS || strspn(spec, "as") != np || PyTuple_GET_SIZE(defaults) > (Py_ssize_t)np ||
        PyTuple_GET_SIZE(names) != (Py_ssize_t)np || (kind != METHOD_MESH && kind != METHOD_SENDRECV) ||
        (kind == METHOD_SENDRECV && strcmp(spec, "asas"))) {
        PyErr_SetString(PyExc_ValueError, "prepared_method: bad params, spec, defaults or kind");
        return NULL;
    }
    PreparedMethod *m = PyObject_New(PreparedMethod, &PreparedMethodType);
    if (m == NULL) return NULL;
    m->vectorcall = (vectorcallfunc)method_vectorcall;
    m->last_refs = m->last_layouts = m->last_call = m->last_rp = m->last_comm = NULL;
    memset(m->last_params, 0, sizeof m->last_params);
    strcpy(m->spec, spec);
    m->nparams = (int)np;
    m->kind = kind;
    m->name = Py_NewRef(name);
    m->defaults = Py_NewRef(defaults);
    m->wrapped = Py_NewRef(op);
    m->params = PyTuple_New((Py_ssize_t)np);
    for (size_t i = 0; m->params != NULL && i < np; i++) {
        PyObject *interned = Py_NewRef(PyTuple_GET_ITEM(names, i));
        PyUnicode_InternInPlace(&interned);
        PyTuple_SET_ITEM(m->params, i, interned);
    }
    if (m->params == NULL) { Py_DECREF(m); return NULL; }
    PyObject *method = PyInstanceMethod_New((PyObject *)m);
    Py_DECREF(m);
    return method;
}

/* The Python entries of calls described by records (the module is made in _module.c). */
PyMethodDef record_methods[] = {
    {"mesh_call", (PyCFunction)(void (*)(void))mesh_call, METH_FASTCALL, "Start a full-mesh call (see mesh_advance)."},
    {"mesh_resume", (PyCFunction)(void (*)(void))mesh_resume, METH_FASTCALL, "Resume a full-mesh call from its stop."},
    {"replay", (PyCFunction)(void (*)(void))replay, METH_FASTCALL, "A prepared full-mesh call (communicator/_mesh.py)."},
    {"p2p_replay", (PyCFunction)(void (*)(void))p2p_replay, METH_FASTCALL, "A prepared sendrecv (communicator/_p2p.py)."},
    {"prepared_method", (PyCFunction)(void (*)(void))prepared_method, METH_FASTCALL,
     "An operation's prepared common case as a method."},
    {"set_barrier", (PyCFunction)(void (*)(void))set_barrier, METH_FASTCALL,
     "Settings of the barrier method (see barrier_call)."},
    {NULL, NULL, 0, NULL},
};

int replay_init(PyObject *m) {
    static PyMethodDef barrier_def = {
        "barrier", (PyCFunction)(void (*)(void))barrier_call, METH_FASTCALL | METH_KEYWORDS,
        "barrier($self, /, *, async_op=False, path=None)\n--\n\n"
        "Block until every rank of the communicator has called barrier. Collective."};
    /* Every Python name this file reads, and whose it is: the one list of them, exported as
     * NAMES_READ, which tests/test_constants.py checks against the objects. */
    struct { PyObject **slot; const char *name, *owner; } names[] = {
        {&s_view, "_native_view", "Communicator"}, {&s_refs, "_refs", "PreparedCall"},
        {&s_layouts, "_layouts", "PreparedCall"}, {&s_args, "args", "PreparedCall"},
        {&s_replay, "replay", "checked arguments"}, {&s_call, "call", "MeshCall"},
        {&s_barrier, "barrier", "operation"}, {&s_bytes_eager, "bytes_eager", "stats"}};
    if (PyType_Ready(&PreparedMethodType) < 0) return -1;
    size_t count = sizeof names / sizeof names[0];
    PyObject *read = PyTuple_New((Py_ssize_t)count);
    if (read == NULL) return -1;
    for (size_t i = 0; i < count; i++) {
        PyObject *pair = NULL;
        if ((*names[i].slot = PyUnicode_InternFromString(names[i].name)) == NULL ||
            (pair = Py_BuildValue("(Os)", *names[i].slot, names[i].owner)) == NULL) {
            Py_DECREF(read);
            return -1;
        }
        PyTuple_SET_ITEM(read, (Py_ssize_t)i, pair);
    }
    if (PyModule_AddObject(m, "NAMES_READ", read) < 0) { Py_DECREF(read); return -1; }
    PyObject *fn = PyCFunction_New(&barrier_def, NULL);
    PyObject *method = fn == NULL ? NULL : PyInstanceMethod_New(fn);
    Py_XDECREF(fn);
    if (method == NULL || PyModule_AddObject(m, "barrier_method", method) < 0) { Py_XDECREF(method); return -1; }
    return 0;
}
