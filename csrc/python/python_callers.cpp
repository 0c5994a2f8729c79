// See python_callers.h.
#define PY_SSIZE_T_CLEAN
#define Py_BUILD_CORE 1
#include "python/python_callers.h"

#include "python/interpreter_frames.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/clock.h"
#include "common/hash.h"
#include "python/list_append.h"
#include "sources/op_hook.h"

namespace cpuprof {

#ifdef CPUPROF_NATIVE_PYTHON_FRAMES
namespace {

// Per thread that runs ops: the in-process sampler drains the rings 100 times a second, and a
// decode changes caller a few thousand times a second, so 65,536 records (1 MiB) leave room for
// seconds of a sampler that could not run. A full ring loses changes and says so (a gap record).
constexpr size_t kRingRecords = 1 << 16;
constexpr int kMaxThreads = 256;  // threads that run ops; beyond it, ops keep no Python caller
// A program runs as many distinct caller chains as it has call paths into torch; a decode has a
// few hundred. Past kMaxChains new chains are recorded as unknown instead of growing the table.
constexpr size_t kChainSlots = 1 << 15;
constexpr size_t kMaxChains = kChainSlots / 2;
constexpr int kMaxWalk = 256;  // frames hashed and named per chain: the innermost ones
constexpr size_t kMaxNameChars = 1024;
constexpr uint32_t kUnknownChain = 0;
constexpr uint32_t kNotFound = UINT32_MAX;

struct CallerRecord {
  int64_t ns;
  uint32_t chain;
  uint32_t unused;
};
static_assert(sizeof(CallerRecord) == 16, "caller records are 16 bytes");

// One thread's changes of caller: its own thread writes, the drainer reads; no lock.
struct ThreadCallers {
  pid_t tid = 0;
  // The thread's last change of caller (recorded, or lost into a gap), touched by its own thread
  // only while recording; read by the last drain once no op hook runs.
  uint64_t hash = 0;
  uint32_t chain = kUnknownChain;
  bool known = false;
  int64_t gap_ns = 0;  // when the first change since the last record was lost; 0: no gap open
  // The thread's last op begin (not inside an op): written by the thread at every such begin, read
  // by the read pacer (python_callers_cover), on the line the thread reads at every begin anyway.
  std::atomic<int64_t> last_begin_ns{0};
  // The pacer's own: the thread's CPU clock at the last ask that read it (0: not read yet), and when.
  uint64_t asked_cpu_ns = 0;
  int64_t asked_ns = 0;
  std::unique_ptr<CallerRecord[]> ring;
  alignas(64) std::atomic<uint64_t> head{0};
  alignas(64) std::atomic<uint64_t> tail{0};
  std::atomic<uint64_t> lost{0};

