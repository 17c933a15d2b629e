// The response cache: once a tensor name has been negotiated, every rank remembers its
// signature under an id the coordinator assigned. When the same name comes back with
// the same signature, the rank does not ask rank 0 again: it sets the id's bit in the
// next cycle (CacheCycle), and the tensor runs once every rank has set it. A rank
// checks only its own part (for an allgather its rows, for an alltoall its splits);
// a rank whose part changed asks for the entry's eviction in that cycle, so an entry
// runs only while every rank's part still matches what was negotiated. Entries are
// added only when a response list runs and evicted only after a cycle, the same on
// every rank, so the ranks' caches agree on what each id means; an evicted id may be
// given out again. When the capacity is reached, further new names take the full path.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/message.h"

namespace hvdlite {

class ResponseCache {
 public:
  explicit ResponseCache(int64_t capacity) : capacity_(capacity) {}
  bool Enabled() const { return capacity_ > 0; }
  static bool Cacheable(const Request& r);

  // Id under which `r` (same name and signature) is cached, or -1.
  int32_t Lookup(const Request& r) const;
  // Coordinator: the id a freshly negotiated name gets (its old id, a new one, or -1 when full).
  int32_t AssignId(const std::string& name);
  // Every rank, from a response: remember `sig` (a request without rank) under `id`,
  // with what the response said of every rank's part where the signature alone does
  // not say it (`sizes`: an allgather's rows per rank, an alltoall's splits matrix).
  void Put(int32_t id, const Request& sig, std::vector<int64_t> sizes = {});
  const Request& Get(int32_t id) const { return entries_.at(id).sig; }
  const std::vector<int64_t>& Sizes(int32_t id) const { return entries_.at(id).sizes; }
  // The id `name` is cached under (whatever its signature), or -1.
  int32_t IdOf(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? -1 : it->second;
  }
  bool Has(int32_t id) const { return entries_.count(id) != 0; }
  bool Empty() const { return entries_.empty(); }
  // Every rank, after a cycle that asked for it.
  void Erase(int32_t id);
  void Clear();

 private:
  int64_t capacity_;
  int32_t next_id_ = 0;
  std::vector<int32_t> free_ids_;  // evicted, to be given out again (coordinator)
  std::unordered_map<std::string, int32_t> by_name_;
  struct Entry {
    Request sig;
    std::vector<int64_t> sizes;
  };
  std::unordered_map<int32_t, Entry> entries_;
};

}  // namespace hvdlite
