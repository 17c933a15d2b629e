// Host reduction kernels (kernels/reduce.h), against plain loops and hand-checked bit
// patterns of float16 / bfloat16 (the values NumPy's float16 gives).
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "check.h"
#include "kernels/reduce.h"

using namespace hvdlite;

namespace {

template <typename T>
std::vector<T> Reduce(const std::vector<T>& a, const std::vector<T>& b, DataType dt, ReduceOp op, double f) {
  std::vector<T> out(a.size());
  ReduceScaled(out.data(), a.data(), b.data(), static_cast<int64_t>(a.size()), dt, op, f);
  return out;
}

// A deterministic mix of values, negative ones included.
template <typename T>
std::vector<T> Values(int n, int seed) {
  std::vector<T> v;
  uint32_t x = 2463534242u + static_cast<uint32_t>(seed);
  for (int i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    v.push_back(static_cast<T>(static_cast<int32_t>(x % 2001) - 1000) / static_cast<T>(7));
  }
  return v;
}

}  // namespace

TEST(kernels_int8_sum_wraps_around) {
  std::vector<int8_t> a = {100, -100, 127, 5}, b = {100, -100, 1, -7};
  CHECK_EQ(Reduce(a, b, DataType::kInt8, ReduceOp::kSum, 1.0), (std::vector<int8_t>{-56, 56, -128, -2}));
  // Scaled after wrapping, truncated toward zero.
  CHECK_EQ(Reduce(a, b, DataType::kInt8, ReduceOp::kSum, 0.5), (std::vector<int8_t>{-28, 28, -64, -1}));
  std::vector<uint8_t> ua = {200, 255}, ub = {100, 1};
  CHECK_EQ(Reduce(ua, ub, DataType::kUInt8, ReduceOp::kSum, 1.0), (std::vector<uint8_t>{44, 0}));
}

TEST(kernels_int8_product_wraps_around) {
  std::vector<int8_t> a = {16, 12, -128, -3}, b = {16, 11, -1, 5};
  CHECK_EQ(Reduce(a, b, DataType::kInt8, ReduceOp::kProduct, 1.0), (std::vector<int8_t>{0, -124, -128, -15}));
}

TEST(kernels_int32_average_truncates_toward_zero) {
  std::vector<int32_t> a = {3, -3, 1000000}, b = {4, -4, 1};
  CHECK_EQ(Reduce(a, b, DataType::kInt32, ReduceOp::kAverage, 0.5), (std::vector<int32_t>{3, -3, 500000}));
}

TEST(kernels_min_max_product_float_and_int) {
  std::vector<float> a = {1.5f, -2.0f, 3.0f, -0.5f}, b = {-1.0f, 4.0f, 3.0f, -0.25f};
  CHECK_EQ(Reduce(a, b, DataType::kFloat32, ReduceOp::kMin, 1.0), (std::vector<float>{-1.0f, -2.0f, 3.0f, -0.5f}));
  CHECK_EQ(Reduce(a, b, DataType::kFloat32, ReduceOp::kMax, 1.0), (std::vector<float>{1.5f, 4.0f, 3.0f, -0.25f}));
  CHECK_EQ(Reduce(a, b, DataType::kFloat32, ReduceOp::kProduct, 1.0),
           (std::vector<float>{-1.5f, -8.0f, 9.0f, 0.125f}));
  CHECK_EQ(Reduce(a, b, DataType::kFloat32, ReduceOp::kMax, 2.0), (std::vector<float>{3.0f, 8.0f, 6.0f, -0.5f}));
  std::vector<int64_t> ia = {-5, 7, INT64_MAX}, ib = {3, -9, INT64_MIN};
  CHECK_EQ(Reduce(ia, ib, DataType::kInt64, ReduceOp::kMin, 1.0), (std::vector<int64_t>{-5, -9, INT64_MIN}));
  CHECK_EQ(Reduce(ia, ib, DataType::kInt64, ReduceOp::kMax, 1.0), (std::vector<int64_t>{3, 7, INT64_MAX}));
  std::vector<int32_t> pa = {-5, 7, 0}, pb = {3, -9, 12};
  CHECK_EQ(Reduce(pa, pb, DataType::kInt32, ReduceOp::kProduct, 1.0), (std::vector<int32_t>{-15, -63, 0}));
}

