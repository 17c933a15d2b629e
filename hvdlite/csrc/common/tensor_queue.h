// The queue between the front ends and the background thread: new requests waiting to
// be announced, and the table of this rank's tensors waiting for their turn.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/message.h"
#include "common/tensor_entry.h"

namespace hvdlite {

class TensorQueue {
 public:
  // Takes the entry over unless its name is already in flight (returns false then, and
  // leaves `entry` as it was). Wakes a sleeping background thread unless `wake` is
  // false: the caller is about to run the engine itself (Engine::Wait).
  bool Push(TensorEntry& entry, bool wake = true);
  // A request added since the last TakeNew, and where its input is.
  struct New {
    Request request;
    const void* input = nullptr;
  };
  // Moves the requests added since the last call into `out`, which is emptied first
  // (the two lists trade places, so that neither allocates in the steady state).
  void TakeNew(std::vector<New>* out);
  // Removes and returns the entry for `name` (false if this rank has none).
  bool Pop(const std::string& name, TensorEntry* out);
  // The input of this rank's entry for `name`, or null.
  const void* InputOf(const std::string& name);
  // A copy of this rank's request for `name` (false if this rank has none).
  bool RequestOf(const std::string& name, Request* out);
  std::vector<TensorEntry> TakeAll();
  bool HasOutstanding();
  // When the oldest entry still waiting was queued (INT64_MAX if none is).
  int64_t OldestEnqueueUs();

  // Background thread: wait until new requests arrive, `Wake()` is called, or the
  // timeout passes.
  void WaitForWork(int64_t timeout_us);
  void Wake();

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, TensorEntry> table_;
  std::vector<New> fresh_;
  bool woken_ = false;
  bool sleeping_ = false;  // the background thread is blocked in WaitForWork
};

}  // namespace hvdlite
