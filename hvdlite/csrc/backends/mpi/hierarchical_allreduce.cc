#include "backends/mpi/hierarchical_allreduce.h"

#include <algorithm>

#include "backends/mpi/reduce_ops.h"

namespace hvdlite {

const char* HierarchicalAllreduce::PhaseName() const {
  return schedule_ == TwoLevelSchedule::kLeader ? "MPI_LEADER_ALLREDUCE" : "MPI_HIERARCHICAL_ALLREDUCE";
}

void HierarchicalAllreduce::Run(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op,
                                double postscale, int64_t chunk) {
  const int64_t es = DataTypeSize(dt);
  chunk = std::clamp<int64_t>(chunk, 1, 1 << 29);  // an MPI count per segment, with room
  const char* src = static_cast<const char*>(sendbuf);
  char* dst = static_cast<char*>(recvbuf);
  for (int64_t off = 0; off < count; off += chunk) {
    const int64_t c = std::min(chunk, count - off);
    if (schedule_ == TwoLevelSchedule::kLeader) Leader(src + off * es, dst + off * es, c, dt, op, postscale);
    else Torus(src + off * es, dst + off * es, c, dt, op, postscale);
  }
}

void HierarchicalAllreduce::Torus(const char* src, char* dst, int64_t count, DataType dt, ReduceOp op,
                                  double postscale) {
  const int64_t es = DataTypeSize(dt);
  const RingSegment seg = local_->RingReduceScatter(src, dst, count, dt, op, 1.0);
  if (seg.count > 0) {
    // The scale is applied once, where the segment's reduction is finished.
    char* mine = dst + seg.offset * es;
    cross_->Allreduce(mine, mine, seg.count, dt, op, postscale);
  }
  local_->RingAllgather(dst, count, dt);
}

// Local rank 0 of every host is in the same cross communicator (the leaders'), so its
// cross allreduce is the one between hosts; the other ranks wait in the broadcast.
void HierarchicalAllreduce::Leader(const char* src, char* dst, int64_t count, DataType dt, ReduceOp op,
                                   double postscale) {
  local_->Reduce(src, dst, count, dt, op, 0);
  if (local_->rank() == 0) cross_->Allreduce(dst, dst, count, dt, op, postscale);
  local_->Broadcast(dst, count * DataTypeSize(dt), 0);
}

}  // namespace hvdlite
