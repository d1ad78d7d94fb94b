// RowIndex: the key -> row slot map of one stripe of a sparse table.
//
// Why not absl::flat_hash_map: a sparse pull or push of keys spread over a table much larger
// than the caches is bound by the cache lines each key touches. flat_hash_map keeps its
// control bytes and its (key, value) slots in two arrays, so a lookup waits on two lines
// before the row's own; the profile of a 10k-key pull showed the server waiting there most
// of its time. Here an entry holds the key and the slot together (16 bytes, four to a 64-byte
// line, the array aligned to lines) and probing is linear, so a lookup at the load kept here
// (at most 5/8) reads one line almost always.
//
// Positions come from Mix64(key ^ seed) with a seed drawn once per process, so that a client
// cannot choose keys that pile onto one position (linear probing would then cost a scan per
// key). Bits 16..55 of the mix are used, away from the top byte (the table's stripe comes
// from the top byte of a mix with another seed) and from the low bits (the Partitioner takes
// Mix64(key) modulo the server count).
//
// The entries grow with the keys and shrink again when most keys are erased (an eviction
// after a large push in flight), so that memory taken for a spike comes back.
//
// Thread-compatible: the owning stripe's mutex guards it.
#ifndef PS_SERVER_ROW_INDEX_H_
#define PS_SERVER_ROW_INDEX_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>

#include "common/hash.h"

namespace ps::server {

class RowIndex {
 public:
  // What Find returns for a key that is not there; never a slot (slots are < 2^32 - 1).
  static constexpr uint32_t kAbsent = ~uint32_t{0};

  RowIndex();
  RowIndex(const RowIndex&) = delete;
  RowIndex& operator=(const RowIndex&) = delete;

  // The slot of `key`, or kAbsent.
  uint32_t Find(uint64_t key) const {
    if (size_ == 0) return kAbsent;
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      const Entry& e = entries_[i];
      if (e.slot == kAbsent) return kAbsent;
      if (e.key == key) return e.slot;
    }
  }
  bool Contains(uint64_t key) const { return Find(key) != kAbsent; }
  // Starts loading the line where a lookup of `key` begins.
  void Prefetch(uint64_t key) const {
    if (capacity_ != 0) __builtin_prefetch(&entries_[Home(key)]);
  }
  // Adds `key` -> `slot`. REQUIRES: key absent, slot != kAbsent.
  void Insert(uint64_t key, uint32_t slot);
  // Points `key` at `slot`. REQUIRES: key present, slot != kAbsent.
  void Update(uint64_t key, uint32_t slot);
  // Removes `key`. REQUIRES: key present. Once the entries are at least four times
  // CapacityFor(size()), shrinks them to twice that: an index holds at most about twice what
  // its keys need, and keys erased and inserted back and forth do not rebuild it each time.
  void Erase(uint64_t key);

  size_t size() const { return size_; }
  // Entries allocated; each takes bytes_per_entry().
  size_t capacity() const { return capacity_; }
  static constexpr size_t bytes_per_entry() { return sizeof(Entry); }
  // The capacity that `n` keys inserted into an empty index grow it to: the least power of
  // two, at least 16, with a load of at most 5/8. REQUIRES: n < 2^58.
  static size_t CapacityFor(size_t n);

 private:
  struct Entry {
    uint64_t key;
    uint32_t slot;  // kAbsent: the entry is free
    uint32_t unused;
  };
  static constexpr std::align_val_t kAlignment{64};
  struct EntriesDeleter {
    void operator()(Entry* p) const { ::operator delete[](p, kAlignment); }
  };

  size_t Home(uint64_t key) const {
    return static_cast<size_t>(common::Mix64(key ^ seed_) >> 16) & mask_;
  }
  // The position of `key` (present). REQUIRES: key present.
  size_t PositionOf(uint64_t key) const;
  // Moves the entries into a new array of `capacity` (a power of two that holds them).
  void Rebuild(size_t capacity);
  void Place(uint64_t key, uint32_t slot);  // REQUIRES: room and key absent

  const uint64_t seed_;
  std::unique_ptr<Entry[], EntriesDeleter> entries_;
  size_t capacity_ = 0;  // 0 or a power of two
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace ps::server

#endif  // PS_SERVER_ROW_INDEX_H_
