// The Python stack of every thread of the interpreter, read by the caller, which holds the GIL.
//
// Why native: reading frames from Python (sys._current_frames(), f_back, f_lineno) cost about
// 80 µs per read of a decode's 24 frames, 1.5 µs a frame, most of it line-number lookups and
// frame objects made for the walk; each of those microseconds the GIL is held is one a thread
// coming back from an op may wait. Here a frame is a few loads and a lookup of its (code,
// instruction) in a table, and the line is looked up once per instruction ever seen.
//
// With the GIL held no thread pushes or pops a Python frame and no thread state is freed, so the
// chain is read as it is. The layout of a frame is CPython's own (internal headers), checked at
// build time for the version built against.
#pragma once

#include <Python.h>

namespace cpuprof {

// True where this build reads frames natively (CPython 3.11 to 3.13 with a GIL); elsewhere the
// caller walks sys._current_frames() itself.
bool python_stacks_supported();

// [(pthread ident, OS thread id, bytes of uint32 frame ids, root first)] for every thread but
// `skip_ident`. A frame id indexes the table python_frame_table returns; id 0 is a frame the
// bounded table had no room for. New reference, or nullptr with a Python exception set.
PyObject* read_python_stacks(unsigned long skip_ident);

// [(function qualified name, file name, line)] of the frame ids from `first` on. New reference.
PyObject* python_frame_table(Py_ssize_t first);

// Forgets every frame id and releases the code objects the table kept alive.
void clear_python_frame_table();

}  // namespace cpuprof
