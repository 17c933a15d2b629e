#include "backends/factory.h"

#include "backends/mpi/mpi_backend.h"
#include "backends/nccl/nccl_backend.h"
#include "backends/staged/host_staged_backend.h"

namespace hvdlite {

std::unique_ptr<BackendRegistry> MakeBackends(const BackendContext& context) {
  auto registry = std::make_unique<BackendRegistry>(context.config);
  auto* mpi = static_cast<MpiBackend*>(registry->Add(std::make_unique<MpiBackend>(context.topology, context.config)));
  registry->Add(std::make_unique<NcclBackend>(context.control, context.gpus, context.topology, context.config));
  registry->Add(std::make_unique<HostStagedBackend>(mpi, context.gpus));
  return registry;
}

}  // namespace hvdlite
