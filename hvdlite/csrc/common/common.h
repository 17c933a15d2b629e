// Types shared by every part of the engine: element types, reduce ops, request kinds,
// and the raw description of a tensor as the framework adapters hand it over.
#pragma once

#include <time.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace hvdlite {

enum class DataType : int32_t {
  kUInt8 = 0, kInt8 = 1, kInt32 = 2, kInt64 = 3,
  kFloat16 = 4, kBFloat16 = 5, kFloat32 = 6, kFloat64 = 7,
};
constexpr int kNumDataTypes = 8;

enum class ReduceOp : int32_t {
  kAverage = 0, kSum = 1, kAdasum = 2, kMin = 3, kMax = 4, kProduct = 5,
};

enum class RequestType : int32_t {
  kAllreduce = 0, kAllgather = 1, kBroadcast = 2, kAlltoall = 3,
  kReducescatter = 4, kBarrier = 5, kJoin = 6,
};
constexpr int kNumRequestTypes = 7;

int64_t DataTypeSize(DataType dt);
const char* DataTypeName(DataType dt);
const char* ReduceOpName(ReduceOp op);
// What a sum over `size` ranks is scaled by after the reduction: `postscale`, and
// Average's 1/size (ranks that joined count as zeros, as in Horovod).
inline double PostFactor(double postscale, ReduceOp op, int size) {
  return postscale * (op == ReduceOp::kAverage ? 1.0 / size : 1.0);
}
const char* RequestTypeName(RequestType t);
// "allreduce 'name'": how messages name a request.
std::string RequestLabel(RequestType t, const std::string& name);
bool ValidDataType(int32_t code);
// Names the front ends generate for unnamed one-off calls ("allreduce.noname.7",
// hvdlite.common.ops.auto_name) contain ".noname."; they never repeat, so the response
// cache does not spend its capacity on them.
inline bool IsOneOffName(const std::string& name) { return name.find(".noname.") != std::string::npos; }
std::string ShapeString(const std::vector<int64_t>& shape);
int64_t NumElements(const std::vector<int64_t>& shape);
// Elements in one row (everything after the first dimension) of a tensor of `shape`.
int64_t RowElements(const std::vector<int64_t>& shape);

using Clock = std::chrono::steady_clock;
inline int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             Clock::now().time_since_epoch()).count();
}
// NowMicros as of the kernel's last clock tick (a few milliseconds ago at most), read
// in a few nanoseconds instead of about twenty: for times that only stall checks,
// counted in seconds, compare.
inline int64_t CoarseNowMicros() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
}

constexpr int kCpuDevice = -1;

}  // namespace hvdlite
