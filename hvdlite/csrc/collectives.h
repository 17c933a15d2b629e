// The one interface every data-plane backend implements. The engine decides what to
// run and in which order; a backend only moves and reduces bytes. A new backend (NCCL,
// a hierarchical composition) is a new implementation of this class.
#pragma once

#include <cstdint>
#include <vector>

#include "common.h"

namespace hvdlite {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual const char* Name() const = 0;
  // sendbuf == recvbuf means in place. Count is in elements. Every element of the
  // result is multiplied by `postscale` (1: left as reduced), which a backend can fold
  // into its last reduction step instead of a separate pass over the result.
  virtual void Allreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op,
                         double postscale) = 0;
  // Every rank contributes send_bytes; recv_bytes[r] is rank r's contribution.
  virtual void Allgatherv(const void* sendbuf, int64_t send_bytes, void* recvbuf,
                          const std::vector<int64_t>& recv_bytes) = 0;
  virtual void Broadcast(void* buf, int64_t bytes, int root) = 0;
  virtual void Alltoallv(const void* sendbuf, const std::vector<int64_t>& send_bytes, void* recvbuf,
                         const std::vector<int64_t>& recv_bytes) = 0;
  // recv_counts[r] elements of the reduced result land on rank r.
  virtual void ReduceScatter(const void* sendbuf, void* recvbuf, const std::vector<int64_t>& recv_counts,
                             DataType dt, ReduceOp op) = 0;
  virtual void Barrier() = 0;
};

}  // namespace hvdlite
