// The Python side of the native readers' results: one helper for a list built entry by entry.
#pragma once

#include <Python.h>

namespace cpuprof {

// Appends `entry` (a new reference, or nullptr with an exception set) to `list` and drops it; on
// failure releases the list too, so the caller returns nullptr.
inline bool append_new(PyObject* list, PyObject* entry) {
  const bool appended = entry != nullptr && PyList_Append(list, entry) == 0;
  Py_XDECREF(entry);
  if (!appended) Py_DECREF(list);
  return appended;
}

}  // namespace cpuprof
