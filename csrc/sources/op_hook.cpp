// The RecordFunction callbacks that feed every ATen op into the session. The only unit of the
// core that includes torch: it turns a RecordFunction into a key and a structured description.
#include "sources/op_hook.h"

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <atomic>
#include <cstring>

#include "sources/op_source.h"

namespace cpuprof {

namespace {

at::CallbackHandle g_handle = 0;
at::CallbackHandle g_empty_handle = 0;
std::atomic<OpBeginObserver> g_begin_observer{nullptr};

// Sizes that can be read without throwing or calling into Python: nested tensors, symbolic
// shapes (torch.compile) and Python-dispatch subclasses are described without dims.
bool plain_sizes(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return !impl->is_nested() && !impl->has_symbolic_sizes_strides() && !impl->is_python_dispatch();
}

// Strides exist only for strided layouts (not sparse or mkldnn tensors).
bool has_strides(const at::Tensor& t) { return t.layout() == c10::kStrided; }

InputKind scalar_kind(const c10::IValue& v) {
  return v.isNone()      ? InputKind::None
         : v.isBool()    ? InputKind::Bool
         : v.isInt()     ? InputKind::Int
         : v.isDouble()  ? InputKind::Float
         : v.isIntList() ? InputKind::IntList
                         : InputKind::Other;
}

uint64_t hash_tensor(uint64_t h, const at::Tensor& t) {
  if (!t.defined()) return mix_hash(h, 0x7e);
  h = mix_hash(h, static_cast<uint64_t>(t.scalar_type()) + 0x100);
  if (!plain_sizes(t)) return mix_hash(h, 0x7d);
  for (int64_t size : t.sizes()) h = mix_hash(h, static_cast<uint64_t>(size));
  // Strides are part of the key: a transposed weight runs another kernel than a contiguous one.
  if (has_strides(t)) {
    for (int64_t stride : t.strides()) h = mix_hash(h, static_cast<uint64_t>(stride) + 0x400);
  }
  return mix_hash(h, static_cast<uint64_t>(t.dim()) + 0x200);
}

uint64_t hash_inputs(uint64_t h, const at::RecordFunction& fn) {
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) {
      h = hash_tensor(h, v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) h = hash_tensor(h, t);
      h = mix_hash(h, 0x300);
    } else {
      h = mix_hash(h, static_cast<uint64_t>(scalar_kind(v)));
    }
  }
  return h;
}

const char* short_dtype(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float: return "f32";
    case c10::ScalarType::BFloat16: return "bf16";
    case c10::ScalarType::Half: return "f16";
    case c10::ScalarType::Double: return "f64";
    case c10::ScalarType::Long: return "i64";
    case c10::ScalarType::Int: return "i32";
    case c10::ScalarType::Short: return "i16";
    case c10::ScalarType::Char: return "i8";
    case c10::ScalarType::Byte: return "u8";
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::ComplexFloat: return "c64";
    case c10::ScalarType::ComplexDouble: return "c128";
    case c10::ScalarType::Float8_e4m3fn: return "f8e4m3";
    case c10::ScalarType::Float8_e5m2: return "f8e5m2";
    case c10::ScalarType::QInt8: return "qi8";
    case c10::ScalarType::QUInt8: return "qu8";
    default: return "other";
  }
}

void describe_tensor(InputWriter& w, const at::Tensor& t) {
  if (!t.defined()) {
    w.scalar(InputKind::Undefined);
    return;
  }
  const char* dtype = short_dtype(t.scalar_type());
  if (!plain_sizes(t)) {
    w.unknown_shape(dtype);
    return;
  }
  const auto sizes = t.sizes();
  if (has_strides(t)) {
    const auto strides = t.strides();
    w.tensor(dtype, static_cast<int>(sizes.size()), sizes.data(), strides.data());
  } else {
    int64_t none[kMaxKeyDims] = {};  // no strides: reported as zeros
    const int ndim = static_cast<int>(sizes.size());
    if (ndim <= kMaxKeyDims) {
      w.tensor(dtype, ndim, sizes.data(), none);
    } else {
      w.unknown_shape(dtype);
    }
  }
}

