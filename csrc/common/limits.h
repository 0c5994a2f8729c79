// Every default and limit of the core, in one place.
//
// Python never re-types these, and neither does any other file: at configure time one reader
// (src/cpuprof/_limits_header.py) turns each `constexpr <type> kName = <digits>;` line into both
// cpuprof/_build_info.py's LIMITS (so the CLI can check options without importing torch) and the
// table `_native.limits` is built from (limits_table.h, whose static_asserts check the parse).
// Adding a limit is one line here, in that form; a `constexpr` line in any other form fails the build.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cpuprof {

// Events per session: one perf group read returns at most this many values.
constexpr int kMaxEvents = 16;
// Op nesting recorded per dispatching thread; deeper ops are timed as part of their parent.
constexpr int kMaxDepth = 64;
// Threads that run ATen ops (the "dispatching" threads) with their own op stack.
constexpr int kMaxDispatchThreads = 64;
// Thread slots per session: every thread of the process gets one, however it was created.
// Sized at start; slots beyond it are counted, never silently lost.
constexpr int kDefaultMaxThreads = 4096;
constexpr int kMaxThreadsLimit = 65536;
// Distinct op keys (name, inputs, region) kept; further keys fold into one counted entry.
constexpr int kDefaultOpCapacity = 2048;
constexpr int kMinOpCapacity = 16;
constexpr int kMaxOpCapacity = 1048576;
// Per-op counters per thread: the op table's keys (its capacity rounded up to a power of two)
// times the events. Each is an inclusive and a self total (16 bytes), reserved for every 64
// threads as they appear: at most 16 MiB per thread, 1 GiB of address space per 64 threads
// (the largest capacity with 16 events would otherwise reserve 17 GB per 64 threads).
constexpr int kMaxOpCountersPerThread = 1048576;
// Op spans kept per dispatching thread (the newest ones) for the timeline.
constexpr int kMaxSpanCapacity = 16777216;
// Sampled mode: every thread is sampled by the kernel each time it has used 1/Hz of CPU time.
// 250, not perf's or VTune's 1000: per-op CPU comes from the threads' switch records, not from
// samples, which place the stacks and the other events; at 1 kHz their interrupts, stack copies
// and unwinding cost a decode with every CPU busy about 3% of its tokens/s, at 250 Hz under 1%
// (benches/README.md), and a second of two threads still gives 500 samples (a figure from samples
// needs 30 for an op, 10 for a thread's waits, 300 for a configuration in compare).
constexpr int kDefaultSampleHz = 250;
constexpr int kMinSampleHz = 10;
constexpr int kMaxSampleHz = 20000;
// User stack copied with each sample for unwinding (perf's own default for --call-graph dwarf);
// at most 65528 bytes, a multiple of 8 (the kernel's limit).
constexpr int kDefaultStackBytes = 8192;
constexpr int kMaxStackBytes = 65528;
// Ring buffer pages per thread (a power of two) when nothing sizes them; a session sizes them to
// 2.5 collector periods of samples (profile._ring_pages). The smallest a ring is mapped at when
// the locked-memory budget refuses a larger one: three samples with 8 KiB stacks. No ring is asked
// for or mapped that holds fewer than kMinRingSamples of the records the copied stack makes (one
// smaller than a record takes no sample at all: a plain counter and the refusal named beat that).
constexpr int kDefaultRingPages = 64;
constexpr size_t kMinRingPages = 8;
constexpr size_t kMinRingSamples = 2;
// A sample record's bytes besides its copied stack, at most: header, ids, time, the kernel's call
// chain (perf_event_max_stack, 127 entries by default), user registers, the stack's two sizes.
constexpr size_t kSampleRecordBytesBesidesStack = 2048;
// Op begins and ends a dispatching thread can have waiting for the collector: a period and the
// join lag (60 ms at the default) at 2 million events a second, 3 MiB, touched only as it fills.
constexpr int kOpEventCapacity = 131072;
// Native stacks kept: distinct stacks, their frames, (stack, thread, op) counts, and the newest
// samples one by one for timelines.
constexpr int kMaxStacks = 65536;
constexpr int kMaxStackFrames = 2097152;
constexpr int kMaxStackCounts = 65536;
constexpr int kDefaultTimelineSamples = 131072;
// How often the collector thread drains the sample rings, and how long it waits for op events
// to be published before it joins samples with them. Each pass costs a fixed part whatever it
// finds, and with every CPU busy a pass takes a compute thread's CPU: 40 ms instead of 10 ms took
// the collector from 2.0 to 1.2 % of a CPU and gave a decode about 1 point of its tokens/s back
// (benches/README.md, seventh session). The sample rings hold 2.5 periods (profile._ring_pages),
// 64 pages a thread at the default rate and stack (65 with the control page, against the 129 of
// perf_event_mlock_kb's default per CPU: just under two threads a CPU); past the budget a ring is
// mapped smaller (thread_counters.cpp).
constexpr int kCollectIntervalUs = 40000;
constexpr int kJoinLagUs = 20000;
// How often the collector looks for new threads and reads those outside the team: at every pass
// once the period is this long or longer, as the default is.
constexpr int kDiscoveryIntervalUs = 20000;
// Where the sample rings tell when threads are created, the collector walks /proc/self/task only
// when they tell one or after this long, for threads created by a thread they do not cover.
constexpr int kDiscoveryFallbackUs = 500000;
// A thread found with more CPU time than this has already worked (an existing OpenMP worker)
// and joins the team at once.
constexpr int kJoinedWorkerCpuNs = 1000000;
// Op keys: inputs described per op, and the dims (sizes and strides) they share.
// The last file descriptors under RLIMIT_NOFILE are the profiled program's: cpuprof never takes
// one of them for a counter, so its threads are left uncounted rather than the program failing.
// A quarter of the limit, within these bounds.
constexpr int kFdReserveMin = 8;
constexpr int kFdReserveMax = 256;
constexpr int kMaxKeyInputs = 16;
constexpr int kMaxKeyDims = 48;
constexpr int kMaxOpNameBytes = 96;

}  // namespace cpuprof
