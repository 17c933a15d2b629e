// MPI datatypes and reduce ops for every element type: float16/bfloat16, and 8-bit
// integer sums, through user-defined MPI ops that run hvdlite's own kernels
// (kernels/reduce.h).
#pragma once

#include <mpi.h>

#include <cstdint>

#include "common/common.h"
#include "kernels/reduce.h"

namespace hvdlite {

// Creates the MPI handles for float16/bfloat16 and our own ops (call once after
// MPI_Init) and frees them (before MPI_Finalize).
void InitReduceOps();
void FreeReduceOps();

MPI_Datatype MpiType(DataType dt);
MPI_Op MpiOp(ReduceOp op, DataType dt);  // Average maps to Sum; scaling is separate

}  // namespace hvdlite
