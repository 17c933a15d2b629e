#include "negotiation/response_cache.h"

#include <algorithm>

namespace hvdlite {

bool ResponseCache::Cacheable(const Request& r) {
  // Grouped allreduces too: the engine routes a group as a whole (Engine::Route).
  return (r.group_id < 0 || r.type == RequestType::kAllreduce) && r.error.empty() && !IsOneOffName(r.name) &&
         (r.type == RequestType::kAllreduce || r.type == RequestType::kBroadcast ||
          r.type == RequestType::kReducescatter || r.type == RequestType::kAllgather ||
          r.type == RequestType::kAlltoall);
}

int32_t ResponseCache::Lookup(const Request& r) const {
  if (!Enabled() || !Cacheable(r)) return -1;
  auto it = by_name_.find(r.name);
  if (it == by_name_.end()) return -1;
  const Request& c = entries_.at(it->second).sig;
  if (c.type == r.type && c.dtype == r.dtype && c.shape == r.shape && c.reduce_op == r.reduce_op &&
      c.prescale == r.prescale && c.postscale == r.postscale && c.root == r.root && c.device == r.device &&
      c.process_set == r.process_set && c.splits == r.splits && c.group_size == r.group_size)
    return it->second;
  return -1;
}

int32_t ResponseCache::AssignId(const std::string& name) {
  if (!Enabled()) return -1;
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  if (!free_ids_.empty()) {
    const int32_t id = free_ids_.back();
    free_ids_.pop_back();
    return id;
  }
  if (static_cast<int64_t>(next_id_) >= capacity_) return -1;
  return next_id_++;
}

void ResponseCache::Erase(int32_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  auto named = by_name_.find(it->second.sig.name);
  if (named != by_name_.end() && named->second == id) by_name_.erase(named);
  entries_.erase(it);
  free_ids_.push_back(id);
}

void ResponseCache::Clear() {
  for (const auto& [id, entry] : entries_) free_ids_.push_back(id);
  entries_.clear();
  by_name_.clear();
}

void ResponseCache::Put(int32_t id, const Request& sig, std::vector<int64_t> sizes) {
  auto old = entries_.find(id);
  if (old != entries_.end() && old->second.sig.name != sig.name) by_name_.erase(old->second.sig.name);
  entries_[id] = Entry{sig, std::move(sizes)};
  by_name_[sig.name] = id;
  if (id >= next_id_) next_id_ = id + 1;
  free_ids_.erase(std::remove(free_ids_.begin(), free_ids_.end(), id), free_ids_.end());
}

}  // namespace hvdlite
