// Kinds of device memory, and what may be fused for tensors in each: plain data that
// the backends declare (Backend::Fusion), the registry caps by the fusion threshold,
// and the negotiation (the coordinator's rounds, the cache cycles) obeys.
#pragma once

#include <cstdint>
#include <string>

#include "common/common.h"

namespace hvdlite {

// The kinds of memory a tensor can live in. A request's `device` is kCpuDevice (-1) for
// host memory, else the index of a CUDA device.
enum class DeviceKind : int { kHost = 0, kCuda = 1 };
constexpr int kNumDeviceKinds = 2;
inline DeviceKind KindOfDevice(int32_t device) { return device == kCpuDevice ? DeviceKind::kHost : DeviceKind::kCuda; }
const char* DeviceKindName(DeviceKind kind);
// "host memory" or "GPU 3": how messages name where a tensor is.
std::string DeviceLabel(int32_t device);

// What a backend wants from the coordinator's fusion: fused allreduces up to
// `allreduce_bytes`; allgathers whose gathered bytes (all ranks) are below
// `allgather_tensor_bytes` fused up to `allgather_bytes` in all; reducescatters
// reduced and scaled alike fused up to `reducescatter_bytes` (0: a backend that runs
// them one by one). The coordinator never fuses beyond the user's fusion threshold.
struct FusionLimits {
  int64_t allreduce_bytes = 0;
  int64_t allgather_tensor_bytes = 0;
  int64_t allgather_bytes = 0;
  int64_t reducescatter_bytes = 0;
};

}  // namespace hvdlite