TEST(kernels_long_buffers_match_plain_loops) {
  // Lengths that are not a multiple of any vector width, in place and not.
  for (int n : {1, 7, 1003}) {
    std::vector<double> a = Values<double>(n, 1), b = Values<double>(n, 2);
    std::vector<double> sum = Reduce(a, b, DataType::kFloat64, ReduceOp::kSum, 0.25);
    std::vector<double> mx = Reduce(a, b, DataType::kFloat64, ReduceOp::kMax, 1.0);
    std::vector<double> in_place = a;
    ReduceScaled(in_place.data(), in_place.data(), b.data(), n, DataType::kFloat64, ReduceOp::kProduct, 1.0);
    int bad = 0;
    for (int i = 0; i < n; ++i) {
      bad += sum[i] != (a[i] + b[i]) * 0.25;
      bad += mx[i] != (a[i] < b[i] ? b[i] : a[i]);
      bad += in_place[i] != a[i] * b[i];
    }
    CHECK_EQ(bad, 0);
    std::vector<float> fa = Values<float>(n, 3), fb = Values<float>(n, 4);
    std::vector<float> fmin = Reduce(fa, fb, DataType::kFloat32, ReduceOp::kMin, 1.0);
    bad = 0;
    for (int i = 0; i < n; ++i) bad += fmin[i] != (fb[i] < fa[i] ? fb[i] : fa[i]);
    CHECK_EQ(bad, 0);
  }
}

TEST(kernels_float16_rounds_then_scales) {
  // 2048 + 1 = 2049 rounds to 2048 in float16 (ties to even), then * 0.75 = 1536 (0x6600).
  // Scaling before rounding would give 1536.75 -> 1537 (0x6601).
  std::vector<uint16_t> a = {0x6800}, b = {0x3C00};
  CHECK_EQ(Reduce(a, b, DataType::kFloat16, ReduceOp::kSum, 0.75), std::vector<uint16_t>{0x6600});
  CHECK_EQ(Reduce(a, b, DataType::kFloat16, ReduceOp::kSum, 1.0), std::vector<uint16_t>{0x6800});
  // 60000 + 10000 overflows to infinity, and stays infinite when halved.
  std::vector<uint16_t> big_a = {0x7B53}, big_b = {0x70E2};
  CHECK_EQ(Reduce(big_a, big_b, DataType::kFloat16, ReduceOp::kSum, 0.5), std::vector<uint16_t>{0x7C00});
  // Max of 1 and 2048, scaled.
  CHECK_EQ(Reduce(a, b, DataType::kFloat16, ReduceOp::kMax, 0.5), std::vector<uint16_t>{0x6400});
}

TEST(kernels_bfloat16_rounds_to_nearest) {
  // 1 + 3 * 2^-9 is nearer to 1 + 2^-7 (0x3F81) than to 1 (0x3F80).
  std::vector<uint16_t> a = {0x3F80, 0x3F80}, b = {0x3BC0, 0x3F80};
  CHECK_EQ(Reduce(a, b, DataType::kBFloat16, ReduceOp::kSum, 1.0), (std::vector<uint16_t>{0x3F81, 0x4000}));
}

TEST(kernels_scale_copy_and_scale_buffer) {
  std::vector<uint16_t> h = {0x6801}, out(1);  // float16 2050 * 0.5 = 1025 (0x6401)
  ScaleCopy(out.data(), h.data(), 1, DataType::kFloat16, 0.5);
  CHECK_EQ(out, std::vector<uint16_t>{0x6401});
  CHECK_EQ(h, std::vector<uint16_t>{0x6801});  // the source is left alone
  std::vector<int8_t> i8 = {7, -7, 100};
  ScaleBuffer(i8.data(), 3, DataType::kInt8, 0.5);
  CHECK_EQ(i8, (std::vector<int8_t>{3, -3, 50}));
  std::vector<int32_t> i32 = {5, -5};
  ScaleBuffer(i32.data(), 2, DataType::kInt32, 1.0);  // factor 1: untouched
  CHECK_EQ(i32, (std::vector<int32_t>{5, -5}));
  std::vector<double> d = {1.5, -3.0}, dout(2);
  ScaleCopy(dout.data(), d.data(), 2, DataType::kFloat64, -2.0);
  CHECK_EQ(dout, (std::vector<double>{-3.0, 6.0}));
}

TEST(kernels_unsupported_op_throws) {
  std::vector<float> a = {1.0f}, b = {2.0f}, out(1);
  CHECK_THROWS(ReduceScaled(out.data(), a.data(), b.data(), 1, DataType::kFloat32, ReduceOp::kAdasum, 1.0),
               std::runtime_error, "reduce op Adasum is not supported");
}
