// torch's allocator reports (the c10 memory-reporting hook torch.profiler's profile_memory uses),
// fed into the session: bytes allocated and freed per op.
#pragma once

namespace cpuprof {

// Makes torch's CPU allocator report every allocation and free made on the calling thread (and
// on threads that inherit its debug info, as at::launch tasks do) while the session runs.
// Returns false, installing nothing, when another memory reporter (torch.profiler with
// profile_memory) is already installed on this thread: cpuprof never hides torch.profiler's.
bool install_memory_hook();
// Removes the reporter if the calling thread installed it and it is still the innermost one;
// otherwise it stays, inert (it reports only while a session runs).
void remove_memory_hook();
// Test hook: while on, the installed reporter tells the allocator that nothing is profiled, so
// torch's allocator does none of its reporting work (what the reports cost a decode).
void inject_no_memory_reports(bool off);

}  // namespace cpuprof
