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
#pragma once

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "backends/backend.h"
#include "backends/nccl/nccl_library.h"
#include "gpu/gpu_context.h"
#include "parameters.h"

namespace hvdlite {

class ControlChannel;

class NcclBackend : public Backend {
 public:
  NcclBackend(ControlChannel* channel, GpuContext* gpus, const Parameters& params, int rank, int size);
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
  // The device's communicator, made collectively on first use.
  nccl::Comm CommFor(int device);
  void Check(nccl::Result r, const char* what, nccl::Comm comm) const;

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

  ControlChannel* channel_;
  GpuContext* gpus_;
  Parameters params_;
  int rank_;
  int size_;
  nccl::Library* lib_ = nullptr;
  std::mutex mu_;  // comms_: Abort may come from another thread
  std::map<int, Communicator> comms_;
};

}  // namespace hvdlite
