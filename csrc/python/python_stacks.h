// The Python stack of every thread of the interpreter, read by a caller that holds the GIL.
//
// Why native: reading frames from Python (sys._current_frames(), f_back, f_lineno) cost 86 µs
// per read of a decode's 24 frames, against 28 µs here (benches/bench_python_read.py), most of it
// line-number lookups and frame objects made for the walk; each of those microseconds the GIL is
// held is one a thread coming back from an op may wait. Here a frame is a few loads and a lookup of its (code,
// instruction) in a table, and the line is looked up once per instruction ever seen.
//
// With the GIL held no thread pushes or pops a Python frame, and a thread state is unlinked by a
// thread that holds the GIL, or under the interpreter's lock on its list of thread states, which
// the walk takes (thread_list_lock.h). The walk makes no Python object, so nothing in it can run
// the garbage collector or give the GIL away. The layout of a frame is CPython's own (internal
// headers), for the version built against.
#pragma once

#include <Python.h>

namespace cpuprof {

// True where this build reads frames natively (CPython 3.11 to 3.13 with a GIL); elsewhere the
// caller walks sys._current_frames() itself.
bool python_stacks_supported();

// The frames one sampler has seen: (code, line) ids, each keeping its code object alive so that
// its address names no other code while the table lives. One per sampler: two profiles in
// sequence never share ids.
class PythonFrameTable;
PythonFrameTable* new_python_frame_table();
void free_python_frame_table(PythonFrameTable* table);  // GIL held: releases the code objects

// [(pthread ident, OS thread id, bytes of uint32 frame ids, root first)] for every thread but
// `skip_ident`. A frame id indexes python_frame_table's list; id 0 is a frame the bounded table
// had no room for. New reference, or nullptr with a Python exception set.
PyObject* read_python_stacks(PythonFrameTable* table, unsigned long skip_ident);

// [(function qualified name, file name, line)] of the frame ids from `first` on. New reference.
PyObject* python_frame_table(PythonFrameTable* table, Py_ssize_t first);

}  // namespace cpuprof
