// A small extension for the cross-version test (test_python_frames_versions.py): cpuprof's two
// native Python frame readers (python_stacks.cpp, python_callers.cpp) built against another
// CPython's headers, without torch: the op hook is a function the test calls as an op would be.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <time.h>

#include <exception>

#include "python/python_callers.h"
#include "python/python_stacks.h"
#include "sources/op_hook.h"

namespace cpuprof {
namespace {
OpBeginObserver g_observer = nullptr;
}
void set_op_begin_observer(OpBeginObserver observer) { g_observer = observer; }
}  // namespace cpuprof

namespace {

using namespace cpuprof;

int64_t now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec * 1000000000LL + t.tv_nsec;
}

PythonFrameTable* g_table = nullptr;

// An op, as torch's bindings run one: the GIL released, then the hook at its begin; then, inside
// it, `nested` ops from C++, and `kernel` (a Python callable) called with the GIL taken back, as a
// Python kernel or a dispatch mode runs, whose ops (inner_op) are ops inside this one.
PyObject* fake_op(PyObject*, PyObject* args) {
  int nested = 0;
  PyObject* kernel = nullptr;
  if (!PyArg_ParseTuple(args, "|iO", &nested, &kernel)) return nullptr;
  PyObject* result = nullptr;
  Py_BEGIN_ALLOW_THREADS
  if (g_observer != nullptr) {
    for (int depth = 0; depth <= nested; ++depth) g_observer(now(), depth > 0);
  }
  if (kernel != nullptr) {
    Py_BLOCK_THREADS
    result = PyObject_CallNoArgs(kernel);
    Py_UNBLOCK_THREADS
  }
  Py_END_ALLOW_THREADS
  if (kernel == nullptr) Py_RETURN_NONE;
  return result;
}

// An op inside the op that called the running kernel.
PyObject* inner_op(PyObject*, PyObject*) {
  Py_BEGIN_ALLOW_THREADS
  if (g_observer != nullptr) g_observer(now(), true);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* start(PyObject*, PyObject*) {
  try {
    start_python_callers();
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyObject* stop(PyObject*, PyObject*) {
  stop_python_callers();
  Py_RETURN_NONE;
}

PyObject* drain(PyObject*, PyObject*) { return drain_python_callers(); }
PyObject* chains(PyObject*, PyObject*) { return python_caller_chains(0); }

PyObject* read(PyObject*, PyObject* args) {
  unsigned long skip = 0;
  if (!PyArg_ParseTuple(args, "k", &skip)) return nullptr;
  if (g_table == nullptr) g_table = new_python_frame_table();
  return read_python_stacks(g_table, skip);
}

PyObject* frames(PyObject*, PyObject*) { return python_frame_table(g_table, 0); }

PyMethodDef methods[] = {{"fake_op", fake_op, METH_VARARGS, nullptr},
                         {"inner_op", inner_op, METH_NOARGS, nullptr},
                         {"start", start, METH_NOARGS, nullptr},
                         {"stop", stop, METH_NOARGS, nullptr},
                         {"drain", drain, METH_NOARGS, nullptr},
                         {"chains", chains, METH_NOARGS, nullptr},
                         {"read", read, METH_VARARGS, nullptr},
                         {"frames", frames, METH_NOARGS, nullptr},
                         {nullptr, nullptr, 0, nullptr}};
PyModuleDef module = {PyModuleDef_HEAD_INIT, "frames_harness", nullptr, -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit_frames_harness() { return PyModule_Create(&module); }
