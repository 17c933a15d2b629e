// GPU tensors through host memory: copied to the host on hvdlite's stream of the device
// (after the producer's work), reduced by the MPI backend, copied back, and the result
// ordered after by an event -- Horovod's `HOROVOD_GPU_ALLREDUCE=MPI` and friends, and
// the fallback for what NCCL cannot do (a scale factor on integers, Adasum).
//
// The background thread waits for the copies to the host: this path trades that wait
// (and two copies) for needing nothing but MPI. The copies back are not waited for.
#pragma once

#include "backends/backend.h"
#include "gpu/gpu_context.h"

namespace hvdlite {

class MpiBackend;

class HostStagedBackend : public Backend {
 public:
  HostStagedBackend(MpiBackend* mpi, GpuContext* gpus) : mpi_(mpi), gpus_(gpus) {}
  const char* Name() const override { return "MPI"; }
  DeviceKind Device() const override { return DeviceKind::kCuda; }
  bool Supports(const Response& r, std::string* why_not) const override;
  FusionLimits Fusion() const override;
  std::unique_ptr<Completion> Run(CollectiveJob& job) override;

 private:
  MpiBackend* mpi_;
  GpuContext* gpus_;
};

}  // namespace hvdlite
