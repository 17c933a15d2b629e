// The engine: one per process, owning the background thread, the control plane (rank 0
// negotiates what is new, every rank talking to it over the control channel; cached
// tensors are agreed on among all ranks in cycles, CacheCycle), and the data plane
// (each response run by the backend the registry picks for it).
//
// Lifetime: constructed by init (collective over the communicator), Stop() by
// shutdown (collective: the first rank to stop stops every rank), destroyed after.
#pragma once

#include <mpi.h>

#include <atomic>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "autotune.h"
#include "backends/registry.h"
#include "cache_cycle.h"
#include "control_channel.h"
#include "coordinator.h"
#include "gpu/gpu_context.h"
#include "handle_table.h"
#include "message.h"
#include "parameters.h"
#include "response_cache.h"
#include "tensor_queue.h"
#include "timeline.h"
#include "topology.h"

namespace hvdlite {

class MpiBackend;

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

  // Queues one request; returns its handle at once (already failed on bad input).
  // Throws DuplicateName if a request of that name is in flight here.
  // `caller_waits`: the caller will Wait() on the handle right away, so there is no
  // need to wake the background thread (the caller may run the engine itself).
  // `stream`: for a GPU tensor, the stream (cudaStream_t) whose work produces it; the
  // collective is ordered after the work queued on it so far. None: no ordering needed.
  int64_t Enqueue(Request request, const void* input, void* output, bool caller_waits = false,
                  std::optional<uintptr_t> stream = std::nullopt);
  // Blocks until handle `h` is done (see HandleTable::Wait). While no one else is
  // running the engine, the calling thread runs it itself until `h` is done, instead
  // of waking the background thread and being woken again (two thread hand-offs per
  // blocking call, ~50 us each on a small VM). `ready` receives the handle's device
  // event, if its work was queued on a GPU. `deadline_us` and `pending`: as in
  // HandleTable::Wait (a caller that must stay interruptible waits in slices).
  bool Wait(int64_t h, std::string* error, bool release = false, std::shared_ptr<ReadyEvent>* ready = nullptr,
            int64_t deadline_us = -1, bool* pending = nullptr);
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
  bool Step();
  void PinThread() const;
  bool Finished() const;
  void Drive(int64_t h, int64_t deadline_us);
  bool CoordinatorStep();
  bool WorkerStep();
  // A new request of this rank: into the next cycle if its signature is cached, else
  // to rank 0 (appended to `to_coordinator` on the other ranks). A member of a grouped
  // allreduce waits for the rest of its group, and the group goes one way as a whole:
  // into the cycle if every member is cached, else every member to rank 0 (whose
  // coordinator holds a group until it is whole).
  void Route(Request r, int64_t now, RequestList* to_coordinator);
  void RouteOne(Request r, int64_t now, RequestList* to_coordinator);
  // A request whose signature is cached under `id`: into the next cycle.
  void ToCycle(int32_t id, Request r, int64_t now);
  void RouteInFull(Request r, int64_t now, RequestList* to_coordinator);
  // Sends the members of groups held longer than kGroupHoldMicros to rank 0 in full.
  bool FlushHeldGroups(int64_t now, RequestList* to_coordinator);
  void CompleteCarried(int32_t id, const void* sum, int64_t now);
  // Starts and moves on the cycles; runs what a completed one agreed on.
  bool CycleStep(int64_t now);
  void RunCycle(CacheCycle::Outcome& out);
  // Workers: runs the response lists received whose turn has come; with `upto`, first
  // waits for (and runs) rank 0's lists up to that count. False once shut down.
  bool RunReceivedLists(int64_t upto = -1);
  // A response list from rank 0 (or the shutdown); false once this rank stopped.
  bool TakeResponse(std::vector<uint8_t>& buf);
  void SendStallReports(int64_t now);
  // Rank 0: the job shuts down. `hold`: a clean shutdown whose announcement waits (up
  // to kShutdownDrainMicros) for the cycle in flight, which every rank has started.
  void BeginShutdown(const std::string& reason, bool failure, bool hold = false);
  void AnnounceShutdown();  // rank 0: tells every worker (after a hold, now)
  void StopWorker();        // a worker: acknowledges the shutdown and stops
  // A failure on this rank that the others must hear of (a GPU collective failed, or
  // never finished): shut the job down everywhere, device work aborted.
  void Fail(const std::string& reason);
  // A peer died (an MPI call said so): every communicator of this engine is revoked,
  // so every other rank hears of it at its next call, and the engine stops without
  // the shutdown handshake, its requests failed.
  void OnPeerFailure(const std::string& what);
  // Every call on this engine's communicators fails from now on, on every rank (ULFM).
  void RevokeCommunicators();
  void Execute(const ResponseList& list);
  // The autotuner's settings, applied on every rank at the same point of the order.
  void ApplyTunables(const Tunables& t);
  // Rank 0: what a collective moved, for the autotuner.
  void Tune(const std::vector<std::string>& names, int64_t bytes);
  Response FromCache(const std::vector<int32_t>& ids) const;
  static std::vector<int64_t> PartsOf(const Response& r, size_t i);
  void Perform(const Response& response);
  // Watches device work in flight: failures and work that never finishes.
  bool PollInFlight();
  // The GPU a GPU request runs on, checked; the producer's event recorded. Returns the
  // problem ("" when fine).
  std::string PrepareGpuRequest(TensorEntry& e, std::optional<uintptr_t> stream);

