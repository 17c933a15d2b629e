// The data plane of one engine: it runs the responses the negotiation agreed on, on the
// backend the registry picks for each, completes this rank's handles, and watches the
// device work backends queued until it finishes or fails. It also owns what GPU
// tensors need before they are queued (the one GPU this process drives, the producer's
// event) and hvdlite's own device memory and copies.
//
// Called on the engine's thread (or by a caller driving the engine, under its lock),
// except PrepareGpuRequest, AllocateDevice and CopyOnDevice (any thread).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "backends/registry.h"
#include "common/config.h"
#include "common/handle_table.h"
#include "common/tensor_queue.h"
#include "common/timeline.h"
#include "gpu/gpu_context.h"
#include "negotiation/agreed_work.h"

namespace hvdlite {

class Executor : public AgreedWork {
 public:
  // The executor's outside world: whom to tell of a failure that the other ranks must
  // hear of (the negotiation's Fail), whether shutdown has begun, and, on rank 0 with
  // HOROVOD_AUTOTUNE, whom to tell what each collective moved (names, bytes).
  struct Hooks {
    std::function<void(const std::string&)> fail;
    std::function<bool()> shutting_down;
    std::function<void(const std::vector<std::string>&, int64_t)> ran;
  };

  // `registry`: the backends (taken over). Everything pointed to outlives the executor.
  Executor(std::unique_ptr<BackendRegistry> registry, Config* config, TensorQueue* queue, HandleTable* handles,
           Timeline* timeline, GpuContext* gpus, int rank, int size);
  void SetHooks(Hooks hooks) { hooks_ = std::move(hooks); }

  // AgreedWork.
  void Run(const Response& r) override;
  void RunCarried(const Request& sig, const void* sum) override;
  bool DeviceBusy() const override { return in_flight_count_ > 0; }
  void Abort(const std::string& why) override { registry_->AbortAll(why); }
  void TunablesChanged() override;

  // Watches device work in flight: failures, and (until shutdown begins) work that
  // never finishes within the stall shutdown time. True if any finished.
  bool PollInFlight();
  // After the engine stopped: waits for device work queued before (every rank queued the
  // same, so it finishes); aborts it if it does not within the stall limit, and gives
  // up on it a little later.
  void DrainInFlight();
  bool InFlight() const { return in_flight_count_ > 0; }

  // The GPU a GPU request runs on, checked; the producer's event recorded. Returns the
  // problem ("" when fine). Any thread.
  std::string PrepareGpuRequest(TensorEntry& e, std::optional<uintptr_t> stream);
  std::shared_ptr<DeviceAllocation> AllocateDevice(int device, int64_t bytes);
  void CopyOnDevice(int device, void* dst, const void* src, int64_t bytes, std::optional<uintptr_t> after);

  const BackendRegistry& registry() const { return *registry_; }
  int64_t device_collectives() const { return device_collectives_; }
  // Tensors the cycles reduced themselves (RunCarried) that completed here.
  int64_t carried() const { return carried_; }
  // The registry goes first when the engine ends: NCCL communicators (their queued work
  // finishes), then MPI's.
  void ReleaseBackends(bool leak) {
    if (leak) (void)registry_.release();  // MPI has been finalized: nothing can be freed safely
    else registry_.reset();
  }

 private:
  std::unique_ptr<BackendRegistry> registry_;
  Config* config_;
  TensorQueue* queue_;
  HandleTable* handles_;
  Timeline* timeline_;
  GpuContext* gpus_;
  int rank_, size_;
  Hooks hooks_;

  // Device work queued by a backend and not yet seen finished.
  struct InFlight_ {
    std::unique_ptr<Completion> completion;
    RequestType type;
    std::string name;  // its first tensor's
    size_t tensors;
    int64_t start_us;
    std::string Label() const;  // "allreduce 'a' (fused with 3 more)", for messages
  };
  std::list<InFlight_> in_flight_;
  std::atomic<int> in_flight_count_{0};
  std::atomic<int64_t> device_collectives_{0};
  std::atomic<int64_t> carried_{0};
  // The one GPU this process drives (-1: none yet). Horovod's rule, one GPU per process,
  // keeps every rank's NCCL calls alike.
  std::atomic<int> gpu_device_{-1};
};

}  // namespace hvdlite
