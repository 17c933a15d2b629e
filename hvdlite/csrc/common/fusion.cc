#include "common/fusion.h"

namespace hvdlite {

const char* DeviceKindName(DeviceKind kind) { return kind == DeviceKind::kHost ? "host" : "CUDA"; }

std::string DeviceLabel(int32_t device) {
  return device == kCpuDevice ? std::string("host memory") : "GPU " + std::to_string(device);
}

}  // namespace hvdlite