  Parameters params_;
  HandleTable* handles_;
  int32_t process_set_ = 0;
  std::unique_ptr<ControlChannel> channel_;
  std::unique_ptr<Topology> topology_;
  GpuContext gpus_;
  std::unique_ptr<BackendRegistry> registry_;
  MpiBackend* mpi_ = nullptr;  // owned by registry_
  TensorQueue queue_;
  ResponseCache cache_;
  Timeline timeline_;
  // Members of grouped allreduces held until this rank has submitted the whole group
  // (see Route), by group id, and since when.
  struct PartialGroup {
    int64_t since_us = 0;
    std::vector<Request> members;
  };
  std::unordered_map<int32_t, PartialGroup> partial_groups_;
  static constexpr int64_t kGroupHoldMicros = 1000000;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::unique_ptr<CacheCycle> cycle_;
  int64_t lists_sent_ = 0;           // rank 0: response lists sent so far
  std::list<ResponseList> deferred_;  // rank 0: lists to run after the cycle in flight
  std::list<ResponseList> received_;  // workers: lists received, not yet run
  int64_t lists_run_ = 0;             // workers: lists run so far
  int64_t carried_ = 0;               // Stats::carried
  int64_t cycles_run_ = 0;            // cycles whose tensors this rank has run
  bool join_outstanding_ = false;     // this rank's join has not completed
  // HOROVOD_AUTOTUNE (autotune.h): rank 0's tuner, the settings it chose and has not
  // sent yet, and whether new tensors get response-cache entries.
  std::unique_ptr<Autotuner> tuner_;
  std::optional<Tunables> tunables_to_send_;
  bool caching_ = true;
  // Settings proposed by another thread (ProposeTunables), those in force, and whom to
  // tell when new ones apply; under tunables_mu_.
  mutable std::mutex tunables_mu_;
  std::atomic<bool> has_proposal_{false};
  std::optional<Tunables> proposed_;
  Tunables applied_;
  int64_t tunables_applied_ = 0;
  std::function<void(const Tunables&)> on_tunables_;

  // Device work queued by a backend and not yet seen finished.
  struct InFlight {
    std::unique_ptr<Completion> completion;
    std::string label;  // "allreduce 'a' (and 3 more)", for messages
    int64_t start_us;
  };
  std::list<InFlight> in_flight_;
  std::atomic<int> in_flight_count_{0};
  // The one GPU this process drives (-1: none yet). Horovod's rule, one GPU per process,
  // keeps every rank's NCCL calls alike.
  std::atomic<int> gpu_device_{-1};

  std::thread thread_;
  // Held by whichever thread runs a step: the background thread, or a caller that
  // runs the engine while it waits (Drive). Everything the steps touch (control
  // plane, coordinator, cache, backends, in-flight work) is guarded by it.
  std::mutex step_mu_;
  std::exception_ptr fatal_;  // an exception a driving caller caught; the loop rethrows it
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> running_{true};
  std::atomic<bool> stopped_by_failure_{false};
  std::atomic<bool> peer_failed_{false};
  bool shutting_down_ = false;   // coordinator: shutdown begun; worker: asked for it or told
  bool shutdown_held_ = false;   // coordinator: its announcement waits for the cycle in flight
  int64_t drain_to_ = -1;        // worker: told to shut down once this many cycles completed
  int64_t drain_until_us_ = 0;   // ... or at this time, whichever comes first (also rank 0's hold)
  int acks_ = 0;
  std::string shutdown_reason_;
  int64_t last_stall_check_us_ = 0;
  int64_t last_relay_us_ = 0;  // when this rank last sent rank 0 relayed timeline records
  int64_t last_stall_report_us_ = 0;
  std::atomic<int64_t> requests_in_full_{0}, requests_as_ids_{0}, waits_driven_{0}, device_collectives_{0};
  std::atomic<int64_t> waits_handed_back_{0};
  int64_t spin_us_ = 0;  // see Parameters::spin_us; 0 when ranks outnumber cores
  bool drive_ = false;   // a blocked caller runs the engine itself (Engine::Drive)
};

}  // namespace hvdlite
