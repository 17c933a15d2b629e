#include "backends/mpi/reduce_ops.h"

#include <cstring>
#include <stdexcept>

#include "kernels/reduce.h"

namespace hvdlite {
namespace {

MPI_Datatype g_f16 = MPI_DATATYPE_NULL;
MPI_Datatype g_bf16 = MPI_DATATYPE_NULL;
MPI_Op g_own_ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // sum min max prod
bool g_ready = false;

// The element type behind an MPI datatype that one of our own ops is given.
DataType OwnOpType(MPI_Datatype dt) {
  if (dt == g_bf16) return DataType::kBFloat16;
  if (dt == g_f16) return DataType::kFloat16;
  if (dt == MPI_INT8_T) return DataType::kInt8;
  return DataType::kUInt8;
}

// MPI's user op for the types whose reduction MPI cannot be given, or trusted with:
// inout[i] = inout[i] op in[i], by the same kernel as the ring's reduction.
// float16/bfloat16 are no MPI types at all (combined in float, then rounded). 8-bit
// integer sums must wrap around as NumPy's, the frameworks' and every other type's do,
// but Open MPI's vectorized ops (its op/avx component, taken on any CPU with SSE4.1
// and up) add 8-bit integers with saturating instructions in blocks of 16 and more
// elements, and wrap only in the leftover tail.
template <ReduceOp Op>
void OwnOp(void* in, void* inout, int* len, MPI_Datatype* dt) {
  ReduceScaled(inout, inout, in, *len, OwnOpType(*dt), Op, 1.0);
}

}  // namespace

void InitReduceOps() {
  if (g_ready) return;
  MPI_Type_contiguous(2, MPI_BYTE, &g_f16);
  MPI_Type_commit(&g_f16);
  MPI_Type_contiguous(2, MPI_BYTE, &g_bf16);
  MPI_Type_commit(&g_bf16);
  MPI_Op_create(reinterpret_cast<MPI_User_function*>(&OwnOp<ReduceOp::kSum>), 1, &g_own_ops[0]);
  MPI_Op_create(reinterpret_cast<MPI_User_function*>(&OwnOp<ReduceOp::kMin>), 1, &g_own_ops[1]);
  MPI_Op_create(reinterpret_cast<MPI_User_function*>(&OwnOp<ReduceOp::kMax>), 1, &g_own_ops[2]);
  MPI_Op_create(reinterpret_cast<MPI_User_function*>(&OwnOp<ReduceOp::kProduct>), 1, &g_own_ops[3]);
  g_ready = true;
}

void FreeReduceOps() {
  if (!g_ready) return;
  MPI_Type_free(&g_f16);
  MPI_Type_free(&g_bf16);
  for (auto& op : g_own_ops) MPI_Op_free(&op);
  g_ready = false;
}

MPI_Datatype MpiType(DataType dt) {
  switch (dt) {
    case DataType::kUInt8: return MPI_UINT8_T;
    case DataType::kInt8: return MPI_INT8_T;
    case DataType::kInt32: return MPI_INT32_T;
    case DataType::kInt64: return MPI_INT64_T;
    case DataType::kFloat16: return g_f16;
    case DataType::kBFloat16: return g_bf16;
    case DataType::kFloat32: return MPI_FLOAT;
    case DataType::kFloat64: return MPI_DOUBLE;
  }
  throw std::runtime_error("hvdlite: unknown data type");
}

MPI_Op MpiOp(ReduceOp op, DataType dt) {
  const bool half = dt == DataType::kFloat16 || dt == DataType::kBFloat16;
  const bool byte = dt == DataType::kInt8 || dt == DataType::kUInt8;
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: return half || byte ? g_own_ops[0] : MPI_SUM;
    case ReduceOp::kMin: return half ? g_own_ops[1] : MPI_MIN;
    case ReduceOp::kMax: return half ? g_own_ops[2] : MPI_MAX;
    case ReduceOp::kProduct: return half ? g_own_ops[3] : MPI_PROD;
    default: break;
  }
  throw std::runtime_error(std::string("hvdlite: reduce op ") + ReduceOpName(op) + " is not supported");
}

}  // namespace hvdlite
