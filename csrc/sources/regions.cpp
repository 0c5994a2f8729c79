#include "sources/regions.h"

#include <cstring>

#include "sources/op_source.h"

namespace cpuprof {

void region_begin(const std::string& name, uintptr_t id) {
  with_op_stack(Boundary::Begin, [&](Session& session, DispatchState& state, int64_t enter_ns) {
    session.begin_op(&state, enter_ns, id, hash_name(name.c_str()), /*is_region=*/true, [&](OpEntry& entry) {
      strncpy(entry.name, name.c_str(), sizeof(entry.name) - 1);
    });
  });
}

void region_end(uintptr_t id) {
  with_op_stack(Boundary::End, [&](Session& session, DispatchState& state, int64_t enter_ns) {
    session.end_op(&state, enter_ns, id);
  });
}

}  // namespace cpuprof
