// The Python caller of every op: the calling thread's Python stack, taken in the op hook at the
// begin of each op not inside another op (one inside an op keeps that op's caller; one inside a
// region has its own), recorded when it differs from the thread's last op's.
//
// Why: a sampler that reads Python stacks every 10 ms (py-spy, or cpuprof's own thread) cannot
// say which Python line called the op a native sample landed in when a decode changes Python
// function every few tens of microseconds; joined by time, an aten::mm sample would be shown under
// whatever module the last read saw. At the op's begin the thread's own frames are exact, and
// reading them needs no GIL: torch's bindings release it around the op, but a thread's frames
// change only when the thread itself runs Python, and the code objects of frames still on its
// stack are alive. So the walk reads its own thread's frame chain (a few loads a frame, on memory
// the thread just touched), hashes (code, instruction) pairs, and looks the chain up in a table;
// names and lines are copied out only the first time a chain is seen, from the str objects and
// the line table themselves (immutable), through no Python API call that needs the GIL. Changes
// go to a per-thread ring that the in-process sampler drains.
#pragma once

#include <Python.h>

#include <cstdint>

namespace cpuprof {

// True where this build can read a thread's own frames (CPython 3.11 to 3.13 with a GIL).
bool python_callers_supported();

// Clears what an earlier session recorded and starts observing op begins (op_hook.h). Call while
// no op hook runs (before the native session starts). Throws std::runtime_error while an earlier
// start has not been released (pybind11 makes it a RuntimeError).
void start_python_callers();
// Test hook: while set, start_python_callers records nothing, so that a run joined by the
// sampler's reads alone can be compared with one that has callers (the control of their tests and
// benches).
void inject_no_python_callers(bool on);
// Stops observing. Call once no op hook runs any more (after the native session stopped) for the
// last drain to be complete: it also closes the gaps still open.
void stop_python_callers();

// [(OS thread id, bytes of (int64 ns, uint32 chain, uint32 0) records in time order, lost)] of
// every thread that ran ops, consuming what was recorded since the last drain. A chain of 0 means
// "not known from here on" (changes were lost to a full ring, or the chain table was full).
// `lost` counts changes not recorded. One drainer at a time. New reference.
PyObject* drain_python_callers();

// Whether the op callers stand in for a read of every thread's Python stack at `now_ns`. True when
// they are being recorded, some thread has run ops, and each thread that has run ops either began
// one (not inside an op) within `window_ns` before now, so that its Python is its last op's caller
// to within that; or ran under `min_cpu_share` of the time since its clock was last read here
// (blocked, idle or preempted: few samples land in its Python, and those take its last op's
// caller); or has exited. A thread not covered by an op begin costs a read of its CPU clock (a
// system call). One asker at a time (the in-process sampler's read pacer), between a start and its
// stop, never beside a start or a release (which free what it reads).
bool python_callers_cover(int64_t now_ns, int64_t window_ns, double min_cpu_share);

// How full the fullest thread's ring is, 0 to 1: memory loads only, so a drainer may ask at every
// period and drain (which builds Python objects) only when it is worth it.
double python_callers_fill();

// [[(function qualified name, file name, line), root first]] of the chains from `first` on; chain
// 0 is the empty list. New reference.
PyObject* python_caller_chains(Py_ssize_t first);

// Stops observing if not stopped, frees the rings and the chain table, and lets another start
// record: after the last drain and the chains' names are read.
void release_python_callers();

}  // namespace cpuprof
