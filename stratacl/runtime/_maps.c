/*
 * Memory maps: mmap and munmap at fixed addresses, hole punching, an array's address, and
 * the parent-death signal.
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

#ifndef FALLOC_FL_KEEP_SIZE
#define FALLOC_FL_KEEP_SIZE 0x01
#endif
#ifndef FALLOC_FL_PUNCH_HOLE
#define FALLOC_FL_PUNCH_HOLE 0x02
#endif

static PyObject *data_address(PyObject *self, PyObject *arg) {
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_RECORDS_RO) < 0) return NULL;
    PyObject *r = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)view.buf);
    PyBuffer_Release(&view);
    return r;
}

/* mmap_at(addr, length, prot, flags, fd, offset) -> addr; raises OSError on failure or if the
 * kernel placed the mapping elsewhere. */
static PyObject *mmap_at(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p;
    if (n != 6) { PyErr_SetString(PyExc_TypeError, "mmap_at(addr, length, prot, flags, fd, offset)"); return NULL; }
    if (parse_addr(args[0], &p) < 0) return NULL;
    unsigned long long len = PyLong_AsUnsignedLongLong(args[1]);
    if (len == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    int prot = (int)PyLong_AsLong(args[2]);
    int flags = (int)PyLong_AsLong(args[3]);
    int fd = (int)PyLong_AsLong(args[4]);
    long long off = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred()) return NULL;
    void *r;
    Py_BEGIN_ALLOW_THREADS
    r = mmap(p, (size_t)len, prot, flags, fd, (off_t)off);
    Py_END_ALLOW_THREADS
    if (r == MAP_FAILED) return PyErr_SetFromErrno(PyExc_OSError);
    if (p != NULL && r != p) {
        munmap(r, (size_t)len);
        errno = EEXIST;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    return PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)r);
}

static PyObject *munmap_at(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    void *p;
    if (n != 2) { PyErr_SetString(PyExc_TypeError, "munmap_at(addr, length)"); return NULL; }
    if (parse_addr(args[0], &p) < 0) return NULL;
    unsigned long long len = PyLong_AsUnsignedLongLong(args[1]);
    if (len == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    if (munmap(p, (size_t)len) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *punch_hole(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3) { PyErr_SetString(PyExc_TypeError, "punch_hole(fd, offset, length)"); return NULL; }
    int fd = (int)PyLong_AsLong(args[0]);
    long long off = PyLong_AsLongLong(args[1]);
    long long len = PyLong_AsLongLong(args[2]);
    if (PyErr_Occurred()) return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off, (off_t)len);
    Py_END_ALLOW_THREADS
    if (rc != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

static PyObject *set_pdeathsig(PyObject *self, PyObject *arg) {
    long sig = PyLong_AsLong(arg);
    if (sig == -1 && PyErr_Occurred()) return NULL;
    if (prctl(PR_SET_PDEATHSIG, (unsigned long)sig, 0, 0, 0) != 0) return PyErr_SetFromErrno(PyExc_OSError);
    Py_RETURN_NONE;
}

/* The maps' Python entries. */
PyMethodDef map_methods[] = {
    {"data_address", data_address, METH_O, "Address of a buffer's first byte."},
    {"mmap_at", (PyCFunction)(void (*)(void))mmap_at, METH_FASTCALL, "mmap at a fixed address."},
    {"munmap_at", (PyCFunction)(void (*)(void))munmap_at, METH_FASTCALL, "munmap a range."},
    {"punch_hole", (PyCFunction)(void (*)(void))punch_hole, METH_FASTCALL, "Release the pages of a file range."},
    {"set_pdeathsig", set_pdeathsig, METH_O, "Deliver a signal to this process when its parent dies."},
    {NULL, NULL, 0, NULL},
};
