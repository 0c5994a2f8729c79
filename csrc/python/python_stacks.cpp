// See python_stacks.h.
#define PY_SSIZE_T_CLEAN
#define Py_BUILD_CORE 1
#include "python/python_stacks.h"

#include "python/interpreter_frames.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <vector>

#include "python/list_append.h"
#include "python/thread_list_lock.h"

namespace cpuprof {

#ifdef CPUPROF_NATIVE_PYTHON_FRAMES
namespace {

// A program has as many distinct (code, line) frames as lines of Python it runs; past this many
// the table stops growing (id 0) instead of holding every code object a generator of code makes.
constexpr size_t kMaxFrames = 1 << 20;
// Frames read per thread, innermost first; a deeper stack loses its outermost frames.
constexpr size_t kMaxDepth = 1024;

struct PairHash {
  size_t operator()(const std::pair<const void*, int>& key) const {
    return std::hash<const void*>()(key.first) * 31 + static_cast<size_t>(key.second);
  }
};

// One thread's stack in a read: its ids are ids[first, first + depth).
struct ThreadStack {
  unsigned long ident;
  unsigned long native_id;
  size_t first;
  size_t depth;
};

}  // namespace

class PythonFrameTable {
 public:
  ~PythonFrameTable() {
    for (auto& [code, line] : frames_) Py_XDECREF(code);
  }

  // Looks up or adds (code, instruction); no Python object is made (Py_INCREF allocates nothing).
  uint32_t frame_id(PyCodeObject* code, int instruction) {
    const std::pair<const void*, int> at{code, instruction};
    auto found = by_instruction_.find(at);
    if (found != by_instruction_.end()) return found->second;
    const int line = PyCode_Addr2Line(code, instruction * static_cast<int>(sizeof(_Py_CODEUNIT)));
    auto same_line = by_line_.find({code, line});
    uint32_t id = 0;
    if (same_line != by_line_.end()) {
      id = same_line->second;
    } else if (frames_.size() < kMaxFrames) {
      id = static_cast<uint32_t>(frames_.size());
      by_line_.emplace(std::pair<const void*, int>{code, line}, id);
      Py_INCREF(code);  // kept alive: its address stays this frame's, never another code's
      frames_.emplace_back(code, line);
    } else {
      return 0;  // full: not remembered, so the instruction is looked up again if its line gets room
    }
    by_instruction_.emplace(at, id);
    return id;
  }

  // Pass one, under the thread-list lock: every thread's ids into the reusable buffers.
  void walk(unsigned long skip_ident) {
    stacks_.clear();
    ids_.clear();
    cpuprof_lock_thread_list();
    for (PyThreadState* thread = PyInterpreterState_ThreadHead(PyInterpreterState_Get()); thread != nullptr;
         thread = PyThreadState_Next(thread)) {
      // Ident 0: a thread state made for a thread not started yet (3.12+); on 3.11 such a state
      // carries its creator's ident until its thread binds it, so duplicates are settled below.
      if (thread->thread_id == 0 || thread->thread_id == skip_ident) continue;
      ThreadStack stack{thread->thread_id, thread->native_thread_id, ids_.size(), 0};
      for (_PyInterpreterFrame* frame = innermost_frame(thread); frame != nullptr && stack.depth < kMaxDepth;
           frame = frame->previous) {
        PyCodeObject* code = code_of(frame);
        if (code == nullptr) continue;
        ids_.push_back(frame_id(code, _PyInterpreterFrame_LASTI(frame)));
        ++stack.depth;
      }
      std::reverse(ids_.begin() + static_cast<std::ptrdiff_t>(stack.first), ids_.end());
      bool duplicate = false;
      for (ThreadStack& seen : stacks_) {
        if (seen.native_id == stack.native_id && seen.ident == stack.ident) {
          if (stack.depth > seen.depth) seen = stack;  // the bound state has frames; the spare none
          duplicate = true;
        }
      }
      if (!duplicate) stacks_.push_back(stack);
    }
    cpuprof_unlock_thread_list();
  }

  // Pass two, the list unlocked: the Python objects.
  PyObject* result() const {
    PyObject* threads = PyList_New(0);
    if (threads == nullptr) return nullptr;
    for (const ThreadStack& stack : stacks_) {
      PyObject* entry = Py_BuildValue("(kky#)", stack.ident, stack.native_id,
                                      reinterpret_cast<const char*>(ids_.data() + stack.first),
                                      static_cast<Py_ssize_t>(stack.depth * sizeof(uint32_t)));
      if (!append_new(threads, entry)) return nullptr;
    }
    return threads;
  }

  PyObject* frames(Py_ssize_t first) const {
    PyObject* out = PyList_New(0);
    if (out == nullptr) return nullptr;
    for (size_t id = static_cast<size_t>(first < 0 ? 0 : first); id < frames_.size(); ++id) {
      const auto& [code, line] = frames_[id];
      PyObject* entry = code == nullptr ? Py_BuildValue("(ssi)", "(frame table full)", "", 0)
                                        : Py_BuildValue("(OOi)", code->co_qualname, code->co_filename, line);
      if (!append_new(out, entry)) return nullptr;
    }
    return out;
  }

 private:
  // (code, instruction index) -> frame id: the lookup every read makes.
  std::unordered_map<std::pair<const void*, int>, uint32_t, PairHash> by_instruction_;
  // (code, line) -> frame id: two instructions of one line are one frame.
  std::unordered_map<std::pair<const void*, int>, uint32_t, PairHash> by_line_;
  std::vector<std::pair<PyCodeObject*, int>> frames_{{nullptr, 0}};  // id 0: no room
  std::vector<ThreadStack> stacks_;
  std::vector<uint32_t> ids_;
};

bool python_stacks_supported() { return true; }
PythonFrameTable* new_python_frame_table() { return new PythonFrameTable; }
void free_python_frame_table(PythonFrameTable* table) { delete table; }

PyObject* read_python_stacks(PythonFrameTable* table, unsigned long skip_ident) {
  table->walk(skip_ident);
  return table->result();
}

PyObject* python_frame_table(PythonFrameTable* table, Py_ssize_t first) { return table->frames(first); }

#else  // another CPython: the caller reads sys._current_frames() itself

class PythonFrameTable {};
bool python_stacks_supported() { return false; }
PythonFrameTable* new_python_frame_table() { return new PythonFrameTable; }
void free_python_frame_table(PythonFrameTable* table) { delete table; }
PyObject* read_python_stacks(PythonFrameTable*, unsigned long) {
  PyErr_SetString(PyExc_NotImplementedError, "no native Python frame reader for this Python");
  return nullptr;
}
PyObject* python_frame_table(PythonFrameTable*, Py_ssize_t) { return PyList_New(0); }

#endif

}  // namespace cpuprof
