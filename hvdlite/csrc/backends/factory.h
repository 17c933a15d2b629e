// Makes an engine's backends: the one place that names the concrete ones. The engine
// sees them only through the Backend interface and the registry that picks among them.
#pragma once

#include <memory>

#include "backends/registry.h"

namespace hvdlite {

class Config;
class ControlTransport;
class GpuContext;
class Topology;

// What the backends are built on: the engine's communicators (`topology`), its control
// channel (the NCCL backend's setup messages), the GPUs this process drives, and its
// configuration. All of it outlives the registry.
struct BackendContext {
  const Topology& topology;
  ControlTransport* control;
  GpuContext* gpus;
  const Config* config;
};

// Host memory: MPI. GPU memory: NCCL, then MPI through host memory (host-staged) for
// what NCCL cannot run or HOROVOD_GPU_<OP>=MPI asks for.
std::unique_ptr<BackendRegistry> MakeBackends(const BackendContext& context);

}  // namespace hvdlite
