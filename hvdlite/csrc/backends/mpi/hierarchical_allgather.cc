#include "backends/mpi/hierarchical_allgather.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "mpi/errors.h"

namespace hvdlite {
namespace {

// Piece `l` of `parts` of a segment of `bytes`: the first bytes % parts pieces are one
// byte longer.
struct Piece {
  Piece(int64_t bytes, int parts, int l)
      : offset(l * (bytes / parts) + std::min<int64_t>(l, bytes % parts)),
        length(bytes / parts + (l < bytes % parts ? 1 : 0)) {}
  int64_t offset, length;
};

}  // namespace

HierarchicalAllgather::HierarchicalAllgather(const Topology& topology, MpiCollectives* local,
                                             MpiCollectives* cross)
    : local_(local), cross_(cross), rank_(topology.rank()), hosts_(topology.cross_size()),
      per_host_(topology.local_size()) {
  // A host's index is its leader's (local rank 0's) rank among the leaders.
  int host = topology.cross_rank();
  CheckMpi(MPI_Bcast(&host, 1, MPI_INT, 0, topology.local()), "MPI_Bcast (host index)");
  my_host_ = host;
  const int size = topology.size();
  std::vector<int> mine = {host, topology.local_rank(), topology.cross_rank()}, all(3 * size);
  CheckMpi(MPI_Allgather(mine.data(), 3, MPI_INT, all.data(), 3, MPI_INT, topology.world()),
           "MPI_Allgather (host layout)");
  host_of_.resize(size);
  local_of_.resize(size);
  cross_host_.assign(hosts_, 0);
  ranks_of_.assign(hosts_, std::vector<int>(per_host_, 0));
  for (int q = 0; q < size; ++q) {
    host_of_[q] = all[3 * q];
    local_of_[q] = all[3 * q + 1];
    ranks_of_[host_of_[q]][local_of_[q]] = q;
    if (local_of_[q] == topology.local_rank()) cross_host_[all[3 * q + 2]] = host_of_[q];
  }
  for (int q = 0; q < size; ++q) world_order_ = world_order_ && q == host_of_[q] * per_host_ + local_of_[q];
}

std::vector<int64_t> HierarchicalAllgather::Offsets(const std::vector<int64_t>& block) const {
  std::vector<int64_t> at(block.size());
  int64_t off = 0;
  for (const std::vector<int>& ranks : ranks_of_)
    for (int q : ranks) {
      at[q] = off;
      off += block[q];
    }
  return at;
}

void HierarchicalAllgather::Run(const void* mine, void* out, const std::vector<int64_t>& block,
                                int64_t chunk) {
  chunk = std::max<int64_t>(chunk, 1);
  const std::vector<int64_t> at = Offsets(block);
  std::vector<int64_t> seg_off(hosts_), seg_bytes(hosts_, 0);
  for (int h = 0; h < hosts_; ++h) {
    seg_off[h] = at[ranks_of_[h][0]];
    for (int q : ranks_of_[h]) seg_bytes[h] += block[q];
  }
  char* buf = static_cast<char*>(out);
  if (mine && block[rank_] > 0) std::memcpy(buf + at[rank_], mine, static_cast<size_t>(block[rank_]));

  std::vector<int64_t> counts(per_host_), displs(per_host_);
  // 1. This host's segment, inside the host.
  for (int l = 0; l < per_host_; ++l) {
    counts[l] = block[ranks_of_[my_host_][l]];
    displs[l] = at[ranks_of_[my_host_][l]];
  }
  if (seg_bytes[my_host_] > 0) local_->AllgathervInPlace(buf, counts, displs);

  // 2. Piece `l` of every host's segment, between hosts, a chunk of each at a time.
  const int l = local_->rank();
  std::vector<int64_t> cross_counts(hosts_), cross_displs(hosts_);
  for (int64_t done = 0;; done += chunk) {
    int64_t moved = 0;
    for (int c = 0; c < hosts_; ++c) {
      const int h = cross_host_[c];
      const Piece p(seg_bytes[h], per_host_, l);
      cross_counts[c] = std::clamp<int64_t>(p.length - done, 0, chunk);
      cross_displs[c] = seg_off[h] + p.offset + std::min(done, p.length);
      moved += cross_counts[c];
    }
    if (moved == 0) break;
    cross_->AllgathervInPlace(buf, cross_counts, cross_displs);
  }

  // 3. The other hosts' segments, piece by piece, inside the host.
  for (int h = 0; h < hosts_; ++h) {
    if (h == my_host_ || seg_bytes[h] == 0) continue;
    for (int k = 0; k < per_host_; ++k) {
      const Piece p(seg_bytes[h], per_host_, k);
      counts[k] = p.length;
      displs[k] = seg_off[h] + p.offset;
    }
    local_->AllgathervInPlace(buf, counts, displs);
  }
}

}  // namespace hvdlite
