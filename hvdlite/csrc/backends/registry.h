// Which backend runs a response: chosen from the tensors' kind of device, the kind of
// collective and, on GPUs, Horovod's HOROVOD_GPU_OPERATIONS / HOROVOD_GPU_ALLREDUCE /
// _ALLGATHER / _BROADCAST / _ALLTOALL / _REDUCESCATTER (NCCL or MPI), as Horovod's
// operation manager and PyTorch's device-to-backend map do. The preferred backend runs
// what it supports; what it cannot (a scale factor on integers, say) goes to the next
// one of the same device kind. The choice rests on the response and on rank 0's
// settings only, so every rank makes the same one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/backend.h"
#include "common/config.h"

namespace hvdlite {

class BackendRegistry {
 public:
  // `config`: the engine's, which outlives the registry.
  explicit BackendRegistry(const Config* config) : config_(config) {}
  // Takes `backend` over; returns it.
  Backend* Add(std::unique_ptr<Backend> backend);
  // The backend for `r`, or null with the reason in `error`.
  Backend* Select(const Response& r, std::string* error) const;
  // What the coordinator may fuse for tensors of `kind`: the preferred allreduce
  // backend's limits, capped by the fusion threshold in force.
  FusionLimits Fusion(DeviceKind kind) const;
  // Whether any backend can run a two-level allreduce here (for the autotuner).
  bool TwoLevelPossible() const;
  // Every backend's counters.
  BackendStats Stats() const;
  // Stops every backend's queued device work (a failure means peers will not join it).
  void AbortAll(const std::string& why);
  const std::vector<std::unique_ptr<Backend>>& backends() const { return backends_; }

 private:
  // The backends of `kind` able to run `type`, the preferred one first.
  std::vector<Backend*> Candidates(DeviceKind kind, RequestType type) const;

  const Config* config_;
  std::vector<std::unique_ptr<Backend>> backends_;
};

}  // namespace hvdlite
