// Handles the front ends hold for operations in flight: completion status, error
// message, and outputs the engine allocated. Waiters block on a condition variable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <functional>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/common.h"

namespace hvdlite {

// A consumer's view of device work in flight (a collective queued on a GPU stream):
// order a consumer's stream after it, or ask whether it finished.
class ReadyEvent {
 public:
  virtual ~ReadyEvent() = default;
  // Makes `stream` (a cudaStream_t of the same device) wait for the work; the host
  // does not wait.
  virtual void OrderBefore(uintptr_t stream) = 0;
  virtual bool Query() = 0;
  virtual void Synchronize() = 0;
  virtual int32_t device() const = 0;
};

// Device memory the engine allocated for a result. Freed when the last owner lets go,
// ordered after the work queued on `stream` (see gpu/cuda_runtime.h).
class DeviceAllocation {
 public:
  virtual ~DeviceAllocation() = default;
  virtual void* data() const = 0;
  virtual int64_t bytes() const = 0;
  virtual int32_t device() const = 0;
  // The stream whose work produced the contents (hvdlite's stream of the device).
  virtual uintptr_t stream() const = 0;
  // A consumer's stream that uses the memory: freeing waits for its work queued so far.
  virtual void UsedOn(uintptr_t stream) = 0;
};

// Memory the engine allocated for a result whose size was only known after
// negotiation; handed to Python without a copy. Host results are in `data`, device
// results in `device_data`.
struct OutputBuffer {
  std::unique_ptr<uint8_t[]> data;
  std::shared_ptr<DeviceAllocation> device_data;
  int32_t device = kCpuDevice;
  int64_t bytes = 0;
  std::vector<int64_t> shape;
  DataType dtype = DataType::kUInt8;
  std::vector<int64_t> aux;  // alltoall: received splits; join: last joined rank
};

// One table serves every engine of the process (the global one and one per process
// set), so handles are unique across them; each handle remembers its owner, the
// process set id of the engine that completes it.
class HandleTable {
 public:
  int64_t Create(int32_t owner = 0);
  // The owner `h` was created for, or -1 for an unknown handle.
  int32_t OwnerOf(int64_t h);
  // `ready`: the handle's work is queued on a device and done once that event fires;
  // consumers order their streams after it (see Wait).
  void Complete(int64_t h, bool ok, const std::string& error, std::unique_ptr<OutputBuffer> out = nullptr,
                std::shared_ptr<ReadyEvent> ready = nullptr);
  // Completes several handles at once (a fused response's), waking the waiters once.
  // Completing them one by one wakes a waiter per handle: a caller synchronizing the
  // handles in turn would wake, find the next one not done yet and block again, a
  // switch between its thread and the engine's for every tensor.
  struct Result {
    int64_t handle;
    bool ok;
    std::string error;
    std::unique_ptr<OutputBuffer> out;
    std::shared_ptr<ReadyEvent> ready;
  };
  void CompleteAll(std::vector<Result> results);
  bool Poll(int64_t h);
  // Blocks until done; returns ok and fills `error`. A caller about to block first
  // runs the waiter hook (the engine uses it to stop sleeping between polls). With
  // `release`, also forgets the handle (as Release does), under the same lock.
  // `ready`, if given, receives the handle's device event (null for host work).
  // With `timeout_us` >= 0 it returns after that long at most: false with `*pending`
  // set if `h` is not done yet (the handle stays, whatever `release` says).
  bool Wait(int64_t h, std::string* error, bool release = false, std::shared_ptr<ReadyEvent>* ready = nullptr,
            int64_t timeout_us = -1, bool* pending = nullptr);
  std::unique_ptr<OutputBuffer> TakeOutput(int64_t h);
  void Release(int64_t h);
  // Runs `callback` once `h` is done: at once, on this thread, if it is done already
  // (or unknown), else on the thread that completes it, after the table's lock is
  // released. One callback per handle. For waiters that must not block a thread
  // (hvdlite's TensorFlow kernels, through c_api.h).
  void WhenDone(int64_t h, std::function<void()> callback);
  // Installs (or, with nullptr, removes) the waiter hook of `owner`'s handles. The
  // hook runs under the table's lock, so once this returns an old hook is never
  // called again.
  void SetWaiterHook(int32_t owner, std::function<void()> hook);
  // How many callers are blocked in Wait right now.
  int Waiting() const { return waiting_.load(std::memory_order_relaxed); }

 private:
  struct State {
    bool done = false;
    bool ok = true;
    std::string error;
    std::unique_ptr<OutputBuffer> out;
    std::shared_ptr<ReadyEvent> ready;
    int32_t owner = 0;
    std::function<void()> on_done;  // WhenDone's callback
  };
  // Records `r` in its handle's state (mu_ held) and returns the handle's WhenDone
  // callback, to run after unlocking; nothing if the handle is unknown or done already.
  std::function<void()> MarkDone(Result& r);
  std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<int32_t, std::function<void()>> waiter_hooks_;
  std::atomic<int> waiting_{0};
  int64_t next_ = 1;
  std::unordered_map<int64_t, State> states_;
};

}  // namespace hvdlite
