// Where the bytes of a response go, worked out once for every backend: which rank
// contributes how many bytes of which tensor to an allgather, how an alltoall's splits
// translate into bytes, how a reducescatter divides rows. Each backend then moves the
// bytes its own way (host memcpy and MPI, or device copies and NCCL).
#pragma once

#include <cstdint>
#include <vector>

#include "common/message.h"
#include "common/tensor_entry.h"

namespace hvdlite {

// An allgather of one or several tensors (response.sizes: each tensor's first
// dimension on each rank, tensor after tensor).
struct GatherLayout {
  int ranks = 0;
  std::vector<int64_t> row_bytes;   // per tensor: bytes of one row
  std::vector<int64_t> rows;        // per tensor: rows gathered from all ranks
  std::vector<int64_t> block;       // per rank: bytes it contributes, all tensors together
  std::vector<int64_t> block_offset;  // per rank: where its block starts in the packed result
  int64_t total = 0;                // bytes gathered in all
  std::vector<int64_t> sizes;       // response.sizes
  // Bytes of tensor `i` that rank `q` contributes.
  int64_t Bytes(size_t i, int q) const { return sizes[i * ranks + q] * row_bytes[i]; }
  // Bytes of tensor `i`'s whole result.
  int64_t OutputBytes(size_t i) const { return rows[i] * row_bytes[i]; }
  // Tensor i's result shape: its shape with the gathered rows as first dimension.
  std::vector<int64_t> OutputShape(size_t i, const std::vector<int64_t>& shape) const;
};
GatherLayout PlanAllgather(const Response& r, const std::vector<TensorEntry>& entries, int ranks);

// An alltoall (response.sizes: the splits matrix, row q = rows rank q sends to each rank).
struct AlltoallLayout {
  std::vector<int64_t> send_bytes, send_offset;  // per destination rank
  std::vector<int64_t> recv_bytes, recv_offset;  // per source rank
  std::vector<int64_t> received_rows;            // per source rank (the result's `aux`)
  int64_t rows = 0;                              // rows received in all
  int64_t total_recv = 0;
  bool moves_data = false;                       // some rank sends something
  std::vector<int64_t> output_shape;
};
AlltoallLayout PlanAlltoall(const Response& r, const TensorEntry& e, int rank, int ranks);

// A reducescatter: rank q receives dim0 / ranks rows, one more if q < dim0 % ranks.
struct ScatterLayout {
  std::vector<int64_t> counts;  // elements per rank
  std::vector<int64_t> offset;  // where each rank's share starts, in elements
  int64_t total = 0;            // elements of the input
  std::vector<int64_t> output_shape;  // this rank's result
};
ScatterLayout PlanReducescatter(const std::vector<int64_t>& shape, int rank, int ranks);

}  // namespace hvdlite
