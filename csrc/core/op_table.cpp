#include "core/op_table.h"

namespace cpuprof {

InputDesc* InputWriter::next() {
  if (entry_.n_inputs >= kMaxKeyInputs) {
    entry_.inputs_truncated = true;
    return nullptr;
  }
  InputDesc* desc = &entry_.inputs[entry_.n_inputs++];
  *desc = InputDesc{};
  return desc;
}

bool InputWriter::tensor(const char* dtype, int ndim, const int64_t* sizes, const int64_t* strides) {
  if (ndim < 0 || dims_used_ + ndim > kMaxKeyDims) {
    entry_.inputs_truncated = true;
    return false;
  }
  InputDesc* desc = next();
  if (desc == nullptr) return false;
  desc->kind = InputKind::Tensor;
  desc->ndim = static_cast<uint8_t>(ndim);
  desc->dims_at = static_cast<uint8_t>(dims_used_);
  strncpy(desc->dtype, dtype, sizeof(desc->dtype) - 1);
  for (int d = 0; d < ndim; ++d) {
    entry_.sizes[dims_used_ + d] = sizes[d];
    entry_.strides[dims_used_ + d] = strides[d];
  }
  dims_used_ += ndim;
  return true;
}

bool InputWriter::scalar(InputKind kind) {
  InputDesc* desc = next();
  if (desc == nullptr) return false;
  desc->kind = kind;
  return true;
}

bool InputWriter::unknown_shape(const char* dtype) {
  InputDesc* desc = next();
  if (desc == nullptr) return false;
  desc->kind = InputKind::UnknownShape;
  strncpy(desc->dtype, dtype, sizeof(desc->dtype) - 1);
  return true;
}

bool InputWriter::tensor_list(int n) {
  InputDesc* desc = next();
  if (desc == nullptr) return false;
  desc->kind = InputKind::TensorList;
  desc->list_len = static_cast<uint8_t>(n > 255 ? 255 : n);
  return true;
}

void OpTable::init(int capacity, int max_slots, int n_events) {
  capacity_ = rounded_capacity(capacity);
  max_slots_ = max_slots;
  n_events_ = n_events > 0 ? n_events : 1;
  entries_ = std::make_unique<OpEntry[]>(capacity_);
  n_blocks_ = (max_slots + kSlotsPerBlock - 1) / kSlotsPerBlock;
  owned_blocks_.reset(new std::unique_ptr<std::atomic<uint64_t>[], FreeDeleter>[n_blocks_]);
  blocks_.reset(new std::atomic<std::atomic<uint64_t>*>[n_blocks_]);
  for (int b = 0; b < n_blocks_; ++b) blocks_[b].store(nullptr, std::memory_order_relaxed);
  reset();
}

void OpTable::reserve_slots(int n) {
  std::lock_guard<std::mutex> lock(reserve_mutex_);
  const int wanted = std::min((n + kSlotsPerBlock - 1) / kSlotsPerBlock, n_blocks_);
  const size_t cells = static_cast<size_t>(capacity_) * kSlotsPerBlock * n_events_ * 2;
  for (int b = 0; b < wanted; ++b) {
    if (blocks_[b].load(std::memory_order_relaxed) != nullptr) continue;
    auto* block = static_cast<std::atomic<uint64_t>*>(std::calloc(cells, sizeof(std::atomic<uint64_t>)));
    if (block == nullptr) continue;  // counted as not charged: slot_ready() stays false
    owned_blocks_[b].reset(block);
    blocks_[b].store(block, std::memory_order_release);
  }
}

void OpTable::reset() {
  used_.store(static_cast<int>(kFirstOpEntry));
  overflowed_.store(0);
  std::strcpy(entries_[kOverflowEntry].name, "[other ops: op table full]");
  entries_[kOverflowEntry].kind = EntryKind::Special;
  entries_[kOverflowEntry].key.store(~0ULL);
  entries_[kOverflowEntry].ready.store(1);
  std::strcpy(entries_[kOutsideEntry].name, "[outside ATen ops]");
  entries_[kOutsideEntry].kind = EntryKind::Special;
  entries_[kOutsideEntry].key.store(~1ULL);
  entries_[kOutsideEntry].ready.store(1);
  std::strcpy(entries_[kProfilerEntry].name, "[cpuprof callbacks]");
  entries_[kProfilerEntry].kind = EntryKind::Special;
  entries_[kProfilerEntry].key.store(~2ULL);
  entries_[kProfilerEntry].ready.store(1);
}

size_t OpTable::memory_bytes() const {
  size_t blocks = 0;
  for (int b = 0; b < n_blocks_; ++b) blocks += blocks_[b].load(std::memory_order_relaxed) != nullptr;
  return static_cast<size_t>(capacity_) * sizeof(OpEntry) +
         blocks * static_cast<size_t>(capacity_) * kSlotsPerBlock * n_events_ * 2 * sizeof(uint64_t);
}

}  // namespace cpuprof
