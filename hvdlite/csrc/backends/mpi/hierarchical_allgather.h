// A two-level allgather for ranks spread over several hosts with the same number of
// ranks on each. The result is built host after host (each host's ranks in local-rank
// order; a host's part is its "segment"):
//   1. an allgather inside each host (shared memory): every rank of a host then holds
//      its host's whole segment;
//   2. an allgather between hosts among the ranks with the same local rank: local rank l
//      sends the l-th of local_size pieces of its host's segment, and receives the l-th
//      piece of every other host's segment, in calls that move at most a chunk of each
//      piece (on the emulated 1 Gbit/s links, long TCP transfers stall behind the rate
//      limiter, as the two-level allreduce found);
//   3. for each other host, an allgather inside the host of that host's pieces.
// Each byte crosses into every other host once, as in any allgather, and the host's
// outgoing bytes are split evenly over its ranks whatever the first dimensions are
// (docs/architecture.md, "Several hosts", says why not the leaders alone).
// When the world's ranks are numbered host after host (mpirun's default placement by
// slot, `-H`, a hostfile), that order is the result's and the steps write straight
// into it; otherwise the caller reorders (Order(), Offsets()).
#pragma once

#include <cstdint>
#include <vector>

#include "backends/mpi/mpi_collectives.h"
#include "mpi/topology.h"

namespace hvdlite {

class HierarchicalAllgather {
 public:
  // Collective over `topology`'s world: learns every rank's host and local rank.
  // `local` and `cross` run on the topology's local and cross communicators.
  HierarchicalAllgather(const Topology& topology, MpiCollectives* local, MpiCollectives* cross);

  // True when the host-after-host order is the world's rank order.
  bool WorldOrder() const { return world_order_; }
  // Where each world rank's block starts in the host-after-host result, for blocks of
  // `block[q]` bytes from world rank q.
  std::vector<int64_t> Offsets(const std::vector<int64_t>& block) const;
  // Gathers every rank's block into `out`, host after host (Offsets()). `mine` is this
  // rank's block (block[rank] bytes), or null when it already lies at its offset in `out`.
  // Between hosts, each call moves at most `chunk` bytes of a piece. Every rank passes
  // the same `block` and `chunk`.
  void Run(const void* mine, void* out, const std::vector<int64_t>& block, int64_t chunk);

 private:
  MpiCollectives* local_;
  MpiCollectives* cross_;
  int rank_ = 0;
  int hosts_ = 1;     // number of hosts
  int per_host_ = 1;  // ranks on each
  int my_host_ = 0;
  bool world_order_ = true;
  std::vector<int> host_of_;        // per world rank: its host's index (by its leader's rank)
  std::vector<int> local_of_;       // per world rank: its local rank
  std::vector<int> cross_host_;     // per cross rank of this rank's cross communicator: its host
  std::vector<std::vector<int>> ranks_of_;  // per host: its world ranks, by local rank
};

}  // namespace hvdlite
