/*
 * The module stratacl.runtime._native: the protocol primitives (_waits.c, _agree.c, _p2pcall.c,
 * _maps.c; constants in _native.c) and the entries of calls described by records of _replay.c
 * (see _native.h), in one extension, made here so that no source refers to another's Python
 * surface.
 */
#include "_native.h"


static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "_native", NULL, -1, NULL};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL) return NULL;
    if (PyModule_AddFunctions(m, wait_methods) < 0 || PyModule_AddFunctions(m, agree_methods) < 0 ||
        PyModule_AddFunctions(m, p2p_methods) < 0 || PyModule_AddFunctions(m, map_methods) < 0 ||
        PyModule_AddFunctions(m, record_methods) < 0 ||
        native_init(m) < 0 || replay_init(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
