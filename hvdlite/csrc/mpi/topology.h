// Who is where: hvdlite's world, its ranks on this host (local) and the ranks with the
// same local rank on every host (cross), as MPI communicators made once per engine.
// The engine's data plane and the backends run on these; the control plane has its
// own channel (transport/mpi/control_channel.h).
#pragma once

#include <mpi.h>

#include <string>
#include <vector>

namespace hvdlite {

class Topology {
 public:
  // Collective over `base`: duplicates it for the data plane and splits the duplicate
  // by host (MPI_COMM_TYPE_SHARED) and by local rank.
  explicit Topology(MPI_Comm base);
  ~Topology();
  Topology(const Topology&) = delete;
  Topology& operator=(const Topology&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int cross_rank() const { return cross_rank_; }
  int cross_size() const { return cross_size_; }
  // Every host runs the same number of ranks.
  bool homogeneous() const { return homogeneous_; }
  // The host name of every rank, by rank.
  const std::vector<std::string>& hosts() const { return hosts_; }

  MPI_Comm world() const { return world_; }  // errors are returned, not fatal
  // After a peer failed: every call on these communicators fails on every rank.
  void Revoke();
  MPI_Comm local() const { return local_; }
  MPI_Comm cross() const { return cross_; }

 private:
  MPI_Comm world_ = MPI_COMM_NULL;
  MPI_Comm local_ = MPI_COMM_NULL;
  MPI_Comm cross_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1, local_rank_ = 0, local_size_ = 1, cross_rank_ = 0, cross_size_ = 1;
  bool homogeneous_ = true;
  std::vector<std::string> hosts_;
};

}  // namespace hvdlite
