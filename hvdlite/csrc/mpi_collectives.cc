#include "mpi_collectives.h"

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "reduce_ops.h"

namespace hvdlite {
namespace {

void Check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw std::runtime_error(std::string("MPI_") + what + " failed: " + std::string(msg, len));
  }
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

}  // namespace

MpiCollectives::MpiCollectives(MPI_Comm comm) : comm_(comm) { MPI_Comm_size(comm, &size_); }

void MpiCollectives::Allreduce(const void* sendbuf, void* recvbuf, int64_t count, DataType dt, ReduceOp op) {
  const MPI_Datatype t = MpiType(dt);
  const MPI_Op o = MpiOp(op, dt);
  const int64_t esize = DataTypeSize(dt);
  for (int64_t off = 0; off < count; off += kMaxCount) {
    const int n = static_cast<int>(std::min(kMaxCount, count - off));
    char* r = static_cast<char*>(recvbuf) + off * esize;
    const void* s = sendbuf == recvbuf ? MPI_IN_PLACE : static_cast<const char*>(sendbuf) + off * esize;
    Check(MPI_Allreduce(s, r, n, t, o, comm_), "Allreduce");
  }
}

void MpiCollectives::Allgatherv(const void* sendbuf, int64_t send_bytes, void* recvbuf,
                                const std::vector<int64_t>& recv_bytes) {
  std::vector<int> displs;
  std::vector<int> counts = ToIntCounts(recv_bytes, &displs);
  Check(MPI_Allgatherv(send_bytes ? sendbuf : recvbuf, static_cast<int>(send_bytes), MPI_BYTE, recvbuf,
                       counts.data(), displs.data(), MPI_BYTE, comm_), "Allgatherv");
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
