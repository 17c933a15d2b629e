// Host-memory collectives over MPI, on the engine's own duplicate of the communicator:
// the transport under the MPI backend (mpi_backend.h).
#pragma once

#include <mpi.h>

#include <cstdint>
#include <vector>

#include "backends/mpi/fusion_buffer.h"
#include "common/common.h"

namespace hvdlite {

// The part of a buffer (in elements) that one rank holds finished after a ring
// reduce-scatter.
struct RingSegment {
  int64_t offset = 0;
  int64_t count = 0;
};

class MpiCollectives {
 public:
  // Allreduces whose ring segments (bytes / ranks) reach `ring_min_segment_bytes` run
  // as hvdlite's own ring (see RingAllreduce); smaller ones, and every other
  // collective, are MPI's.
  MpiCollectives(MPI_Comm comm, int64_t ring_min_segment_bytes);
  void Allreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op,
                 double postscale);
  void Allgatherv(const void* sendbuf, int64_t send_bytes, void* recvbuf,
                  const std::vector<int64_t>& recv_bytes);
  // An allgather in place: rank q's `recv_bytes[q]` bytes already lie at
  // `recvbuf + displs[q]` on rank q, and go there on every rank. Every rank passes the
  // same counts and displacements (bytes, below 2 GiB).
  void AllgathervInPlace(void* recvbuf, const std::vector<int64_t>& recv_bytes,
                         const std::vector<int64_t>& displs);
  // MPI_Reduce to `root`; `recvbuf` matters on the root only (there it may equal `sendbuf`).
  void Reduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op, int root);
  void Broadcast(void* buf, int64_t bytes, int root);
  void Alltoallv(const void* sendbuf, const std::vector<int64_t>& send_bytes, void* recvbuf,
                 const std::vector<int64_t>& recv_bytes);
  void ReduceScatter(const void* sendbuf, void* recvbuf, const std::vector<int64_t>& recv_counts,
                     DataType dt, ReduceOp op);
  void Barrier();

  // The two halves of hvdlite's ring allreduce, for algorithms built on them
  // (hierarchical_allreduce.h). RingReduceScatter leaves in `recvbuf` the whole
  // reduction (scaled by `postscale`) of the segment it returns, which this rank owns;
  // RingAllgather then passes every rank's owned segment to every rank. `count` may be
  // below the number of ranks (some segments are empty).
  RingSegment RingReduceScatter(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op,
                                double postscale);
  void RingAllgather(void* recvbuf, int64_t count, DataType dt);
  RingSegment OwnedSegment(int64_t count) const;
  int size() const { return size_; }
  int rank() const { return rank_; }

 private:
  void RingAllreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op,
                     double postscale);

  MPI_Comm comm_;
  int size_;
  int rank_;
  int64_t ring_min_segment_bytes_;
  FusionBuffer incoming_;  // the ring's receive buffer: one segment
};

}  // namespace hvdlite
