// CPython's internal frame layout, for the units that walk frame chains (python_stacks.cpp,
// python_callers.cpp). Include with Py_BUILD_CORE defined, after Python.h.
#pragma once

// A free-threaded build has no GIL to freeze the other threads' frames while they are read, and
// 3.14 changed the layout again: elsewhere the frames are read from Python.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define CPUPROF_NATIVE_PYTHON_FRAMES 1
#include <internal/pycore_frame.h>

namespace cpuprof {

inline _PyInterpreterFrame* innermost_frame(PyThreadState* thread) {
#if PY_VERSION_HEX >= 0x030D0000
  return thread->current_frame;
#else
  return thread->cframe != nullptr ? thread->cframe->current_frame : nullptr;
#endif
}

// The frame's code, or null for a frame that runs no Python of its own yet.
inline PyCodeObject* code_of(_PyInterpreterFrame* frame) {
#if PY_VERSION_HEX >= 0x030C0000
  if (frame->owner == FRAME_OWNED_BY_CSTACK) return nullptr;  // a C call's shim frame
#endif
  if (_PyFrame_IsIncomplete(frame)) return nullptr;  // being set up: not running yet
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* code = frame->f_executable;
  return code != nullptr && PyCode_Check(code) ? reinterpret_cast<PyCodeObject*>(code) : nullptr;
#else
  return frame->f_code;
#endif
}

// The frame's code and its position in it as raw pointers, without reading the code object: what
// a chain's identity is hashed from at every op (code objects are cold there).
inline const void* frame_executable(const _PyInterpreterFrame* frame) {
#if PY_VERSION_HEX >= 0x030D0000
  return frame->f_executable;
#else
  return frame->f_code;
#endif
}
inline const void* frame_position(const _PyInterpreterFrame* frame) {
#if PY_VERSION_HEX >= 0x030D0000
  return frame->instr_ptr;
#else
  return frame->prev_instr;
#endif
}

}  // namespace cpuprof
#endif
