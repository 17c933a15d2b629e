// Adasum, the adaptive summation of Maleki et al. ("Scaling Distributed Training with
// Adaptive Summation", MLSys 2021), as Horovod's op=Adasum defines it: two gradients
// a and b combine into
//     (1 - a.b / (2 |a|^2)) a  +  (1 - a.b / (2 |b|^2)) b
// (their sum when orthogonal, their average when equal), with the dot products taken
// over the whole tensor. Ranks combine pairwise by recursive vector halving with
// distance doubling: at level k each rank exchanges half of the piece it holds with the
// rank 2^k away and combines its half of the two; the dot products of the level are
// summed over the 2^(k+1) ranks whose pieces make up the two vectors. After log2(n)
// levels each rank holds 1/n of the result, and the pieces travel back the same way.
// Needs a power-of-2 number of ranks (the coordinator refuses others).
#pragma once
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "common/common.h"

namespace hvdlite {

class AdasumAllreduce {
 public:
  explicit AdasumAllreduce(MPI_Comm comm);  // comm: the world of the ranks (not owned)
  ~AdasumAllreduce();
  AdasumAllreduce(const AdasumAllreduce&) = delete;
  AdasumAllreduce& operator=(const AdasumAllreduce&) = delete;

  // Replaces `count` elements of `data` (float16, float32 or float64) with the Adasum
  // of every rank's. Collective over the world.
  void Run(void* data, int64_t count, DataType dt);

  static bool Supports(DataType dt) {
    return dt == DataType::kFloat16 || dt == DataType::kFloat32 || dt == DataType::kFloat64;
  }

 private:
  template <typename T>
  void RunTyped(T* data, int64_t count);
  // The communicator of the 2^(level+1) ranks that share a block at `level` (made on
  // first use; every rank reaches each level of its first Adasum together).
  MPI_Comm LevelComm(int level);

  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<MPI_Comm> levels_;
  std::vector<uint8_t> scratch_;
};

}  // namespace hvdlite
