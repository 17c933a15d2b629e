#include "kernels/reduce.h"

#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/half.h"

namespace hvdlite {
namespace {

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

// The reduction loops below are inlined into ReduceScaled, which is compiled for
// several instruction sets; the best one the CPU has is picked when the library loads.
// The extension is built for any x86-64, whose vectors are SSE2's, a quarter of
// AVX-512's, and the ring's reduction must keep up with MPI's own.
#define HVDLITE_INLINE inline __attribute__((always_inline))
#if defined(__x86_64__) && defined(__GLIBC__) && \
    (defined(__clang__) ? __clang_major__ >= 14 : __GNUC__ >= 8)
#define HVDLITE_MULTIVERSION __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HVDLITE_MULTIVERSION
#endif

// One element of a reduction, in the type it is computed in.
template <typename C>
HVDLITE_INLINE C Combine(C a, C b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return b < a ? b : a;
    case ReduceOp::kMax: return a < b ? b : a;
    case ReduceOp::kProduct: return static_cast<C>(a * b);
    default: return static_cast<C>(a + b);  // Sum, Average
  }
}

// One result element. Integers wrap as MPI's do; a factor scales them in double and
// truncates, as ScaleT does.
template <typename T, ReduceOp Op, bool Scaled>
HVDLITE_INLINE T ReduceOne(T a, T b, T tf, double f) {
  const T r = Combine<T>(a, b, Op);
  if constexpr (!Scaled) return r;
  else if constexpr (std::is_floating_point_v<T>) return r * tf;
  else return static_cast<T>(static_cast<double>(r) * f);
}

// Two loops, so that neither has to allow for overlapping buffers (which keeps the
// compiler from vectorizing): dst op= b, and dst = a op b.
template <typename T, ReduceOp Op, bool Scaled>
HVDLITE_INLINE void ReduceLoop(T* __restrict dst, const T* __restrict b, int64_t n, double f) {
  const T tf = static_cast<T>(f);
  for (int64_t i = 0; i < n; ++i) dst[i] = ReduceOne<T, Op, Scaled>(dst[i], b[i], tf, f);
}

template <typename T, ReduceOp Op, bool Scaled>
HVDLITE_INLINE void ReduceLoop(T* __restrict dst, const T* __restrict a, const T* __restrict b, int64_t n,
                               double f) {
  const T tf = static_cast<T>(f);
  for (int64_t i = 0; i < n; ++i) dst[i] = ReduceOne<T, Op, Scaled>(a[i], b[i], tf, f);
}

// The loops are instantiated per type, op and scaling, so that each one vectorizes.
template <typename T, ReduceOp Op>
HVDLITE_INLINE void ReduceScaledT(T* dst, const T* a, const T* b, int64_t n, double f) {
  if (dst == a) {
    if (f == 1.0) ReduceLoop<T, Op, false>(dst, b, n, f);
    else ReduceLoop<T, Op, true>(dst, b, n, f);
  } else {
    if (f == 1.0) ReduceLoop<T, Op, false>(dst, a, b, n, f);
    else ReduceLoop<T, Op, true>(dst, a, b, n, f);
  }
}

// 16-bit floats: combined in float and rounded to the type, as MPI's reduction of them
// is; a factor then scales that rounded result, so that a scaled reduction (the ring's
// last step of an Average) gives what the reduction followed by ScaleBuffer gives,
// overflow to infinity included.
template <float (*ToF)(uint16_t), uint16_t (*FromF)(float), ReduceOp Op>
HVDLITE_INLINE void ReduceScaled16(uint16_t* dst, const uint16_t* a, const uint16_t* b, int64_t n, double f) {
  if (f == 1.0) {
    for (int64_t i = 0; i < n; ++i) dst[i] = FromF(Combine<float>(ToF(a[i]), ToF(b[i]), Op));
    return;
  }
  const float ff = static_cast<float>(f);
  for (int64_t i = 0; i < n; ++i) dst[i] = FromF(ToF(FromF(Combine<float>(ToF(a[i]), ToF(b[i]), Op))) * ff);
}

template <ReduceOp Op>
HVDLITE_INLINE void ReduceScaledOp(void* dst, const void* a, const void* b, int64_t n, DataType dt, double f) {
  switch (dt) {
#define HVDLITE_REDUCE_CASE(code, T) \
    case DataType::code: \
      return ReduceScaledT<T, Op>(static_cast<T*>(dst), static_cast<const T*>(a), static_cast<const T*>(b), n, f);
    HVDLITE_REDUCE_CASE(kUInt8, uint8_t)
    HVDLITE_REDUCE_CASE(kInt8, int8_t)
    HVDLITE_REDUCE_CASE(kInt32, int32_t)
    HVDLITE_REDUCE_CASE(kInt64, int64_t)
    HVDLITE_REDUCE_CASE(kFloat32, float)
    HVDLITE_REDUCE_CASE(kFloat64, double)
#undef HVDLITE_REDUCE_CASE
    case DataType::kFloat16:
      return ReduceScaled16<HalfToFloat, FloatToHalf, Op>(static_cast<uint16_t*>(dst),
          static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n, f);
    case DataType::kBFloat16:
      return ReduceScaled16<BFloat16ToFloat, FloatToBFloat16, Op>(static_cast<uint16_t*>(dst),
          static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n, f);
  }
  throw std::runtime_error("hvdlite: unknown data type");
}

}  // namespace

HVDLITE_MULTIVERSION
void ReduceScaled(void* dst, const void* a, const void* b, int64_t n, DataType dt, ReduceOp op, double f) {
  switch (op) {
    case ReduceOp::kAverage:
    case ReduceOp::kSum: return ReduceScaledOp<ReduceOp::kSum>(dst, a, b, n, dt, f);
    case ReduceOp::kMin: return ReduceScaledOp<ReduceOp::kMin>(dst, a, b, n, dt, f);
    case ReduceOp::kMax: return ReduceScaledOp<ReduceOp::kMax>(dst, a, b, n, dt, f);
    case ReduceOp::kProduct: return ReduceScaledOp<ReduceOp::kProduct>(dst, a, b, n, dt, f);
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
