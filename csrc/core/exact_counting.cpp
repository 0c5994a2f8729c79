// Exact counting: the team is read at both ends of every op, so every op gets its own deltas.
//
// Cost: two group reads per team thread per op. Reading the calling thread costs about a
// microsecond; reading a thread running on another CPU interrupts that CPU (about 10 µs in a VM),
// which is why this is the mode for short runs where per-op exactness matters.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <memory>
#include <vector>

#include "core/counting.h"

namespace cpuprof {

namespace {

// Team members read per op in exact mode. Beyond it a member's work is charged only through the
// children that read it; a team this large makes every op cost milliseconds in this mode anyway.
constexpr int kMaxExactTeam = 256;

class ExactCounting final : public CountingStrategy {
 public:
  ExactCounting(CountingContext& context, const CountingOptions& options)
      : ctx_(context), buffers_(static_cast<size_t>(options.n_dispatch_states)) {
    n_events_ = std::max(context.n_events(), 1);
    stride_ = static_cast<size_t>(kMaxExactTeam) * n_events_;
  }

  CountingMode mode() const override { return CountingMode::Exact; }

  void begin_op(DispatchState& state, int depth, int64_t) override {
    Buffers& b = buffers(state);
    Frame& frame = state.frames[depth];
    frame.team_at_begin = std::min(ctx_.team->size(), kMaxExactTeam);
    read_members(b.start.get() + depth * stride_, frame.team_at_begin, state.slot, /*own_first=*/false);
    std::memset(b.children.get() + depth * stride_, 0, stride_ * sizeof(uint64_t));
  }

  void end_op(DispatchState& state, int depth, int64_t, int64_t hook_inside_ns, uint64_t* span_counters) override {
    Buffers& b = buffers(state);
    Frame& frame = state.frames[depth];
    const int n_events = ctx_.n_events();
    const int members_now = std::min(ctx_.team->size(), kMaxExactTeam);
    RawCount* now_counts = b.scratch.get();
    read_members(now_counts, members_now, state.slot, /*own_first=*/true);
    const RawCount* start = b.start.get() + depth * stride_;
    const uint64_t* children = b.children.get() + depth * stride_;
    uint64_t* parent = depth > 0 ? b.children.get() + (depth - 1) * stride_ : nullptr;
    for (int m = 0; m < members_now; ++m) {
      const int slot = ctx_.team->member(m);
      if (!reads(slot, state.slot) || !ctx_.table->slot_ready(slot)) continue;
      for (int event = 0; event < n_events; ++event) {
        const size_t i = static_cast<size_t>(m) * n_events_ + event;
        uint64_t incl;
        if (m < frame.team_at_begin) {
          const ScaledCount delta = scale_delta(start[i], now_counts[i]);
          incl = static_cast<uint64_t>(std::llround(delta.value));
          if (delta.scaled) ctx_.scaled_events.fetch_or(1u << event, std::memory_order_relaxed);
          // CPU clocks also ran during the nested ops' callbacks (our reads): on this thread, and
          // on the team's workers, which spin between parallel regions while the dispatching
          // thread is in our hook. That time is known exactly; it is taken out, as from the wall.
          // Never below what the children claimed: a worker asleep during our hook spent nothing.
          if (ctx_.cpu_clock_event[event]) {
            incl = incl > static_cast<uint64_t>(hook_inside_ns) ? incl - hook_inside_ns : 0;
            if (incl < children[i]) incl = children[i];
          }
        } else {
          // Joined the team after this op began, so it was not read then: what this op's
          // children saw of it is what the op can claim.
          incl = children[i];
        }
        if (incl == 0) continue;
        const uint64_t self_count = incl > children[i] ? incl - children[i] : 0;
        ctx_.table->counter(frame.entry, slot, event, false).fetch_add(incl, std::memory_order_relaxed);
        if (self_count) ctx_.table->counter(frame.entry, slot, event, true).fetch_add(self_count, std::memory_order_relaxed);
        if (parent) parent[i] += incl;
        if (span_counters) span_counters[event] += incl;
      }
    }
  }

  void stop(int64_t) override {}

 private:
  struct FreeDeleter {
    void operator()(void* p) const { std::free(p); }
  };
  template <typename T>
  using Buffer = std::unique_ptr<T[], FreeDeleter>;
  template <typename T>
  static Buffer<T> zeroed(size_t n) {
    return Buffer<T>(static_cast<T*>(std::calloc(n, sizeof(T))));
  }

  struct Buffers {
    Buffer<RawCount> start;     // [depth][member][event]: counts when each frame began
    Buffer<uint64_t> children;  // [depth][member][event]: inclusive deltas of its children
    Buffer<RawCount> scratch;   // [member][event]: the read at an op's end
  };

  // Sized on a dispatching thread's first op (once per thread, never per op). calloc, not new[]:
  // blocks this large come zeroed from fresh pages, so nothing is written now and only the
  // depths and members an op actually uses ever become resident (new RawCount[] would write
  // every element: megabytes, tens of milliseconds, inside the first op).
  Buffers& buffers(const DispatchState& state) {
    Buffers& b = buffers_[state.index];
    if (!b.start) {
      b.start = zeroed<RawCount>(kMaxDepth * stride_);
      b.children = zeroed<uint64_t>(kMaxDepth * stride_);
      b.scratch = zeroed<RawCount>(stride_);
      if (!b.start || !b.children || !b.scratch) throw std::bad_alloc();
    }
    return b;
  }

  // Other dispatching threads' counters belong to their own ops.
  bool reads(int slot, int own) const { return slot == own || !ctx_.team->is_dispatch(slot); }

  // Reads the first `n` team members into out[member][event]. `own` is read first or last so
  // that the other reads' cost falls outside the op on the calling thread's clock.
  void read_members(RawCount* out, int n, int own, bool own_first) {
    uint32_t counted = 0;
    int own_member = -1;
    for (int m = 0; m < n; ++m) {
      const int slot = ctx_.team->member(m);
      RawCount* row = out + static_cast<size_t>(m) * n_events_;
      if (slot == own) {
        own_member = m;
        if (own_first) ctx_.registry->slot(slot).counters.read_raw(row, &counted);
        continue;
      }
      if (reads(slot, own)) {
        ctx_.registry->slot(slot).counters.read_raw(row, &counted);
      } else {
        std::fill_n(row, n_events_, RawCount{});  // never read at begin nor end: a zero delta
      }
    }
    if (own_member >= 0 && !own_first) {
      ctx_.registry->slot(own).counters.read_raw(out + static_cast<size_t>(own_member) * n_events_, &counted);
    }
  }

  CountingContext& ctx_;
  std::vector<Buffers> buffers_;
  int n_events_ = 1;
  size_t stride_ = 0;
};

}  // namespace

std::unique_ptr<CountingStrategy> make_exact_counting(CountingContext& context, const CountingOptions& options) {
  return std::make_unique<ExactCounting>(context, options);
}

}  // namespace cpuprof
