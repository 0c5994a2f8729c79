/* The interpreter's lock on its list of thread states (CPython's HEAD_LOCK), which a thread state
 * is linked in and out under even by a thread that does not hold the GIL (PyGILState_Ensure from
 * a thread Python did not start; PyThreadState_Delete). C, not C++: CPython 3.11 and 3.12's
 * internal headers that define the runtime's layout use C11 atomics. */
#define Py_BUILD_CORE 1
#include <Python.h>

#include "python/thread_list_lock.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#include <internal/pycore_pystate.h>

void cpuprof_lock_thread_list(void) {
#if PY_VERSION_HEX >= 0x030D0000
  /* Not HEAD_LOCK: its slow path is not exported. This one's, if it must wait, lets the GIL go
   * while it waits and takes it back before returning. */
  PyMutex_Lock(&_PyRuntime.interpreters.mutex);
#else
  PyThread_acquire_lock(_PyRuntime.interpreters.mutex, WAIT_LOCK);
#endif
}

void cpuprof_unlock_thread_list(void) {
#if PY_VERSION_HEX >= 0x030D0000
  PyMutex_Unlock(&_PyRuntime.interpreters.mutex);
#else
  PyThread_release_lock(_PyRuntime.interpreters.mutex);
#endif
}
#else
void cpuprof_lock_thread_list(void) {}
void cpuprof_unlock_thread_list(void) {}
#endif
