// Host-memory collectives over MPI, on the engine's own duplicate of the communicator.
#pragma once

#include <mpi.h>

#include "collectives.h"
#include "fusion_buffer.h"

namespace hvdlite {

class MpiCollectives : public Collectives {
 public:
  // Allreduces whose ring segments (bytes / ranks) reach `ring_min_segment_bytes` run
  // as hvdlite's own ring (see RingAllreduce); smaller ones, and every other
  // collective, are MPI's.
  MpiCollectives(MPI_Comm comm, int64_t ring_min_segment_bytes);
  const char* Name() const override { return "MPI"; }
  void Allreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op,
                 double postscale) override;
  void Allgatherv(const void* sendbuf, int64_t send_bytes, void* recvbuf,
                  const std::vector<int64_t>& recv_bytes) override;
  void Broadcast(void* buf, int64_t bytes, int root) override;
  void Alltoallv(const void* sendbuf, const std::vector<int64_t>& send_bytes, void* recvbuf,
                 const std::vector<int64_t>& recv_bytes) override;
  void ReduceScatter(const void* sendbuf, void* recvbuf, const std::vector<int64_t>& recv_counts,
                     DataType dt, ReduceOp op) override;
  void Barrier() override;

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
