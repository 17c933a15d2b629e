#include "mpi/topology.h"

#include <unistd.h>

#include <cstring>

#include <initializer_list>
#include <string>
#include <vector>

#include "mpi/errors.h"

namespace hvdlite {

Topology::Topology(MPI_Comm base) {
  CheckMpi(MPI_Comm_dup(base, &world_), "MPI_Comm_dup (world)");
  MPI_Comm_set_errhandler(world_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(world_, &rank_);
  MPI_Comm_size(world_, &size_);
  CheckMpi(MPI_Comm_split_type(world_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &local_),
           "MPI_Comm_split_type (hosts)");
  MPI_Comm_rank(local_, &local_rank_);
  MPI_Comm_size(local_, &local_size_);
  CheckMpi(MPI_Comm_split(world_, local_rank_, rank_, &cross_), "MPI_Comm_split (cross)");
  MPI_Comm_rank(cross_, &cross_rank_);
  MPI_Comm_size(cross_, &cross_size_);
  int sizes[2] = {local_size_, -local_size_};
  CheckMpi(MPI_Allreduce(MPI_IN_PLACE, sizes, 2, MPI_INT, MPI_MAX, world_), "MPI_Allreduce (topology)");
  homogeneous_ = sizes[0] == -sizes[1];
  // Every rank's host name, for messages that name a rank (a stall, a lost peer).
  constexpr int kName = 256;
  char name[kName] = {};
  gethostname(name, kName - 1);
  std::vector<char> all(static_cast<size_t>(kName) * static_cast<size_t>(size_));
  CheckMpi(MPI_Allgather(name, kName, MPI_CHAR, all.data(), kName, MPI_CHAR, world_), "MPI_Allgather (host names)");
  hosts_.reserve(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    const char* n = all.data() + static_cast<size_t>(r) * kName;
    hosts_.emplace_back(n, strnlen(n, kName - 1));
  }
}

void Topology::Revoke() {
  for (MPI_Comm c : {cross_, local_, world_}) hvdlite::Revoke(c);
}

Topology::~Topology() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;  // a waiting thread outlived MPI itself; nothing left to free
  for (MPI_Comm* c : {&cross_, &local_, &world_}) FreeCommunicator(c);
}

}  // namespace hvdlite
