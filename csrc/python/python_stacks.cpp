// See python_stacks.h. The one unit that reads CPython's internal frame layout.
#define PY_SSIZE_T_CLEAN
#define Py_BUILD_CORE 1
#include "python/python_stacks.h"

// A free-threaded build has no GIL to freeze the other threads' frames while they are read.
#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030E0000 && !defined(Py_GIL_DISABLED)
#define CPUPROF_NATIVE_PYTHON_FRAMES 1
#include <internal/pycore_frame.h>
#endif

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace cpuprof {

#ifdef CPUPROF_NATIVE_PYTHON_FRAMES
namespace {

// A program has as many distinct (code, line) frames as lines of Python it runs; past this many
// the table stops growing (id 0) instead of holding every code object a generator of code makes.
constexpr size_t kMaxFrames = 1 << 20;
// Frames read per thread, innermost first; a deeper stack loses its outermost frames.
constexpr int kMaxDepth = 1024;

struct PairHash {
  size_t operator()(const std::pair<const void*, int>& key) const {
    return std::hash<const void*>()(key.first) * 31 + static_cast<size_t>(key.second);
  }
};

struct FrameTable {
  // (code, instruction index) -> frame id: the lookup every read makes.
  std::unordered_map<std::pair<const void*, int>, uint32_t, PairHash> by_instruction;
  // (code, line) -> frame id: two instructions of one line are one frame.
  std::unordered_map<std::pair<const void*, int>, uint32_t, PairHash> by_line;
  std::vector<std::pair<PyCodeObject*, int>> frames{{nullptr, 0}};  // id 0: no room
};

// Never destroyed: its code objects may outlive the interpreter's ability to release them.
FrameTable& table() {
  static FrameTable* frames = new FrameTable;
  return *frames;
}

_PyInterpreterFrame* innermost_frame(PyThreadState* thread) {
#if PY_VERSION_HEX >= 0x030D0000
  return thread->current_frame;
#else
  return thread->cframe != nullptr ? thread->cframe->current_frame : nullptr;
#endif
}

PyCodeObject* code_of(_PyInterpreterFrame* frame) {
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

uint32_t frame_id(PyCodeObject* code, int instruction) {
  FrameTable& t = table();
  const std::pair<const void*, int> at{code, instruction};
  auto found = t.by_instruction.find(at);
  if (found != t.by_instruction.end()) return found->second;
  if (t.frames.size() >= kMaxFrames) return 0;
  const int line = PyCode_Addr2Line(code, instruction * static_cast<int>(sizeof(_Py_CODEUNIT)));
  auto [same_line, added] = t.by_line.try_emplace({code, line}, static_cast<uint32_t>(t.frames.size()));
  if (added) {
    Py_INCREF(code);  // kept alive: its address stays this frame's, never another code's
    t.frames.emplace_back(code, line);
  }
  t.by_instruction.emplace(at, same_line->second);
  return same_line->second;
}

}  // namespace

bool python_stacks_supported() { return true; }

PyObject* read_python_stacks(unsigned long skip_ident) {
  PyObject* threads = PyList_New(0);
  if (threads == nullptr) return nullptr;
  uint32_t ids[kMaxDepth];
  for (PyThreadState* thread = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); thread != nullptr;
       thread = PyThreadState_Next(thread)) {
    if (thread->thread_id == skip_ident) continue;
    int depth = 0;
    for (_PyInterpreterFrame* frame = innermost_frame(thread); frame != nullptr && depth < kMaxDepth;
         frame = frame->previous) {
      PyCodeObject* code = code_of(frame);
      if (code != nullptr) ids[depth++] = frame_id(code, _PyInterpreterFrame_LASTI(frame));
    }
    for (int i = 0, j = depth - 1; i < j; ++i, --j) std::swap(ids[i], ids[j]);
    PyObject* entry = Py_BuildValue("(kky#)", thread->thread_id, thread->native_thread_id,
                                    reinterpret_cast<const char*>(ids), static_cast<Py_ssize_t>(depth) * 4);
    if (entry == nullptr || PyList_Append(threads, entry) != 0) {
      Py_XDECREF(entry);
      Py_DECREF(threads);
      return nullptr;
    }
    Py_DECREF(entry);
  }
  return threads;
}

PyObject* python_frame_table(Py_ssize_t first) {
  const auto& frames = table().frames;
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (size_t id = static_cast<size_t>(first < 0 ? 0 : first); id < frames.size(); ++id) {
    const auto& [code, line] = frames[id];
    PyObject* entry = code == nullptr ? Py_BuildValue("(ssi)", "(frame table full)", "", 0)
                                      : Py_BuildValue("(OOi)", code->co_qualname, code->co_filename, line);
    if (entry == nullptr || PyList_Append(out, entry) != 0) {
      Py_XDECREF(entry);
      Py_DECREF(out);
      return nullptr;
    }
    Py_DECREF(entry);
  }
  return out;
}

void clear_python_frame_table() {
  FrameTable& t = table();
  for (auto& [code, line] : t.frames) Py_XDECREF(code);
  t.frames.assign(1, {nullptr, 0});
  t.by_instruction.clear();
  t.by_line.clear();
}

#else  // another CPython: the caller reads sys._current_frames() itself

bool python_stacks_supported() { return false; }
PyObject* read_python_stacks(unsigned long) {
  PyErr_SetString(PyExc_NotImplementedError, "no native Python frame reader for this Python");
  return nullptr;
}
PyObject* python_frame_table(Py_ssize_t) { return PyList_New(0); }
void clear_python_frame_table() {}

#endif

}  // namespace cpuprof