  // Records a change, after the gap record (chain 0 from the first lost change's time) where a
  // gap is open. False, with the gap opened, when the ring has no room; `counted`: a new change
  // (a retry of the one already lost is not lost twice).
  bool push(int64_t ns, uint32_t chain_id, bool counted) {
    uint64_t at = head.load(std::memory_order_relaxed);
    const uint64_t needed = gap_ns != 0 ? 2 : 1;
    if (at - tail.load(std::memory_order_acquire) + needed > kRingRecords) {
      if (counted) lost.fetch_add(1, std::memory_order_relaxed);
      if (gap_ns == 0) gap_ns = ns;
      return false;
    }
    if (gap_ns != 0) {  // what ran from the first lost change on is not known from here
      ring[at++ & (kRingRecords - 1)] = CallerRecord{gap_ns, kUnknownChain, 0};
      gap_ns = 0;
    }
    ring[at++ & (kRingRecords - 1)] = CallerRecord{ns, chain_id, 0};
    head.store(at, std::memory_order_release);
    return true;
  }
};

struct ChainSlot {
  std::atomic<uint64_t> hash{0};  // published last: a reader that sees it sees the chain id
  uint32_t chain = 0;
};

struct FrameName {
  uint32_t function;  // index into Interned::strings
  uint32_t file;
  int line;
};

// What a code object was named when a chain through it was first seen: its names are copied out
// then (a later code object at the same address is told apart by its names' addresses).
struct CodeNames {
  const void* qualname;
  const void* filename;
  uint32_t function;
  uint32_t file;
};

// The chains seen, by id; grown under the mutex, by the op hook on a new chain only.
struct Interned {
  std::mutex mutex;
  // A frame's name and line by its instruction's address: chains share most frames, and a line
  // lookup walks the code's line table from its start.
  std::unordered_map<const void*, FrameName> frames;
  std::vector<std::string> strings;
  std::unordered_map<std::string, uint32_t> string_ids;
  std::unordered_map<const void*, CodeNames> codes;
  std::vector<std::vector<FrameName>> chains{{}};  // chain 0: unknown
};

std::unique_ptr<ChainSlot[]> g_slots;
std::unique_ptr<Interned> g_interned;
ThreadCallers* g_threads_storage[kMaxThreads];
std::atomic<ThreadCallers*> g_threads[kMaxThreads];
std::atomic<int> g_thread_count{0};
std::atomic<uint64_t> g_generation{0};
std::atomic<bool> g_injected_off{false};
std::atomic<bool> g_stopped{false};  // stopped: no op hook writes any more, the last drain closes gaps
std::atomic<bool> g_owned{false};  // from a start to its release: another start would free what is read
std::atomic<bool> g_chains_full{false};  // no new chain is kept: a miss is unknown, without the lock

struct ThreadBinding {
  uint64_t generation = 0;
  ThreadCallers* callers = nullptr;
};
thread_local ThreadBinding t_binding;

// The calling thread's record, made at its first op of a session; null where none can be made.
ThreadCallers* this_thread() {
  const uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (t_binding.generation == generation) return t_binding.callers;
  t_binding.generation = generation;
  t_binding.callers = nullptr;
  const int index = g_thread_count.fetch_add(1, std::memory_order_relaxed);
  if (index >= kMaxThreads) return nullptr;
  auto* callers = new (std::nothrow) ThreadCallers;
  if (callers == nullptr) return nullptr;
  callers->ring.reset(new (std::nothrow) CallerRecord[kRingRecords]);
  if (!callers->ring) {
    delete callers;
    return nullptr;
  }
  callers->tid = static_cast<pid_t>(syscall(SYS_gettid));
  g_threads_storage[index] = callers;
  g_threads[index].store(callers, std::memory_order_release);
  t_binding.callers = callers;
  return callers;
}

// The chain's hash from `innermost` outward; 0 for no frame. The walk reads the frames only
// (contiguous on the thread's data stack, and warm: the thread just ran them): a frame's code and
// instruction pointers say both which code and where in it, without reading the code objects,
// which an op's data has often pushed out of the caches. One multiply a frame. The innermost
// code object is read once: its name's and file's addresses are mixed in, so that a code object
// freed and another made at its address (exec, recompiled graphs) is told apart where it matters
// most. The final mix spreads every bit into the low ones the table's slot is taken from.
uint64_t hash_chain(_PyInterpreterFrame* innermost) {
  uint64_t hash = 0x243f6a8885a308d3ULL;
  int walked = 0;
  for (_PyInterpreterFrame* frame = innermost; frame != nullptr && walked < kMaxWalk; frame = frame->previous) {
    const uint64_t word = reinterpret_cast<uintptr_t>(frame_executable(frame)) ^
                          (reinterpret_cast<uintptr_t>(frame_position(frame)) << 17);
    hash = (hash ^ word) * 0x9e3779b97f4a7c15ULL;
    ++walked;
  }
  if (walked == 0) return 0;
  if (const PyCodeObject* code = code_of(innermost)) {
    hash = mix_hash(hash, reinterpret_cast<uintptr_t>(code->co_qualname));
    hash = mix_hash(hash, reinterpret_cast<uintptr_t>(code->co_filename));
  }
  // murmur3's 64-bit finaliser
  hash ^= hash >> 33;
  hash *= 0xff51afd7ed558ccdULL;
  hash ^= hash >> 33;
  hash *= 0xc4ceb9fe1a85ec53ULL;
  hash ^= hash >> 33;
  return hash != 0 ? hash : 1;
}

// The line of an instruction, from the code's line table alone. Not PyCode_Addr2Line: on 3.11 it
// reads a line array that a thread tracing lines (a debugger, coverage) may be building under
// the GIL, which this thread does not hold; the table itself never changes.
int line_of(PyCodeObject* code, int instruction) {
  if (instruction < 0) return code->co_firstlineno;
  PyCodeAddressRange range;
  const auto* table = reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(code->co_linetable));
  range.opaque.lo_next = table;
  range.opaque.limit = table + PyBytes_GET_SIZE(code->co_linetable);
  range.opaque.computed_line = code->co_firstlineno;
  range.ar_start = -1;
  range.ar_end = 0;
  range.ar_line = -1;
  return _PyCode_CheckLineNumber(instruction * static_cast<int>(sizeof(_Py_CODEUNIT)), &range);
}

uint32_t find_chain(uint64_t hash) {
  for (size_t at = hash & (kChainSlots - 1);; at = (at + 1) & (kChainSlots - 1)) {
    const uint64_t seen = g_slots[at].hash.load(std::memory_order_acquire);
    if (seen == hash) return g_slots[at].chain;
    if (seen == 0) return kNotFound;
  }
}

// A Python str's text as UTF-8, read from the object without the C API (which needs the GIL):
// the object is immutable and alive (its code object is on the calling thread's stack).
uint32_t intern_text(Interned& interned, PyObject* text) {
  std::string out;
  if (text == nullptr || !PyUnicode_Check(text)) {
    out = "?";
  } else {
    const int kind = PyUnicode_KIND(text);
    const void* data = PyUnicode_DATA(text);
    const Py_ssize_t length = std::min<Py_ssize_t>(PyUnicode_GET_LENGTH(text), kMaxNameChars);
    for (Py_ssize_t i = 0; i < length; ++i) {
      const Py_UCS4 c = PyUnicode_READ(kind, data, i);
      if (c < 0x80) {
        out += static_cast<char>(c);
      } else if (c < 0x800) {
        out += static_cast<char>(0xc0 | (c >> 6));
        out += static_cast<char>(0x80 | (c & 0x3f));
      } else if (c >= 0xd800 && c < 0xe000) {
        out += '?';  // a lone surrogate has no UTF-8
      } else if (c < 0x10000) {
        out += static_cast<char>(0xe0 | (c >> 12));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (c & 0x3f));
      } else {
        out += static_cast<char>(0xf0 | (c >> 18));
        out += static_cast<char>(0x80 | ((c >> 12) & 0x3f));
        out += static_cast<char>(0x80 | ((c >> 6) & 0x3f));
        out += static_cast<char>(0x80 | (c & 0x3f));
      }
    }
  }
  auto [found, added] = interned.string_ids.emplace(out, static_cast<uint32_t>(interned.strings.size()));
  if (added) interned.strings.push_back(std::move(out));
  return found->second;
}

