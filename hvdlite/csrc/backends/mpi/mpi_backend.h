// The host-memory backend: every collective over MPI on hvdlite's world communicator,
// finished before Run returns. Fusion on host memory is cut to the cache (see
// docs/architecture.md): a fused set is reduced in cache-sized pieces, tensors large
// enough are reduced where they lie, and small ones are packed with memcpy.
#pragma once

#include <mpi.h>

#include <memory>

#include "backends/backend.h"
#include "backends/mpi/fusion_buffer.h"
#include "backends/mpi/host_memory.h"
#include "backends/mpi/mpi_collectives.h"
#include "parameters.h"

namespace hvdlite {

class MpiBackend : public Backend {
 public:
  MpiBackend(MPI_Comm world, const Parameters& params);
  const char* Name() const override { return "MPI"; }
  DeviceKind Device() const override { return DeviceKind::kHost; }
  bool Supports(const Response& r, std::string* why_not) const override;
  FusionLimits Fusion() const override;
  std::unique_ptr<Completion> Run(CollectiveJob& job) override;

  int64_t huge_page_extents() const { return huge_pages_.collapsed(); }

 private:
  void Allreduce(CollectiveJob& job);
  void Allgather(CollectiveJob& job);
  void Broadcast(CollectiveJob& job);
  void Alltoall(CollectiveJob& job);
  void Reducescatter(CollectiveJob& job);

  Parameters params_;
  int rank_ = 0;
  int size_ = 1;
  MpiCollectives mpi_;
  FusionBuffer fusion_;
  FusionBuffer scratch_;
  HugePages huge_pages_;
};

}  // namespace hvdlite
