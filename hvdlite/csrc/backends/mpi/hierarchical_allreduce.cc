#include "backends/mpi/hierarchical_allreduce.h"

#include <algorithm>

#include "backends/mpi/reduce_ops.h"

namespace hvdlite {

void HierarchicalAllreduce::Run(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op,
                                double postscale, int64_t chunk) {
  const int64_t es = DataTypeSize(dt);
  chunk = std::clamp<int64_t>(chunk, 1, 1 << 29);  // an MPI count per segment, with room
  const char* src = static_cast<const char*>(sendbuf);
  char* dst = static_cast<char*>(recvbuf);

  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t c = std::min(chunk, count - off);
    const RingSegment seg = local_->RingReduceScatter(src + off * es, dst + off * es, c, dt, op, 1.0);
    if (seg.count > 0) {
      // The scale is applied once, where the segment's reduction is finished.
      char* mine = dst + (off + seg.offset) * es;
      cross_->Allreduce(mine, mine, seg.count, dt, op, postscale);
    }
    local_->RingAllgather(dst + off * es, c, dt);
  }
}

}  // namespace hvdlite
