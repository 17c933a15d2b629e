// The GPU backend: collectives on CUDA device memory with NCCL, queued on hvdlite's own
// stream of the device (gpu/gpu_context.h) and never waited for on the host.
//
// - One NCCL communicator per device, made the first time a response needs it, from an
//   ncclUniqueId that rank 0 shares over the control channel; destroyed with the
//   engine (shutdown), so init() again makes a new one.
// - A fused allreduce is packed into the device fusion buffer with device-to-device
//   copies, reduced by one NCCL call, and unpacked; a tensor alone is reduced where it
//   lies.
// - Average is ncclAvg; scale factors (prescale, postscale, Average with them) are an
//   ncclRedOpCreatePreMulSum op: hvdlite has no kernels of its own (it is built without
//   a CUDA compiler). What NCCL cannot express that way (a scale factor on integers, or
//   on Min/Max/Product) is declared unsupported, and the registry sends it through host
//   memory instead.
// - Ragged allgathers are grouped ncclBroadcasts (one per rank), alltoall is grouped
//   ncclSend/ncclRecv, an uneven reducescatter is padded to equal shares.
// - Failures: an NCCL error or a CUDA error throws (the engine fails the tensors and shuts
//   hvdlite down on every rank, since the peers would wait for this rank's part); an
//   asynchronous NCCL error is found by the Completion; Abort() aborts the communicators
//   so that nothing queued waits for a peer forever.
// - Two-level allreduce (HOROVOD_HIERARCHICAL_ALLREDUCE=1 on hosts that each run the same
//   number of ranks, more than one, and more than one host): ncclReduceScatter among the
//   ranks of this host, an allreduce of this rank's shard among the ranks with the same
//   local rank (through host memory and MPI, Horovod's way, or ncclAllReduce:
//   HVDLITE_HIERARCHICAL_CROSS=mpi|nccl), ncclAllGather inside the host. Its local and
//   cross communicators are made on first use, after the world's. Unset, GPU allreduces
//   stay flat: NCCL's own rings and trees already know which ranks share a host.
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "backends/backend.h"
#include "backends/nccl/nccl_library.h"
#include "common/config.h"
#include "gpu/gpu_context.h"
#include "mpi/topology.h"

namespace hvdlite {

class ControlTransport;
class MpiCollectives;

class NcclBackend : public Backend {
 public:
  using CommList = std::shared_ptr<const std::vector<nccl::Comm>>;
  // `topology`: who shares a host (the two-level allreduce's communicators are split
  // along it, and its MPI step runs on its cross communicator).
  NcclBackend(ControlTransport* channel, GpuContext* gpus, const Topology& topology, const Config* config);
  ~NcclBackend() override;
  const char* Name() const override { return "NCCL"; }
  DeviceKind Device() const override { return DeviceKind::kCuda; }
  bool Supports(const Response& r, std::string* why_not) const override;
  FusionLimits Fusion() const override;
  std::unique_ptr<Completion> Run(CollectiveJob& job) override;
  void Abort(const std::string& why) override;

 private:
  struct Communicator {
    nccl::Comm comm = nullptr;
    bool aborted = false;
  };
  // Which communicator of a device: all ranks, the ranks of this host, the ranks with
  // this rank's local rank.
  enum Scope : int { kWorld = 0, kLocal = 1, kCross = 2 };
  static const char* ScopeName(int scope);  // "NCCL communicator", "local NCCL communicator ..."
  // The device's communicator, made collectively on first use.
  nccl::Comm CommFor(int device);
  // The two-level allreduce's communicators of the device (cross: null when MPI crosses
  // the hosts), made collectively on first use.
  struct LevelComms {
    nccl::Comm local = nullptr;
    nccl::Comm cross = nullptr;
  };
  LevelComms LevelCommsFor(int device);
  // Every communicator of a device: what its Completion checks for asynchronous errors.
  // A list shared by the completions, remade when a communicator is added.
  CommList CommsOf(int device);
  void AddComm(int device, int scope, nccl::Comm comm);
  static std::vector<std::string> TracedNames(const CollectiveJob& job);
  void Check(nccl::Result r, const char* what, nccl::Comm comm) const;

  // Whether this allreduce runs in two levels: decided alike on every rank, from rank 0's
  // settings, the topology and the response.
  bool TwoLevel(const Response& r);
  std::unique_ptr<Completion> TwoLevelAllreduce(CollectiveJob& job, GpuContext::Device& d, const LevelComms& lv,
                                                int64_t start_us);
  // Pinned host memory for the shard that MPI reduces, grown on demand.
  uint8_t* HostShard(GpuContext::Device& d, int64_t bytes);

  void Allreduce(CollectiveJob& job, GpuContext::Device& d, nccl::Comm comm);
  void Allgather(CollectiveJob& job, GpuContext::Device& d, nccl::Comm comm);
  void Broadcast(CollectiveJob& job, GpuContext::Device& d, nccl::Comm comm);
  void Alltoall(CollectiveJob& job, GpuContext::Device& d, nccl::Comm comm);
  void Reducescatter(CollectiveJob& job, GpuContext::Device& d, nccl::Comm comm);
  // The NCCL reduction for a response (ncclAvg, a PreMulSum op, ...); `created` is set
  // when the op must be destroyed after use.
  nccl::RedOp ReductionFor(const Response& r, nccl::Comm comm, bool* created);
  // Copies (device to device) on the device's stream.
  void Copy(GpuContext::Device& d, void* dst, const void* src, int64_t bytes);
  // A fused response's tensors packed into `buf`; returns the bytes written.
  int64_t PackFused(CollectiveJob& job, GpuContext::Device& d, uint8_t* buf);
  void UnpackFused(CollectiveJob& job, GpuContext::Device& d, const uint8_t* buf);

  ControlTransport* channel_;
  GpuContext* gpus_;
  const Topology& topology_;
  const Config* config_;
  const Parameters& params_;  // config_->job()
  int rank_;
  int size_;
  nccl::Library* lib_ = nullptr;
  std::mutex mu_;  // comms_: Abort may come from another thread
  std::map<std::pair<int, int>, Communicator> comms_;  // by (device, Scope)
  std::map<int, CommList> comm_lists_;                  // by device: CommsOf
  // Two-level: possible on this topology (and forced); else why not, for the warning.
  bool two_level_ = false;
  std::string two_level_why_not_;
  bool warned_flat_ = false;
  std::unique_ptr<MpiCollectives> cross_mpi_;  // the MPI step across hosts
  void* host_shard_ = nullptr;
  int64_t host_shard_bytes_ = 0;
  int host_shard_device_ = -1;
};

}  // namespace hvdlite
