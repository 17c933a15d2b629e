// The one interface every data-plane backend implements, and what the engine hands it.
//
// The engine decides what runs and in which order (the coordinator's response list,
// identical on every rank); a backend only moves and reduces the bytes of one response
// at a time, on the memory of one kind of device. A new transport or accelerator is a
// new implementation of `Backend` registered with the `BackendRegistry`, not edits
// across the engine.
//
// The interface is asynchronous. `Run` either finishes the collective before it
// returns (the MPI backend: host memory, MPI's blocking calls), or queues it on a device
// and returns a `Completion` that the engine polls. Device work also carries a
// `ReadyEvent`: consumers order their own streams after it instead of waiting on the
// host.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/fusion.h"
#include "common/handle_table.h"
#include "common/message.h"
#include "common/tensor_entry.h"

namespace hvdlite {

class Timeline;

// Records a tensor's phases in the timeline under the names the backend chooses
// ("MPI_ALLREDUCE", "NCCL_ALLREDUCE", "MEMCPY_IN_FUSION_BUFFER", ...).
class Tracer {
 public:
  explicit Tracer(Timeline* timeline = nullptr) : timeline_(timeline) {}
  bool Active() const;
  void Phase(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us) const;

 private:
  Timeline* timeline_;
};

// One response, as one rank runs it.
struct CollectiveJob {
  const Response& response;
  // This rank's tensors, in the response's order of names.
  std::vector<TensorEntry>& entries;
  // have[i]: entries[i] is this rank's tensor. Otherwise this rank has joined (hvd.join)
  // and contributes zeros to the allreduce in its place.
  const std::vector<char>& have;
  const Tracer& trace;
  // Per name: a result the backend allocated (allgather, alltoall, reducescatter).
  std::vector<std::unique_ptr<OutputBuffer>> outputs;
  // The device this rank runs the response on: its tensors' (kCpuDevice for host
  // memory), or for a rank that has joined, the GPU it uses.
  int32_t device = kCpuDevice;
};

// A collective a backend has queued and not yet seen finish.
class Completion {
 public:
  virtual ~Completion() = default;
  // True once the work finished or failed; never blocks.
  virtual bool Done() = 0;
  // After Done(): why it failed, or empty.
  virtual std::string Error() = 0;
  // What consumers order their streams after (device work), or null.
  virtual std::shared_ptr<ReadyEvent> Ready() = 0;
};

// What a backend throws when a collective failed alike on every rank before anything
// was queued (every rank found that NCCL cannot be loaded, say): the tensors fail, and
// nothing is left for a peer to wait on, so hvdlite stays usable. Any other exception
// from a device backend may leave peers waiting, and shuts the job down.
class FailedOnEveryRank : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What backends count, for the engine's statistics (hvdlite's diagnostics, benchmarks).
struct BackendStats {
  int64_t huge_page_extents = 0;  // 2 MiB extents of reused buffers remapped as huge pages
};

class Backend {
 public:
  virtual ~Backend() = default;
  // How the timeline, logs and `hvdlite-run --check-build` name it: "MPI", "NCCL".
  virtual const char* Name() const = 0;
  // The memory its tensors live in.
  virtual DeviceKind Device() const = 0;
  // Whether it can run `r`; if not, `why_not` says why (for logs and errors). The
  // answer must depend on `r` and the job's settings only, never on this rank's own
  // state: every rank must pick the same backend for a response.
  virtual bool Supports(const Response& r, std::string* why_not) const = 0;
  virtual FusionLimits Fusion() const = 0;
  // Whether it can run an allreduce in two levels across hosts here (several hosts,
  // as many ranks on each): the autotuner then tries HOROVOD_HIERARCHICAL_ALLREDUCE.
  virtual bool TwoLevelPossible() const { return false; }
  // Adds its counters to the engine's statistics.
  virtual void AddStats(BackendStats* stats) const { (void)stats; }
  // Runs the collective, or queues it on the device. Null: it finished before
  // returning, and `job.outputs` holds the results. Throws std::runtime_error on
  // failure, naming what failed.
  virtual std::unique_ptr<Completion> Run(CollectiveJob& job) = 0;
  // A failure elsewhere means the peers will not finish what is queued: stop it
  // (NCCL: abort the communicators) so that nothing waits for it forever.
  virtual void Abort(const std::string& why) { (void)why; }
};

}  // namespace hvdlite
