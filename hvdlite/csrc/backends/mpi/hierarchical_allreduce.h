// Two-level allreduces for ranks spread over several hosts, whose links between hosts
// are slower than memory inside one. Two schedules, chosen by
// HVDLITE_HIERARCHICAL_ALGORITHM (rank 0's value):
//
// torus (the default), for each chunk of the buffer:
//   1. a ring reduce-scatter among the ranks of each host (shared memory), after which
//      local rank l holds its host's sum of one segment, 1/local_size of the chunk;
//   2. an allreduce of that segment among the ranks with local rank l on every host,
//      so each host sends about the chunk's size over its link, where a flat ring over
//      all ranks sends 2(n-1)/n of it through each host boundary;
//   3. a ring allgather among the ranks of each host.
// leader, for each chunk:
//   1. MPI_Reduce inside each host to local rank 0 (the host's leader);
//   2. an allreduce of the whole chunk among the leaders;
//   3. MPI_Bcast from the leader inside the host.
// Both send the same bytes between hosts; the torus splits them, and the reductions,
// over every rank of a host, where the leader's one process does them all
// (docs/architecture.md, "Several hosts", has the measurements).
// Chunks go one after the other. (Overlapping step 2 of one chunk with steps 1 and 3 of
// its neighbours through MPI_Iallreduce was slower on emulated hosts: 0.71-0.81 s for
// 64 MiB on 2 x 2 ranks against 0.61-0.69 s; docs/scale.md.)
// Every host must run the same number of ranks (Topology::homogeneous()).
#pragma once

#include <cstdint>

#include "backends/mpi/mpi_collectives.h"
#include "common/common.h"

namespace hvdlite {

enum class TwoLevelSchedule { kTorus = 0, kLeader = 1 };

class HierarchicalAllreduce {
 public:
  // `local`: the ranks of this host; `cross`: the ranks with this rank's local rank.
  HierarchicalAllreduce(MpiCollectives* local, MpiCollectives* cross, TwoLevelSchedule schedule)
      : local_(local), cross_(cross), schedule_(schedule) {}
  // Reduces `count` elements of `sendbuf` (may equal `recvbuf`) into `recvbuf`, scaled
  // by `postscale`, in chunks of `chunk` elements. Every rank must pass the same
  // count, type, op, scale and chunk.
  void Run(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op, double postscale,
           int64_t chunk);
  TwoLevelSchedule schedule() const { return schedule_; }
  // The timeline phase of a two-level allreduce with this schedule.
  const char* PhaseName() const;

 private:
  void Torus(const char* src, char* dst, int64_t count, DataType dt, ReduceOp op, double postscale);
  void Leader(const char* src, char* dst, int64_t count, DataType dt, ReduceOp op, double postscale);

  MpiCollectives* local_;
  MpiCollectives* cross_;
  TwoLevelSchedule schedule_;
};

}  // namespace hvdlite
