// Element-wise helpers the data plane needs on host memory: MPI datatypes and reduce
// ops for every element type (float16/bfloat16, and 8-bit integer sums, through
// user-defined MPI ops), and scaling by a factor (prescale, postscale, Average).
#pragma once

#include <mpi.h>

#include <cstdint>

#include "common.h"

namespace hvdlite {

// Creates the MPI handles for float16/bfloat16 and our own ops (call once after
// MPI_Init) and frees them (before MPI_Finalize).
void InitReduceOps();
void FreeReduceOps();

MPI_Datatype MpiType(DataType dt);
MPI_Op MpiOp(ReduceOp op, DataType dt);  // Average maps to Sum; scaling is separate

// buf[i] *= factor, in the element type (integers truncate toward zero).
void ScaleBuffer(void* buf, int64_t count, DataType dt, double factor);
// dst[i] = src[i] * factor.
void ScaleCopy(void* dst, const void* src, int64_t count, DataType dt, double factor);
// dst[i] = (a[i] op b[i]) * factor, in one pass (factor 1: no scaling; Average reduces
// as Sum). dst may be a; otherwise no two of the buffers overlap. Integers wrap around.
// float16/bfloat16 are combined in float and rounded, then scaled and rounded again, so
// a scaled reduction equals the reduction followed by ScaleBuffer. The data plane's own
// reduction (MpiCollectives' ring allreduce, and the user ops MpiOp hands MPI).
void ReduceScaled(void* dst, const void* a, const void* b, int64_t count, DataType dt, ReduceOp op,
                  double factor);

}  // namespace hvdlite
