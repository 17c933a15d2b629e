#include "common/tensor_queue.h"

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace hvdlite {

bool TensorQueue::Push(TensorEntry& entry, bool wake) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    const bool join = entry.request.type == RequestType::kJoin;
    if (!table_.try_emplace(join ? std::string("\x01join") : entry.request.name, entry).second) return false;
    fresh_.push_back(New{std::move(entry.request), entry.input});
    wake = wake && sleeping_;  // a spinning background thread sees fresh_ without a wake-up
  }
  if (wake) cv_.notify_one();
  return true;
}

void TensorQueue::TakeNew(std::vector<New>* out) {
  out->clear();
  std::lock_guard<std::mutex> lk(mu_);
  out->swap(fresh_);
}

const void* TensorQueue::InputOf(const std::string& name) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = table_.find(name);
  return it == table_.end() ? nullptr : it->second.input;
}

bool TensorQueue::RequestOf(const std::string& name, Request* out) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return false;
  *out = it->second.request;
  return true;
}

bool TensorQueue::Pop(const std::string& name, TensorEntry* out) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = table_.find(name);
  if (it == table_.end()) return false;
  *out = std::move(it->second);
  table_.erase(it);
  return true;
}

std::vector<TensorEntry> TensorQueue::TakeAll() {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<TensorEntry> out;
  for (auto& [name, e] : table_) out.push_back(std::move(e));
  table_.clear();
  fresh_.clear();
  return out;
}

bool TensorQueue::HasOutstanding() {
  std::lock_guard<std::mutex> lk(mu_);
  return !table_.empty();
}

int64_t TensorQueue::OldestEnqueueUs() {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t oldest = INT64_MAX;
  for (const auto& [name, e] : table_) oldest = std::min(oldest, e.enqueue_us);
  return oldest;
}

void TensorQueue::WaitForWork(int64_t timeout_us) {
  std::unique_lock<std::mutex> lk(mu_);
  if (!fresh_.empty() || woken_) {
    woken_ = false;
    return;
  }
  sleeping_ = true;
  cv_.wait_for(lk, std::chrono::microseconds(timeout_us), [&] { return !fresh_.empty() || woken_; });
  sleeping_ = false;
  woken_ = false;
}

void TensorQueue::Wake() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    woken_ = true;
  }
  cv_.notify_one();
}

}  // namespace hvdlite
