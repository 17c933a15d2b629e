// The element-wise kernels on host memory that every part of the data plane shares:
// scaling by a factor (prescale, postscale, Average) and reducing two buffers into a
// third. The MPI backend's ring and its user-defined MPI ops, the cycle's carried
// tensors and the engine's completion of them all use these, so they agree bit for bit.
#pragma once

#include <cstdint>

#include "common/common.h"

namespace hvdlite {

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
