#include "backends/backend.h"

#include "timeline.h"

namespace hvdlite {

const char* DeviceKindName(DeviceKind kind) { return kind == DeviceKind::kHost ? "host" : "CUDA"; }

std::string DeviceLabel(int32_t device) {
  return device == kCpuDevice ? std::string("host memory") : "GPU " + std::to_string(device);
}

bool Tracer::Active() const { return timeline_ && timeline_->Active(); }

void Tracer::Phase(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us) const {
  if (timeline_) timeline_->Phase(tensor, phase, start_us, end_us);
}

}  // namespace hvdlite
