#include "common/handle_table.h"

#include <algorithm>
#include <chrono>

namespace hvdlite {

int64_t HandleTable::Create(int32_t owner) {
  std::lock_guard<std::mutex> lk(mu_);
  int64_t h = next_++;
  State st;
  st.owner = owner;
  states_.emplace(h, std::move(st));
  return h;
}

int32_t HandleTable::OwnerOf(int64_t h) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(h);
  return it == states_.end() ? -1 : it->second.owner;
}

std::function<void()> HandleTable::MarkDone(Result& r) {
  auto it = states_.find(r.handle);
  if (it == states_.end() || it->second.done) return nullptr;
  State& st = it->second;
  st.done = true;
  st.ok = r.ok;
  st.error = std::move(r.error);
  st.out = std::move(r.out);
  st.ready = std::move(r.ready);
  std::function<void()> on_done;
  on_done.swap(st.on_done);
  return on_done;
}

void HandleTable::Complete(int64_t h, bool ok, const std::string& error, std::unique_ptr<OutputBuffer> out,
                           std::shared_ptr<ReadyEvent> ready) {
  Result r{h, ok, error, std::move(out), std::move(ready)};
  std::function<void()> on_done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    on_done = MarkDone(r);
  }
  cv_.notify_all();
  if (on_done) on_done();
}

void HandleTable::CompleteAll(std::vector<Result> results) {
  std::vector<std::function<void()>> on_done;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (Result& r : results)
      if (std::function<void()> f = MarkDone(r)) on_done.push_back(std::move(f));
  }
  cv_.notify_all();
  for (auto& f : on_done) f();
}

void HandleTable::WhenDone(int64_t h, std::function<void()> callback) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = states_.find(h);
    if (it != states_.end() && !it->second.done) {
      it->second.on_done = std::move(callback);
      return;
    }
  }
  callback();
}

bool HandleTable::Poll(int64_t h) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(h);
  return it == states_.end() || it->second.done;
}

bool HandleTable::Wait(int64_t h, std::string* error, bool release, std::shared_ptr<ReadyEvent>* ready,
                       int64_t timeout_us, bool* pending) {
  std::unique_lock<std::mutex> lk(mu_);
  auto it = states_.find(h);
  if (it == states_.end()) {
    *error = "unknown or already released hvdlite handle " + std::to_string(h);
    return false;
  }
  // A reference, not the iterator: Create() may rehash the map while the lock is
  // released, which invalidates iterators but not references to elements.
  State& st = it->second;
  if (!st.done) {
    waiting_.fetch_add(1, std::memory_order_relaxed);
    auto hook = waiter_hooks_.find(st.owner);
    if (hook != waiter_hooks_.end()) hook->second();
    if (timeout_us < 0) {
      cv_.wait(lk, [&] { return st.done; });
    } else {
      cv_.wait_for(lk, std::chrono::microseconds(timeout_us), [&] { return st.done; });
    }
    waiting_.fetch_sub(1, std::memory_order_relaxed);
    if (!st.done) {
      if (pending) *pending = true;
      return false;
    }
  }
  const bool ok = st.ok;
  *error = release ? std::move(st.error) : st.error;
  if (ready) *ready = st.ready;
  if (release) states_.erase(h);
  return ok;
}

std::unique_ptr<OutputBuffer> HandleTable::TakeOutput(int64_t h) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = states_.find(h);
  if (it == states_.end() || !it->second.out) return std::make_unique<OutputBuffer>();
  return std::move(it->second.out);
}

void HandleTable::Release(int64_t h) {
  std::lock_guard<std::mutex> lk(mu_);
  states_.erase(h);
}

}  // namespace hvdlite

namespace hvdlite {

void HandleTable::SetWaiterHook(int32_t owner, std::function<void()> hook) {
  std::lock_guard<std::mutex> lk(mu_);
  if (hook) waiter_hooks_[owner] = std::move(hook);
  else waiter_hooks_.erase(owner);
}

}  // namespace hvdlite
