// See thread_list_lock.c. Held only around a walk that makes no Python object (nothing that could
// run the garbage collector, a finalizer, or release the GIL while the list is locked).
#pragma once

#ifdef __cplusplus
extern "C" {
#endif
void cpuprof_lock_thread_list(void);
void cpuprof_unlock_thread_list(void);
#ifdef __cplusplus
}
#endif
