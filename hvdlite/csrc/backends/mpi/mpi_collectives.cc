#include "backends/mpi/mpi_collectives.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>

#include "backends/mpi/exchange.h"
#include "backends/mpi/reduce_ops.h"
#include "mpi/errors.h"

namespace hvdlite {
namespace {

// PeerFailure where a peer died (membership.h), else std::runtime_error.
void Check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) CheckMpi(rc, std::string("MPI_") + what);
}

// MPI counts are int; one call moves at most this many elements.
constexpr int64_t kMaxCount = INT_MAX / 2;

std::vector<int> ToIntCounts(const std::vector<int64_t>& v, std::vector<int>* displs) {
  std::vector<int> out(v.size());
  int64_t off = 0;
  displs->assign(v.size(), 0);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] > INT_MAX || off > INT_MAX)
      throw std::runtime_error("hvdlite: a single allgather/alltoall above 2 GiB is not supported");
    out[i] = static_cast<int>(v[i]);
    (*displs)[i] = static_cast<int>(off);
    off += v[i];
  }
  return out;
}

// How a ring cuts `count` elements into one segment per rank (the first count % n
// segments get one element more).
struct RingCut {
  RingCut(int64_t count, int n) : base(count / n), extra(count % n) {}
  int64_t offset(int k) const { return k * base + std::min<int64_t>(k, extra); }
  int64_t length(int k) const { return base + (k < extra ? 1 : 0); }
  int64_t base, extra;
};

}  // namespace

MpiCollectives::MpiCollectives(MPI_Comm comm, int64_t ring_min_segment_bytes)
    : comm_(comm), ring_min_segment_bytes_(ring_min_segment_bytes) {
  MPI_Comm_size(comm, &size_);
  MPI_Comm_rank(comm, &rank_);
}

void MpiCollectives::Allreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op,
                               double postscale) {
  const int64_t esize = DataTypeSize(dt);
  // Every rank must pick the same algorithm, so the choice rests only on what the
  // ranks agreed on (count, type), never on whether this rank's call is in place. Each
  // of the ring's 2(size-1) steps moves one segment, count/size elements: below
  // ring_min_segment_bytes_ their latency would dominate, and MPI_Allreduce's fewer
  // steps win.
  const bool ring = size_ > 1 && count >= size_ && count / size_ * esize >= ring_min_segment_bytes_;
  for (int64_t off = 0; off < count; off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, count - off));
    char* r = static_cast<char*>(recvbuf) + off * esize;
    const char* s = static_cast<const char*>(sendbuf) + off * esize;
    if (ring) {
      RingAllreduce(s, r, n, dt, op, postscale);
      continue;
    }
    Check(MPI_Allreduce(sendbuf == recvbuf ? MPI_IN_PLACE : s, r, n, MpiType(dt), MpiOp(op, dt), comm_),
          "Allreduce");
    ScaleBuffer(r, n, dt, postscale);
  }
}

// A ring allreduce: the buffer is cut into `size_` segments; in size-1 steps each rank
// passes a segment to its right neighbour and reduces the one arriving from its left
// (reduce-scatter), so that rank r ends up owning the whole sum of segment r+1, scaled
// as it is made; size-1 more steps pass the finished segments round (allgather).
// Each rank reduces 1/size of the data, each byte crosses between two ranks once per
// phase, out of place the input is read where it lies (never copied to the output
// first), and a scale factor costs no pass of its own; docs/architecture.md has the
// measurements against MPI_Allreduce. Every segment is reduced on one rank only, so all
// ranks get the same bits. The transfers are exchanges (exchange.h) of the element type, which
// Open MPI carries between processes of one host as a single copy (CMA).
void MpiCollectives::RingAllreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op,
                                   double postscale) {
  RingReduceScatter(sendbuf, recvbuf, count, dt, op, postscale);
  RingAllgather(recvbuf, count, dt);
}

RingSegment MpiCollectives::OwnedSegment(int64_t count) const {
  const RingCut cut(count, size_);
  const int k = (rank_ + 1) % size_;
  return RingSegment{cut.offset(k), cut.length(k)};
}

RingSegment MpiCollectives::RingReduceScatter(const void* sendbuf, void* recvbuf, int64_t count, DataType dt,
                                              ReduceOp op, double postscale) {
  const int n = size_;
  const int64_t es = DataTypeSize(dt);
  const MPI_Datatype type = MpiType(dt);
  const int right = (rank_ + 1) % n, left = (rank_ + n - 1) % n;
  const RingCut cut(count, n);
  auto at = [es](const void* p, int64_t elems) {
    return const_cast<char*>(static_cast<const char*>(p)) + elems * es;
  };
  if (n == 1) {
    if (sendbuf != recvbuf) std::memcpy(recvbuf, sendbuf, static_cast<size_t>(count * es));
    ScaleBuffer(recvbuf, count, dt, postscale);
    return RingSegment{0, count};
  }
  uint8_t* incoming = incoming_.Get((cut.base + 1) * es);
  // In step s a rank sends segment r-s (its input at s = 0, else what it reduced in
  // step s-1) and reduces segment r-s-1 into the output.
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = ((rank_ - s) % n + n) % n;
    const int recv_seg = ((rank_ - s - 1) % n + n) % n;
    const void* from = s == 0 ? at(sendbuf, cut.offset(send_seg)) : at(recvbuf, cut.offset(send_seg));
    Exchange(from, static_cast<int>(cut.length(send_seg)), right, incoming, static_cast<int>(cut.length(recv_seg)),
             left, type, 0, comm_, "MPI exchange (ring reduce-scatter)");
    const int64_t off = cut.offset(recv_seg);
    ReduceScaled(at(recvbuf, off), at(sendbuf, off), incoming, cut.length(recv_seg), dt, op,
                 s == n - 2 ? postscale : 1.0);
  }
  return OwnedSegment(count);
}

