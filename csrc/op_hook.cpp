#include "op_hook.h"

#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>

#include <cstdio>
#include <cstring>

#include "session.h"

namespace cpuprof {

namespace {

at::CallbackHandle g_handle = 0;

// Sizes that can be read without throwing or calling into Python: nested tensors, symbolic
// shapes (torch.compile) and Python-dispatch subclasses are keyed as "[?]".
bool plain_sizes(const at::Tensor& t) {
  const c10::TensorImpl* impl = t.unsafeGetTensorImpl();
  return !impl->is_nested() && !impl->has_symbolic_sizes_strides() && !impl->is_python_dispatch();
}

// A small code per kind of non-tensor argument, so keys tell None, bool, int and lists apart.
uint64_t argument_code(const c10::IValue& v) {
  return v.isNone() ? 1 : v.isBool() ? 2 : v.isInt() ? 3 : v.isDouble() ? 4 : v.isIntList() ? 5 : 6;
}

uint64_t hash_tensor(uint64_t h, const at::Tensor& t) {
  if (!t.defined()) return mix_hash(h, 0x7e);
  if (!plain_sizes(t)) return mix_hash(h, 0x7d);
  h = mix_hash(h, static_cast<uint64_t>(t.scalar_type()) + 0x100);
  for (int64_t size : t.sizes()) h = mix_hash(h, static_cast<uint64_t>(size));
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
      h = mix_hash(h, argument_code(v));
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
    case c10::ScalarType::Bool: return "bool";
    case c10::ScalarType::Char: return "i8";
    case c10::ScalarType::Byte: return "u8";
    default: return c10::toString(type);
  }
}

// Appends to a fixed buffer; once full, further text is cut (the hash still tells keys apart).
struct FixedWriter {
  char* out;
  size_t cap;
  size_t len = 0;
  void put(const char* text) {
    while (*text && len + 1 < cap) out[len++] = *text++;
    out[len] = '\0';
  }
  void put_tensor(const at::Tensor& t) {
    if (!t.defined()) {
      put("None");
      return;
    }
    if (!plain_sizes(t)) {
      put("[?] ");
      put(short_dtype(t.scalar_type()));
      return;
    }
    char buf[32];
    put("[");
    bool first = true;
    for (int64_t size : t.sizes()) {
      snprintf(buf, sizeof(buf), first ? "%lld" : ", %lld", static_cast<long long>(size));
      put(buf);
      first = false;
    }
    put("] ");
    put(short_dtype(t.scalar_type()));
  }
};

void format_inputs(const at::RecordFunction& fn, char* out, size_t cap) {
  FixedWriter w{out, cap};
  bool first = true;
  for (const c10::IValue& v : fn.inputs()) {
    if (!first) w.put("; ");
    first = false;
    if (v.isTensor()) {
      w.put_tensor(v.toTensor());
    } else if (v.isTensorList()) {
      w.put("(");
      bool first_item = true;
      for (const at::Tensor& t : v.toTensorList()) {
        if (!first_item) w.put(", ");
        first_item = false;
        w.put_tensor(t);
      }
      w.put(")");
    } else if (v.isIntList()) {
      w.put("ints");
    } else if (v.isNone()) {
      w.put("None");
    } else if (v.isInt()) {
      w.put("int");
    } else if (v.isDouble()) {
      w.put("float");
    } else if (v.isBool()) {
      w.put("bool");
    } else {
      w.put(v.tagKind().c_str());
    }
  }
}

std::unique_ptr<at::ObserverContext> on_begin(const at::RecordFunction& fn) {
  Session& session = Session::instance();
  if (!session.enter()) return nullptr;
  Session::Guard guard{session};
  const int64_t enter_ns = now_ns();
  DispatchState* state = session.dispatch_state();
  if (state == nullptr) {
    session.count_unattributed();
    return nullptr;
  }
  const bool is_region = fn.scope() == at::RecordScope::USER_SCOPE;
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
  session.begin_op(state, enter_ns, reinterpret_cast<uintptr_t>(&fn), hash, is_region, [&](OpEntry& entry) {
    strncpy(entry.name, name, sizeof(entry.name) - 1);
    if (!shapes) return;
    try {
      format_inputs(fn, entry.shapes, sizeof(entry.shapes));
    } catch (...) {
      strncpy(entry.shapes, "?", sizeof(entry.shapes) - 1);
    }
  });
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  Session& session = Session::instance();
  if (!session.enter()) return;
  Session::Guard guard{session};
  const int64_t enter_ns = now_ns();
  DispatchState* state = session.dispatch_state();
  if (state != nullptr) session.end_op(state, enter_ns, reinterpret_cast<uintptr_t>(&fn));
}

}  // namespace

void install_op_hook(bool needs_inputs) {
  if (g_handle != 0) return;
  g_handle = at::addGlobalCallback(
      at::RecordFunctionCallback(on_begin, on_end)
          .needsInputs(needs_inputs)
          .scopes({at::RecordScope::FUNCTION, at::RecordScope::USER_SCOPE}));
}

void remove_op_hook() {
  if (g_handle == 0) return;
  at::removeCallback(g_handle);
  g_handle = 0;
}

}  // namespace cpuprof
