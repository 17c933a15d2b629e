// The host-memory backend: every collective over MPI on hvdlite's world communicator,
// finished before Run returns. Fusion on host memory is cut to the cache (see
// docs/architecture.md): a fused set is reduced in cache-sized pieces, tensors large
// enough are reduced where they lie, and small ones are packed with memcpy.
#pragma once

#include <mpi.h>

#include <memory>

#include "backends/backend.h"
#include "backends/mpi/adasum.h"
#include "backends/mpi/fusion_buffer.h"
#include "backends/mpi/hierarchical_allgather.h"
#include "backends/mpi/hierarchical_allreduce.h"
#include "backends/mpi/host_memory.h"
#include "backends/mpi/mpi_collectives.h"
#include "common/config.h"
#include "mpi/topology.h"

namespace hvdlite {

class MpiBackend : public Backend {
 public:
  // Collectives run on `topology`'s world; allreduces and allgathers across hosts may
  // run in two levels on its local and cross communicators (hierarchical_allreduce.h,
  // hierarchical_allgather.h).
  // `config`: the engine's, which outlives the backend.
  MpiBackend(const Topology& topology, const Config* config);
  const char* Name() const override { return "MPI"; }
  DeviceKind Device() const override { return DeviceKind::kHost; }
  bool Supports(const Response& r, std::string* why_not) const override;
  FusionLimits Fusion() const override;
  bool TwoLevelPossible() const override { return hierarchical_ != nullptr; }
  void AddStats(BackendStats* stats) const override { stats->huge_page_extents += huge_pages_.collapsed(); }
  std::unique_ptr<Completion> Run(CollectiveJob& job) override;

 private:
  void Allreduce(CollectiveJob& job);
  // What a result is scaled by after the reduction: postscale, and Average's 1/size.
  double PostFactor(const Response& r) const;
  // op=Adasum: each tensor on its own (adasum.h), scaled before and after.
  void AdasumTensors(CollectiveJob& job);
  // One reduction of `count` elements, flat or two-level (see Hierarchical).
  void AllreduceRange(const void* src, void* dst, int64_t count, DataType dt, ReduceOp op, double postscale);
  bool Hierarchical(int64_t count, int64_t element_bytes) const;
  // Whether an allgather of `total` gathered bytes (all ranks together) runs in two levels.
  bool HierarchicalGather(int64_t total) const;
  void Allgather(CollectiveJob& job);
  void Broadcast(CollectiveJob& job);
  void Alltoall(CollectiveJob& job);
  void Reducescatter(CollectiveJob& job);
  void FusedReducescatter(CollectiveJob& job);

  static constexpr int64_t kHierarchicalMinBytes = 64 * 1024;  // the default's threshold
  // The same for allgathers (gathered bytes, all ranks together): below it the two-level
  // allgather's extra calls inside the hosts cost more than the link saves.
  static constexpr int64_t kHierarchicalGatherMinBytes = 256 * 1024;

  const Config* config_;
  const Parameters& params_;  // config_->job()
  MpiCollectives mpi_;
  FusionBuffer fusion_;
  FusionBuffer scratch_;
  HugePages huge_pages_;
  int rank_ = 0;
  int size_ = 1;
  // Set when this job spans several hosts with the same number of ranks on each.
  std::unique_ptr<MpiCollectives> local_, cross_;
  AdasumAllreduce adasum_;
  std::unique_ptr<HierarchicalAllreduce> hierarchical_;
  std::unique_ptr<HierarchicalAllgather> hierarchical_gather_;
};

}  // namespace hvdlite