// Rank r owns segment r+1; in step s it sends segment r+1-s and receives r-s.
void MpiCollectives::RingAllgather(void* recvbuf, int64_t count, DataType dt) {
  const int n = size_;
  if (n == 1) return;
  const int64_t es = DataTypeSize(dt);
  const MPI_Datatype type = MpiType(dt);
  const int right = (rank_ + 1) % n, left = (rank_ + n - 1) % n;
  const RingCut cut(count, n);
  char* buf = static_cast<char*>(recvbuf);
  for (int s = 0; s < n - 1; ++s) {
    const int send_seg = ((rank_ + 1 - s) % n + n) % n;
    const int recv_seg = ((rank_ - s) % n + n) % n;
    Exchange(buf + cut.offset(send_seg) * es, static_cast<int>(cut.length(send_seg)), right,
             buf + cut.offset(recv_seg) * es, static_cast<int>(cut.length(recv_seg)), left, type, 1, comm_,
             "MPI exchange (ring allgather)");
  }
}

void MpiCollectives::Allgatherv(const void* sendbuf, int64_t send_bytes, void* recvbuf,
                                const std::vector<int64_t>& recv_bytes) {
  std::vector<int> displs;
  std::vector<int> counts = ToIntCounts(recv_bytes, &displs);
  Check(MPI_Allgatherv(send_bytes ? sendbuf : recvbuf, static_cast<int>(send_bytes), MPI_BYTE, recvbuf,
                       counts.data(), displs.data(), MPI_BYTE, comm_), "Allgatherv");
}

void MpiCollectives::AllgathervInPlace(void* recvbuf, const std::vector<int64_t>& recv_bytes,
                                       const std::vector<int64_t>& displs) {
  std::vector<int> counts(recv_bytes.size()), at(displs.size());
  for (size_t i = 0; i < recv_bytes.size(); ++i) {
    if (recv_bytes[i] > INT_MAX || displs[i] > INT_MAX || displs[i] + recv_bytes[i] > INT_MAX)
      throw std::runtime_error("hvdlite: a single allgather above 2 GiB is not supported");
    counts[i] = static_cast<int>(recv_bytes[i]);
    at[i] = static_cast<int>(displs[i]);
  }
  Check(MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_BYTE, recvbuf, counts.data(), at.data(), MPI_BYTE, comm_),
        "Allgatherv");
}

void MpiCollectives::Reduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op,
                            int root) {
  const int64_t es = DataTypeSize(dt);
  for (int64_t off = 0; off < count; off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, count - off));
    const char* s = static_cast<const char*>(sendbuf) + off * es;
    char* r = static_cast<char*>(recvbuf) + off * es;
    const bool in_place = rank_ == root && sendbuf == recvbuf;
    Check(MPI_Reduce(in_place ? MPI_IN_PLACE : s, r, n, MpiType(dt), MpiOp(op, dt), root, comm_), "Reduce");
  }
}

void MpiCollectives::Broadcast(void* buf, int64_t bytes, int root) {
  for (int64_t off = 0; off < bytes; off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, bytes - off));
    Check(MPI_Bcast(static_cast<char*>(buf) + off, n, MPI_BYTE, root, comm_), "Bcast");
  }
}

void MpiCollectives::Alltoallv(const void* sendbuf, const std::vector<int64_t>& send_bytes, void* recvbuf,
                               const std::vector<int64_t>& recv_bytes) {
  std::vector<int> sdispls, rdispls;
  std::vector<int> scounts = ToIntCounts(send_bytes, &sdispls);
  std::vector<int> rcounts = ToIntCounts(recv_bytes, &rdispls);
  Check(MPI_Alltoallv(sendbuf, scounts.data(), sdispls.data(), MPI_BYTE, recvbuf, rcounts.data(),
                      rdispls.data(), MPI_BYTE, comm_), "Alltoallv");
}

void MpiCollectives::ReduceScatter(const void* sendbuf, void* recvbuf, const std::vector<int64_t>& recv_counts,
                                   DataType dt, ReduceOp op) {
  std::vector<int> counts(recv_counts.size());
  int64_t total = 0;
  for (size_t i = 0; i < recv_counts.size(); ++i) {
    total += recv_counts[i];
    counts[i] = static_cast<int>(recv_counts[i]);
  }
  if (total > INT_MAX) throw std::runtime_error("hvdlite: a single reducescatter above 2^31 elements is not supported");
  Check(MPI_Reduce_scatter(sendbuf, recvbuf, counts.data(), MpiType(dt), MpiOp(op, dt), comm_), "Reduce_scatter");
}

void MpiCollectives::Barrier() { Check(MPI_Barrier(comm_), "Barrier"); }

}  // namespace hvdlite