const CodeNames& names_of(Interned& interned, PyCodeObject* code) {
  auto found = interned.codes.find(code);
  if (found != interned.codes.end() && found->second.qualname == code->co_qualname &&
      found->second.filename == code->co_filename) {
    return found->second;
  }
  const CodeNames names{code->co_qualname, code->co_filename, intern_text(interned, code->co_qualname),
                        intern_text(interned, code->co_filename)};
  return interned.codes.insert_or_assign(code, names).first->second;
}

// The chain's id, named from the frames the first time it is seen. Allocates; runs once per chain.
uint32_t intern_chain(uint64_t hash, _PyInterpreterFrame* innermost) {
  Interned& interned = *g_interned;
  try {
    std::lock_guard<std::mutex> lock(interned.mutex);
    const uint32_t raced = find_chain(hash);
    if (raced != kNotFound) return raced;
    if (interned.chains.size() >= kMaxChains) {
      g_chains_full.store(true, std::memory_order_relaxed);
      return kUnknownChain;
    }
    std::vector<FrameName> chain;
    int walked = 0;
    for (_PyInterpreterFrame* frame = innermost; frame != nullptr && walked < kMaxWalk; frame = frame->previous) {
      PyCodeObject* code = code_of(frame);
      if (code == nullptr) continue;
      const CodeNames& names = names_of(interned, code);
      auto known = interned.frames.find(frame_position(frame));
      if (known == interned.frames.end() || known->second.function != names.function ||
          known->second.file != names.file) {
        const int line = line_of(code, _PyInterpreterFrame_LASTI(frame));
        known = interned.frames.insert_or_assign(frame_position(frame), FrameName{names.function, names.file, line}).first;
      }
      chain.push_back(known->second);
      ++walked;
    }
    std::reverse(chain.begin(), chain.end());
    const auto id = static_cast<uint32_t>(interned.chains.size());
    interned.chains.push_back(std::move(chain));
    size_t at = hash & (kChainSlots - 1);
    while (g_slots[at].hash.load(std::memory_order_relaxed) != 0) at = (at + 1) & (kChainSlots - 1);
    g_slots[at].chain = id;
    g_slots[at].hash.store(hash, std::memory_order_release);
    return id;
  } catch (...) {  // out of memory: this op's caller is not known, and the op goes on
    return kUnknownChain;
  }
}

