#include "server/row_index.h"

#include <random>

#include "glog/logging.h"

namespace ps::server {
namespace {

// One seed per process: positions are unpredictable from outside, and equal within a run.
uint64_t ProcessSeed() {
  static const uint64_t seed = [] {
    std::random_device rd;
    return (uint64_t{rd()} << 32) ^ rd();
  }();
  return seed;
}

// The table grows before more than 5/8 of its entries are taken.
bool Full(size_t size, size_t capacity) { return (size + 1) * 8 > capacity * 5; }

}  // namespace

RowIndex::RowIndex() : seed_(ProcessSeed()) {}

size_t RowIndex::PositionOf(uint64_t key) const {
  for (size_t i = Home(key);; i = (i + 1) & mask_) {
    CHECK_NE(entries_[i].slot, kAbsent) << "RowIndex: key " << key << " is not present";
    if (entries_[i].key == key) return i;
  }
}

void RowIndex::Place(uint64_t key, uint32_t slot) {
  size_t i = Home(key);
  while (entries_[i].slot != kAbsent) i = (i + 1) & mask_;
  entries_[i] = Entry{key, slot, 0};
}

size_t RowIndex::CapacityFor(size_t n) {
  size_t capacity = 16;
  while (n * 8 > capacity * 5) capacity *= 2;
  return capacity;
}

void RowIndex::Rebuild(size_t capacity) {
  std::unique_ptr<Entry[], EntriesDeleter> old(std::move(entries_));
  const size_t old_capacity = capacity_;
  entries_.reset(new (kAlignment) Entry[capacity]);
  for (size_t i = 0; i < capacity; ++i) entries_[i].slot = kAbsent;
  capacity_ = capacity;
  mask_ = capacity - 1;
  for (size_t i = 0; i < old_capacity; ++i) {
    if (old[i].slot != kAbsent) Place(old[i].key, old[i].slot);
  }
}

void RowIndex::Insert(uint64_t key, uint32_t slot) {
  DCHECK_NE(slot, kAbsent);
  DCHECK(!Contains(key));
  if (capacity_ == 0 || Full(size_, capacity_)) Rebuild(capacity_ == 0 ? 16 : capacity_ * 2);
  Place(key, slot);
  ++size_;
}

void RowIndex::Update(uint64_t key, uint32_t slot) {
  DCHECK_NE(slot, kAbsent);
  entries_[PositionOf(key)].slot = slot;
}

void RowIndex::Erase(uint64_t key) {
  size_t hole = PositionOf(key);
  entries_[hole].slot = kAbsent;
  --size_;
  // Backward shift (no tombstones): an entry after the hole moves into it when its probe
  // sequence, which starts at its home and ends at it, passes the hole.
  for (size_t j = (hole + 1) & mask_; entries_[j].slot != kAbsent; j = (j + 1) & mask_) {
    const size_t home = Home(entries_[j].key);
    if (((j - home) & mask_) >= ((j - hole) & mask_)) {
      entries_[hole] = entries_[j];
      entries_[j].slot = kAbsent;
      hole = j;
    }
  }
  // Shrinks when CapacityFor(size_) <= capacity_ / 4 (both are powers of two, so this is
  // the same test without the loop), to twice that: a load of about 5/16, so the keys must
  // double before the index grows again or halve before it shrinks again, and each rebuild
  // is paid for by O(capacity) inserts or erases.
  if (capacity_ >= 64 && size_ * 8 <= capacity_ / 4 * 5) Rebuild(2 * CapacityFor(size_));
}

}  // namespace ps::server