void describe_inputs(const at::RecordFunction& fn, OpEntry& entry) {
  InputWriter w(entry);
  for (const c10::IValue& v : fn.inputs()) {
    if (v.isTensor()) {
      describe_tensor(w, v.toTensor());
    } else if (v.isTensorList()) {
      const auto list = v.toTensorList();
      w.tensor_list(static_cast<int>(list.size()));
      for (const at::Tensor& t : list) describe_tensor(w, t);
    } else {
      w.scalar(scalar_kind(v));
    }
  }
}

// Whether any op (not a region: a region's frame opens a region for its children, its
// child_region is its own entry) is open on the thread: a region inside an op (record_function in
// a Python kernel) is still the op's implementation. Frames that ended out of order and wait to
// be popped are not open; frames too deep to be kept are taken for ops. A few frames at most.
bool inside_op(const DispatchState& state) {
  if (state.local_depth > kMaxDepth) return true;
  for (int d = 0; d < state.local_depth; ++d) {
    const Frame& frame = state.frames[d];
    if (!frame.done && frame.child_region != frame.entry) return true;
  }
  return false;
}

std::unique_ptr<at::ObserverContext> on_begin(const at::RecordFunction& fn) {
  with_op_stack(Boundary::Begin, [&](Session& session, DispatchState& state, int64_t enter_ns) {
    const bool is_region = fn.scope() == at::RecordScope::USER_SCOPE;
    if (const OpBeginObserver observe = g_begin_observer.load(std::memory_order_relaxed); observe && !is_region) {
      observe(enter_ns, inside_op(state));
    }
    bool shapes = session.record_shapes() && !is_region;
    const char* name = fn.name();
    uint64_t hash = hash_name(name);
    if (shapes) {
      // An exception must not escape: torch would log it, skip our begin and still call our end.
      try {
        hash = hash_inputs(hash, fn);
      } catch (...) {
        shapes = false;
        hash = mix_hash(hash_name(name), 0x7c);
      }
    }
    session.begin_op(&state, enter_ns, reinterpret_cast<uintptr_t>(&fn), hash, is_region, [&](OpEntry& entry) {
      strncpy(entry.name, name, sizeof(entry.name) - 1);
      if (!shapes) return;
      try {
        describe_inputs(fn, entry);
      } catch (...) {
        entry.has_inputs = false;
        entry.n_inputs = 0;
      }
    });
  });
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  with_op_stack(Boundary::End, [&](Session& session, DispatchState& state, int64_t enter_ns) {
    session.end_op(&state, enter_ns, reinterpret_cast<uintptr_t>(&fn));
  });
}

std::unique_ptr<at::ObserverContext> on_begin_empty(const at::RecordFunction&) { return nullptr; }
void on_end_empty(const at::RecordFunction&, at::ObserverContext*) {}

// The op hook and the dispatch floor's empty callbacks are registered alike, so that the floor
// measures what torch does to reach the hook.
at::CallbackHandle add_global_callbacks(at::RecordFunctionCallback::StartCallback begin,
                                        at::RecordFunctionCallback::EndCallback end, bool needs_inputs) {
  return at::addGlobalCallback(at::RecordFunctionCallback(begin, end)
                                   .needsInputs(needs_inputs)
                                   .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
}

}  // namespace

void install_op_hook(bool needs_inputs) {
  if (g_handle != 0) return;
  g_handle = add_global_callbacks(on_begin, on_end, needs_inputs);
}

void set_op_begin_observer(OpBeginObserver observer) { g_begin_observer.store(observer, std::memory_order_release); }

void inject_empty_callbacks(bool on, bool needs_inputs) {
  if (g_empty_handle != 0) {
    at::removeCallback(g_empty_handle);
    g_empty_handle = 0;
  }
  if (!on) return;
  g_empty_handle = add_global_callbacks(on_begin_empty, on_end_empty, needs_inputs);
}

void remove_op_hook() {
  if (g_handle == 0) return;
  at::removeCallback(g_handle);
  g_handle = 0;
}

}  // namespace cpuprof