void observe_op_begin(int64_t enter_ns, bool inside_op) {
  // An op inside an op keeps that op's caller: the Python that runs between (a Python kernel, a
  // dispatch mode) is the op's implementation, not the program's caller, and not looking saves
  // most ops the thread-state lookup. Inside a region (record_function, cpuprof.region, a
  // module's forward) the program's Python runs, so the op's own caller is read.
  if (inside_op) return;
  // This thread's own state, found without the GIL (which torch's bindings released for the op);
  // a thread with none (never ran Python) takes no record.
  PyThreadState* thread = PyGILState_GetThisThreadState();
  if (thread == nullptr) return;
  ThreadCallers* me = this_thread();
  if (me == nullptr) return;
  me->last_begin_ns.store(enter_ns, std::memory_order_relaxed);
  _PyInterpreterFrame* innermost = innermost_frame(thread);
  const uint64_t hash = innermost != nullptr ? hash_chain(innermost) : 0;
  const bool same = me->known && hash == me->hash;
  if (same && me->gap_ns == 0) return;
  if (same) {  // the caller whose change was lost: recorded again as soon as the ring has room
    me->push(enter_ns, me->chain, false);
    return;
  }
  uint32_t chain = kUnknownChain;
  if (hash != 0) {
    chain = find_chain(hash);
    if (chain == kNotFound) {
      chain = g_chains_full.load(std::memory_order_relaxed) ? kUnknownChain : intern_chain(hash, innermost);
    }
  }
  me->push(enter_ns, chain, true);
  me->hash = hash;
  me->chain = chain;
  me->known = true;
}

void free_threads() {
  const int used = std::min(g_thread_count.load(std::memory_order_relaxed), kMaxThreads);
  for (int i = 0; i < used; ++i) {
    g_threads[i].store(nullptr, std::memory_order_relaxed);
    delete g_threads_storage[i];
    g_threads_storage[i] = nullptr;
  }
  g_thread_count.store(0, std::memory_order_relaxed);
}

}  // namespace

bool python_callers_supported() { return true; }

void start_python_callers() {
  // Another profile's op hooks may be writing into the records this would free, or its sampler
  // draining them.
  if (g_owned.exchange(true, std::memory_order_acq_rel)) throw std::runtime_error("another profile records Python callers");
  free_threads();
  g_slots.reset(new ChainSlot[kChainSlots]);
  g_interned = std::make_unique<Interned>();
  g_chains_full.store(false, std::memory_order_relaxed);
  g_stopped.store(false, std::memory_order_relaxed);
  g_generation.fetch_add(1, std::memory_order_release);
  if (!g_injected_off.load(std::memory_order_relaxed)) set_op_begin_observer(observe_op_begin);
}

void release_python_callers() {
  set_op_begin_observer(nullptr);
  free_threads();
  g_slots.reset();
  g_interned.reset();
  g_owned.store(false, std::memory_order_release);
}

void inject_no_python_callers(bool on) { g_injected_off.store(on, std::memory_order_relaxed); }

void stop_python_callers() {
  set_op_begin_observer(nullptr);
  g_stopped.store(true, std::memory_order_release);
}

bool python_callers_cover(int64_t now_ns, int64_t window_ns, double min_cpu_share) {
  if (!g_owned.load(std::memory_order_acquire) || g_stopped.load(std::memory_order_acquire) ||
      g_injected_off.load(std::memory_order_relaxed) || g_generation.load(std::memory_order_relaxed) == 0) {
    return false;
  }
  const int used = std::min(g_thread_count.load(std::memory_order_acquire), kMaxThreads);
  bool any = false;
  bool covered = true;
  for (int i = 0; i < used; ++i) {
    ThreadCallers* callers = g_threads[i].load(std::memory_order_acquire);
    if (callers == nullptr) continue;
    any = true;
    if (now_ns - callers->last_begin_ns.load(std::memory_order_relaxed) <= window_ns) continue;
    // Its clock is read only here, where no recent op covers it: a share of the time since the last
    // reading, which after a stretch of ops is the whole stretch (busy: read once more, and from
    // the next period on the share is the period's).
    uint64_t cpu_ns = 0;
    if (!read_clock_ns(thread_cpu_clock(callers->tid), &cpu_ns)) continue;  // exited: nothing more to sample
    const bool measured = callers->asked_cpu_ns != 0 && cpu_ns >= callers->asked_cpu_ns && now_ns > callers->asked_ns;
    const bool idle = measured && static_cast<double>(cpu_ns - callers->asked_cpu_ns) <
                                      min_cpu_share * static_cast<double>(now_ns - callers->asked_ns);
    callers->asked_cpu_ns = cpu_ns;
    callers->asked_ns = now_ns;
    if (!idle) covered = false;  // every uncovered thread's clock is still read, for the next ask
  }
  // A thread past kMaxThreads runs ops without a record: only reads see its Python.
  return any && covered && g_thread_count.load(std::memory_order_relaxed) <= kMaxThreads;
}

