#include "reduce_ops.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include "half.h"

namespace hvdlite {
namespace {

MPI_Datatype g_f16 = MPI_DATATYPE_NULL;
MPI_Datatype g_bf16 = MPI_DATATYPE_NULL;
MPI_Op g_half_ops[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};  // sum min max prod
bool g_ready = false;

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), int Kind>
void Combine16(const uint16_t* in, uint16_t* inout, int n) {
  for (int i = 0; i < n; ++i) {
    float a = ToF(in[i]), b = ToF(inout[i]), r;
    if (Kind == 0) r = a + b;
    else if (Kind == 1) r = std::min(a, b);
    else if (Kind == 2) r = std::max(a, b);
    else r = a * b;
    inout[i] = FromF(r);
  }
}

template <int Kind>
void HalfOp(void* in, void* inout, int* len, MPI_Datatype* dt) {
  auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  if (*dt == g_bf16) Combine16<BFloat16ToFloat, FloatToBFloat16, Kind>(a, b, *len);
  else Combine16<HalfToFloat, FloatToHalf, Kind>(a, b, *len);
}

template <typename T>
void ScaleT(T* dst, const T* src, int64_t n, double f) {
  if constexpr (std::is_floating_point_v<T>) {
    const T tf = static_cast<T>(f);
    for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * tf;
  } else {
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(static_cast<double>(src[i]) * f);
  }
}

template <float (*ToF)(uint16_t), uint16_t (*FromF)(float)>
void Scale16(uint16_t* dst, const uint16_t* src, int64_t n, double f) {
  const float ff = static_cast<float>(f);
  for (int64_t i = 0; i < n; ++i) dst[i] = FromF(ToF(src[i]) * ff);
}

}  // namespace

void InitReduceOps() {
  if (g_ready) return;
  MPI_Type_contiguous(2, MPI_BYTE, &g_f16);
  MPI_Type_commit(&g_f16);
  MPI_Type_contiguous(2, MPI_BYTE, &g_bf16);
  MPI_Type_commit(&g_bf16);
  MPI_Op_create(reinterpret_cast<MPI_User_function*>(&HalfOp<0>), 1, &g_half_ops[0]);
  MPI_Op_create(reinterpret_cast<MPI_User_function*>(&HalfOp<1>), 1, &g_half_ops[1]);
  MPI_Op_create(reinterpret_cast<MPI_User_function*>(&HalfOp<2>), 1, &g_half_ops[2]);
  MPI_Op_create(reinterpret_cast<MPI_User_function*>(&HalfOp<3>), 1, &g_half_ops[3]);
  g_ready = true;
}

void FreeReduceOps() {
  if (!g_ready) return;
  MPI_Type_free(&g_f16);
  MPI_Type_free(&g_bf16);
  for (auto& op : g_half_ops) MPI_Op_free(&op);
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
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: return half ? g_half_ops[0] : MPI_SUM;
    case ReduceOp::kMin: return half ? g_half_ops[1] : MPI_MIN;
    case ReduceOp::kMax: return half ? g_half_ops[2] : MPI_MAX;
    case ReduceOp::kProduct: return half ? g_half_ops[3] : MPI_PROD;
    default: break;
  }
  throw std::runtime_error(std::string("hvdlite: reduce op ") + ReduceOpName(op) + " is not supported");
}

void ScaleCopy(void* dst, const void* src, int64_t n, DataType dt, double f) {
  switch (dt) {
    case DataType::kUInt8: ScaleT(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), n, f); break;
    case DataType::kInt8: ScaleT(static_cast<int8_t*>(dst), static_cast<const int8_t*>(src), n, f); break;
    case DataType::kInt32: ScaleT(static_cast<int32_t*>(dst), static_cast<const int32_t*>(src), n, f); break;
    case DataType::kInt64: ScaleT(static_cast<int64_t*>(dst), static_cast<const int64_t*>(src), n, f); break;
    case DataType::kFloat32: ScaleT(static_cast<float*>(dst), static_cast<const float*>(src), n, f); break;
    case DataType::kFloat64: ScaleT(static_cast<double*>(dst), static_cast<const double*>(src), n, f); break;
    case DataType::kFloat16:
      Scale16<HalfToFloat, FloatToHalf>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, f);
      break;
    case DataType::kBFloat16:
      Scale16<BFloat16ToFloat, FloatToBFloat16>(static_cast<uint16_t*>(dst), static_cast<const uint16_t*>(src), n, f);
      break;
  }
}

void ScaleBuffer(void* buf, int64_t n, DataType dt, double f) {
  if (f == 1.0) return;
  ScaleCopy(buf, buf, n, dt, f);
}

}  // namespace hvdlite
