// Host-memory collectives over MPI, on the engine's own duplicate of the communicator.
#pragma once

#include <mpi.h>

#include "collectives.h"

namespace hvdlite {

class MpiCollectives : public Collectives {
 public:
  explicit MpiCollectives(MPI_Comm comm);
  const char* Name() const override { return "MPI"; }
  void Allreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op) override;
  void Allgatherv(const void* sendbuf, int64_t send_bytes, void* recvbuf,
                  const std::vector<int64_t>& recv_bytes) override;
  void Broadcast(void* buf, int64_t bytes, int root) override;
  void Alltoallv(const void* sendbuf, const std::vector<int64_t>& send_bytes, void* recvbuf,
                 const std::vector<int64_t>& recv_bytes) override;
  void ReduceScatter(const void* sendbuf, void* recvbuf, const std::vector<int64_t>& recv_counts,
                     DataType dt, ReduceOp op) override;
  void Barrier() override;

 private:
  MPI_Comm comm_;
  int size_;
};

}  // namespace hvdlite
