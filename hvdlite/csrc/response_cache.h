// The response cache: once a tensor name has been negotiated, every rank remembers its
// signature under an id the coordinator assigned. When the same name comes back with
// the same signature, a rank sends only the id, the coordinator skips validation, and
// it answers with ids instead of full responses. Ids are never reused, so a rank's
// cache and the coordinator's cannot disagree about what an id means; when the
// capacity is reached, further new names simply take the full path.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "message.h"

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
  // Every rank, from a response: remember `sig` (a request without rank) under `id`.
  void Put(int32_t id, const Request& sig);
  const Request& Get(int32_t id) const { return entries_.at(id); }
  // The id `name` is cached under (whatever its signature), or -1.
  int32_t IdOf(const std::string& name) const {
    auto it = by_name_.find(name);
    return it == by_name_.end() ? -1 : it->second;
  }
  bool Has(int32_t id) const { return entries_.count(id) != 0; }

 private:
  int64_t capacity_;
  int32_t next_id_ = 0;
  std::unordered_map<std::string, int32_t> by_name_;
  std::unordered_map<int32_t, Request> entries_;
};

}  // namespace hvdlite
