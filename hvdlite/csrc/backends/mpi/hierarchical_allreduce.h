// A two-level allreduce for ranks spread over several hosts, whose links between hosts
// are slower than memory inside one. For each chunk of the buffer:
//   1. a ring reduce-scatter among the ranks of each host (shared memory), after which
//      local rank l holds its host's sum of one segment, 1/local_size of the chunk;
//   2. an allreduce of that segment among the ranks with local rank l on every host,
//      so each host sends about the chunk's size over its link, where a flat ring over
//      all ranks sends 2(n-1)/n of it through each host boundary;
//   3. a ring allgather among the ranks of each host.
// Chunks go one after the other. (Overlapping step 2 of one chunk with steps 1 and 3 of
// its neighbours through MPI_Iallreduce was slower on emulated hosts: 0.71-0.81 s for
// 64 MiB on 2 x 2 ranks against 0.61-0.69 s; docs/scale.md.)
// Every host must run the same number of ranks (Topology::homogeneous()).
#pragma once

#include <cstdint>

#include "backends/mpi/mpi_collectives.h"
#include "common.h"

namespace hvdlite {

class HierarchicalAllreduce {
 public:
  // `local`: the ranks of this host; `cross`: the ranks with this rank's local rank.
  HierarchicalAllreduce(MpiCollectives* local, MpiCollectives* cross) : local_(local), cross_(cross) {}
  // Reduces `count` elements of `sendbuf` (may equal `recvbuf`) into `recvbuf`, scaled
  // by `postscale`, in chunks of `chunk` elements. Every rank must pass the same
  // count, type, op, scale and chunk.
  void Run(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op, double postscale,
           int64_t chunk);

 private:
  MpiCollectives* local_;
  MpiCollectives* cross_;
};

}  // namespace hvdlite
