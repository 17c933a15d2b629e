#include "backends/layout.h"

namespace hvdlite {

std::vector<int64_t> GatherLayout::OutputShape(size_t i, const std::vector<int64_t>& shape) const {
  std::vector<int64_t> out = shape;
  out[0] = rows[i];
  return out;
}

GatherLayout PlanAllgather(const Response& r, const std::vector<TensorEntry>& entries, int ranks) {
  GatherLayout g;
  g.ranks = ranks;
  g.sizes = r.sizes;
  const size_t n = r.names.size();
  g.row_bytes.resize(n);
  g.rows.assign(n, 0);
  g.block.assign(ranks, 0);
  for (size_t i = 0; i < n; ++i) {
    g.row_bytes[i] = RowElements(entries[i].request.shape) * DataTypeSize(entries[i].request.dtype);
    for (int q = 0; q < ranks; ++q) {
      g.rows[i] += r.sizes[i * ranks + q];
      g.block[q] += g.Bytes(i, q);
    }
  }
  g.block_offset.assign(ranks, 0);
  for (int q = 0; q < ranks; ++q) {
    g.block_offset[q] = g.total;
    g.total += g.block[q];
  }
  return g;
}

AlltoallLayout PlanAlltoall(const Response& r, const TensorEntry& e, int rank, int ranks) {
  AlltoallLayout a;
  const std::vector<int64_t>& shape = e.request.shape;
  const int64_t row = RowElements(shape) * DataTypeSize(r.dtype);
  a.send_bytes.resize(ranks);
  a.recv_bytes.resize(ranks);
  a.send_offset.resize(ranks);
  a.recv_offset.resize(ranks);
  int64_t send_total = 0;
  for (int q = 0; q < ranks; ++q) {
    a.send_bytes[q] = r.sizes[rank * ranks + q] * row;
    a.recv_bytes[q] = r.sizes[q * ranks + rank] * row;
    a.send_offset[q] = send_total;
    a.recv_offset[q] = a.total_recv;
    send_total += a.send_bytes[q];
    a.total_recv += a.recv_bytes[q];
    a.rows += r.sizes[q * ranks + rank];
    a.received_rows.push_back(r.sizes[q * ranks + rank]);
  }
  int64_t moved = 0;
  for (int64_t v : r.sizes) moved += v;
  a.moves_data = moved > 0 && row > 0;
  a.output_shape = shape;
  a.output_shape[0] = a.rows;
  return a;
}

ScatterLayout PlanReducescatter(const std::vector<int64_t>& shape, int rank, int ranks) {
  ScatterLayout s;
  const int64_t row_elems = RowElements(shape);
  const int64_t dim0 = shape[0];
  s.counts.resize(ranks);
  s.offset.resize(ranks);
  for (int q = 0; q < ranks; ++q) {
    s.counts[q] = (dim0 / ranks + (q < dim0 % ranks ? 1 : 0)) * row_elems;
    s.offset[q] = s.total;
    s.total += s.counts[q];
  }
  s.output_shape = shape;
  s.output_shape[0] = dim0 / ranks + (rank < dim0 % ranks ? 1 : 0);
  return s;
}

}  // namespace hvdlite