double python_callers_fill() {
  uint64_t fullest = 0;
  const int used = std::min(g_thread_count.load(std::memory_order_acquire), kMaxThreads);
  for (int i = 0; i < used; ++i) {
    const ThreadCallers* callers = g_threads[i].load(std::memory_order_acquire);
    if (callers == nullptr) continue;
    fullest = std::max(fullest, callers->head.load(std::memory_order_acquire) -
                                    callers->tail.load(std::memory_order_relaxed));
  }
  return static_cast<double>(fullest) / static_cast<double>(kRingRecords);
}

PyObject* drain_python_callers() {
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  const int used = std::min(g_thread_count.load(std::memory_order_acquire), kMaxThreads);
  for (int i = 0; i < used; ++i) {
    ThreadCallers* callers = g_threads[i].load(std::memory_order_acquire);
    if (callers == nullptr) continue;
    const uint64_t from = callers->tail.load(std::memory_order_relaxed);
    const uint64_t to = callers->head.load(std::memory_order_acquire);
    // Once stopped (no hook writes any more), a gap still open is closed here: from its time on
    // the caller is not known, though no later change came to record it.
    const bool close_gap = g_stopped.load(std::memory_order_acquire) && callers->gap_ns != 0;
    const uint64_t count = to - from + (close_gap ? 1 : 0);
    PyObject* records = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(count * sizeof(CallerRecord)));
    if (records == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    auto* into = reinterpret_cast<CallerRecord*>(PyBytes_AS_STRING(records));
    for (uint64_t at = from; at < to; ++at) *into++ = callers->ring[at & (kRingRecords - 1)];
    if (close_gap) {
      *into = CallerRecord{callers->gap_ns, kUnknownChain, 0};
      callers->gap_ns = 0;
    }
    callers->tail.store(to, std::memory_order_release);
    if (!append_new(out, Py_BuildValue("(iNK)", static_cast<int>(callers->tid), records,
                                       static_cast<unsigned long long>(callers->lost.load(std::memory_order_relaxed))))) {
      return nullptr;
    }
  }
  return out;
}

PyObject* python_caller_chains(Py_ssize_t first) {
  // Copied under the lock, made into Python objects after it: an allocation may run the garbage
  // collector, and a finaliser an op, whose hook may need the lock to intern a chain.
  std::vector<std::vector<std::pair<std::string, std::string>>> names;
  std::vector<std::vector<int>> lines;
  if (g_interned) {
    Interned& interned = *g_interned;
    std::lock_guard<std::mutex> lock(interned.mutex);
    for (size_t id = static_cast<size_t>(std::max<Py_ssize_t>(first, 0)); id < interned.chains.size(); ++id) {
      auto& chain_names = names.emplace_back();
      auto& chain_lines = lines.emplace_back();
      for (const FrameName& frame : interned.chains[id]) {
        chain_names.emplace_back(interned.strings[frame.function], interned.strings[frame.file]);
        chain_lines.push_back(frame.line);
      }
    }
  }
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  for (size_t id = 0; id < names.size(); ++id) {
    PyObject* frames = PyList_New(0);
    if (frames == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    for (size_t i = 0; i < names[id].size(); ++i) {
      const auto& [function, file] = names[id][i];
      if (!append_new(frames, Py_BuildValue("(s#s#i)", function.data(), static_cast<Py_ssize_t>(function.size()),
                                            file.data(), static_cast<Py_ssize_t>(file.size()), lines[id][i]))) {
        Py_DECREF(out);
        return nullptr;
      }
    }
    if (!append_new(out, frames)) return nullptr;
  }
  return out;
}

#else  // another CPython: no op callers, the sampler's reads alone

bool python_callers_supported() { return false; }
void start_python_callers() {}
void release_python_callers() {}
void inject_no_python_callers(bool) {}
void stop_python_callers() {}
PyObject* drain_python_callers() { return PyList_New(0); }
double python_callers_fill() { return 0.0; }
bool python_callers_cover(int64_t, int64_t, double) { return false; }
PyObject* python_caller_chains(Py_ssize_t) { return PyList_New(0); }

#endif

}  // namespace cpuprof
