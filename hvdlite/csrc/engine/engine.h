// The engine: one per process set, owning the background thread and deciding who runs
// the next step and when: the background thread, a caller blocked on a result that runs
// the engine itself (Drive), or the submitter of a GPU collective, which takes one step
// while the engine is idle (Enqueue's `advance`). A step is the negotiation's
// (Negotiator: what every rank agreed on, in one order) and the executor's (Executor:
// running it on the backends, watching device work). The engine builds both, with the
// backends the factory makes and the control transport, and holds the configuration
// they share.
//
// Lifetime: constructed by init (collective over the communicator), Stop() by
// shutdown (collective: the first rank to stop stops every rank), destroyed after.
#pragma once

#include <mpi.h>

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/handle_table.h"
#include "common/message.h"
#include "common/parameters.h"
#include "common/tensor_queue.h"
#include "common/timeline.h"
#include "engine/executor.h"
#include "gpu/gpu_context.h"
#include "mpi/topology.h"
#include "negotiation/negotiator.h"
#include "transport/control_transport.h"

namespace hvdlite {

// Enqueue's refusal of a request whose name is already in flight on this rank (raised
// at submit, as Horovod does; nothing was queued).
class DuplicateName : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

class Engine {
 public:
  // Duplicates `comm` (collective over it) and starts the background thread.
  // `process_set`: the id of the process set the engine serves (0: the global set,
  // hvdlite's world). Its handles carry that id; only the global set's engine names the
  // process in log lines and starts and stops the timeline. A process set's engine
  // writes into the global engine's timeline (`timeline`, its `timeline_writer()`).
  Engine(MPI_Comm comm, const Parameters& params, HandleTable* handles, int32_t process_set = 0,
         std::shared_ptr<TimelineWriter> timeline = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const Topology& topology() const { return *topology_; }
  int rank() const { return topology_->rank(); }
  int size() const { return topology_->size(); }
  int32_t process_set() const { return process_set_; }
  bool Running() const { return running_; }
  // Why the engine stopped (set once the background thread has ended).
  std::string ShutdownReason() const { return running_ ? std::string() : shutdown_reason_; }
  // The engine stopped because something failed (a GPU collective, the engine itself),
  // not because a rank shut down.
  bool StoppedByFailure() const { return !running_ && stopped_by_failure_; }
  // The engine stopped because a peer process died (or another rank saw one die and
  // revoked the communicators): the survivors can go on in a new world (membership.h).
  bool PeerFailed() const { return !running_ && peer_failed_; }
  // It stopped because ranks stopped answering (a stall past the shutdown limit, or a
  // silent rank 0): MPI_Finalize would wait for them for ever.
  bool PeerUnresponsive() const { return !running_ && peer_unresponsive_; }
  // Rank 0 of an elastic job: the ranks to evict for missing collectives past the stall
  // shutdown time (Negotiator::EvictInstead), while this engine runs.
  std::vector<int> StalledRanks() const { return running_ ? negotiator_->StalledRanks() : std::vector<int>(); }

  // Queues one request; returns its handle at once (already failed on bad input).
  // Throws DuplicateName if a request of that name is in flight here.
  // `caller_waits`: the caller will Wait() on the handle right away, so there is no
  // need to wake the background thread (the caller may run the engine itself).
  // `stream`: for a GPU tensor, the stream (cudaStream_t) whose work produces it; the
  // collective is ordered after the work queued on it so far. None: no ordering needed.
  // `advance`: the caller does not wait, but if the engine is idle it may take one
  // step itself before returning (Advance), for a GPU collective on NCCL only.
  int64_t Enqueue(Request request, const void* input, void* output, bool caller_waits = false,
                  std::optional<uintptr_t> stream = std::nullopt, bool advance = false);
  // Blocks until handle `h` is done (see HandleTable::Wait). While no one else is
  // running the engine, the calling thread runs it itself until `h` is done, instead
  // of waking the background thread and being woken again (two thread hand-offs per
  // blocking call, ~50 us each on a small VM). `ready` receives the handle's device
  // event, if its work was queued on a GPU. `timeout_us` and `pending`: as in
  // HandleTable::Wait (a caller that must stay interruptible waits in slices).
  bool Wait(int64_t h, std::string* error, bool release = false, std::shared_ptr<ReadyEvent>* ready = nullptr,
            int64_t timeout_us = -1, bool* pending = nullptr);
  void Stop();
  // Stops the engine as if a peer had failed: its communicators are revoked, so every
  // other rank's engine stops too (elastic training's reset of a running world).
  void Abandon(const std::string& why);

  // Control-plane counters since init, for diagnostics and the benchmark's response
  // cache measurement.
  struct Stats {
    int64_t requests_in_full = 0;     // this rank's requests negotiated through rank 0
    int64_t requests_as_ids = 0;      // ... agreed on in cycles, as response-cache ids
    int64_t cycles = 0;               // cycles completed
    int64_t carried = 0;              // tensors reduced inside a cycle (CacheCycle::CanCarry)
    int64_t control_bytes_sent = 0;   // bytes this rank sent on the control plane
    int64_t control_bytes_received = 0;
    int64_t waits_driven = 0;         // blocking waits in which the caller ran the engine itself
    int64_t waits_handed_back = 0;    // of those, left to the background thread (ranks outnumber cores)
    int64_t submits_advanced = 0;     // GPU requests whose submitter ran the step that queued them
    int64_t huge_page_extents = 0;    // 2 MiB extents of reused buffers remapped as huge pages
    int64_t device_collectives = 0;   // responses queued on a GPU
    int64_t tunables_applied = 0;     // autotuner settings applied (HOROVOD_AUTOTUNE)
    Tunables tunables;                // the settings in force
  };
  Stats GetStats() const;

  // Device memory for a result the caller fills in (the NumPy front end's GPU outputs),
  // on hvdlite's stream of `device`. Throws std::runtime_error.
  std::shared_ptr<DeviceAllocation> AllocateDevice(int device, int64_t bytes);
  // Queues a device-to-device copy on hvdlite's stream of `device`, after the work
  // queued on `after` so far (the producer of `src`), if given. Throws std::runtime_error.
  void CopyOnDevice(int device, void* dst, const void* src, int64_t bytes, std::optional<uintptr_t> after);

  // HOROVOD_AUTOTUNE with process sets: the settings the global set's tuner chose, for
  // this process set's engine to take up. The set's rank 0 sends them in its own next
  // response list, so that every member applies them at the same point of the set's
  // order (set engines do not run in step with the global one). The set keeps its own
  // hierarchical-allreduce choice. Any thread; ignored except on the set's rank 0.
  void ProposeTunables(const Tunables& t);
  // Called on this engine's thread, on every rank, with the settings it has just
  // applied (the global engine hands them on to the process sets' engines).
  void OnTunablesApplied(std::function<void(const Tunables&)> fn);

  bool StartTimeline(const std::string& path, bool mark_cycles, std::string* error);
  void StopTimeline();
  const std::shared_ptr<TimelineWriter>& timeline_writer() const { return timeline_.writer(); }

 private:
  void Loop();
  // What a step did: nothing (0), or these bits.
  static constexpr int kNegotiated = 1;          // requests, cycles or responses moved on
  static constexpr int kDeviceWorkFinished = 2;  // device work queued earlier was reaped
  int Step();
  void CheckForSilentPeers();  // throws PeerFailure for a peer ULFM marked failed
  void PinThread() const;
  void Settle();
  // A waiting caller, who has just seen `h` not done, runs the engine until it is (or
  // until `timeout_us` passes).
  void Drive(int64_t h, int64_t timeout_us);
  // A submitter runs one step for `h` if the engine is idle.
  void Advance(int64_t h);
  // Whether steps may run: the engine is running, no shutdown has begun, nothing failed.
  bool Steppable() const;
  // After Drive or Advance: lets go of the engine (`lk`, on step_mu_) and wakes the
  // background thread if work is left for it.
  void HandBack(std::unique_lock<std::mutex>& lk, bool watch_device);
  // Drive reads the clock at least every this many steps that moved things on.
  static constexpr int kStepsPerClock = 64;
  // How long a submitter tries to take a busy engine before handing its request over.
  static constexpr int64_t kAdvanceRetryMicros = 100;
  // Whether a submitter may run the engine for a request (see Enqueue's `advance`):
  // a GPU collective that NCCL runs, once the communicators exist, so that the step
  // only queues device work and never blocks on its peers.
  bool MayAdvance(const Request& r) const;
  // A peer died (an MPI call said so): every communicator of this engine is revoked,
  // so every other rank hears of it at its next call, and the engine stops without
  // the shutdown handshake, its requests failed.
  void OnPeerFailure(const std::string& what);
  // Every call on this engine's communicators fails from now on, on every rank (ULFM).
  void RevokeCommunicators();

  HandleTable* handles_;
  int32_t process_set_ = 0;
  std::unique_ptr<Config> config_;
  std::unique_ptr<Topology> topology_;
  std::unique_ptr<ControlTransport> control_;
  GpuContext gpus_;
  TensorQueue queue_;
  Timeline timeline_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Negotiator> negotiator_;

  std::thread thread_;
  // Held by whichever thread runs a step: the background thread, or a caller that
  // runs the engine while it waits (Drive). Everything the steps touch (control
  // plane, coordinator, cache, backends, in-flight work) is guarded by it.
  std::mutex step_mu_;
  std::exception_ptr fatal_;  // an exception a driving caller caught; the loop rethrows it
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> running_{true};
  // Set with running_ (false), from the negotiation's shutdown state, for other threads.
  std::atomic<bool> stopped_by_failure_{false};
  std::atomic<bool> peer_failed_{false};
  std::atomic<bool> peer_unresponsive_{false};
  std::string shutdown_reason_;
  std::atomic<int64_t> waits_driven_{0}, waits_handed_back_{0}, submits_advanced_{0};
  int64_t spin_us_ = 0;  // see Parameters::spin_us; 0 when ranks outnumber cores
  static constexpr int64_t kFailureCheckMicros = 250000;
  int64_t last_failure_check_us_ = 0;
  bool drive_ = false;   // a blocked caller runs the engine itself (Engine::Drive)
  bool nccl_runs_[kNumRequestTypes] = {};  // by request type: its GPU collectives run on NCCL
};

}  // namespace hvdlite
