#include "backends/registry.h"

#include <algorithm>

namespace hvdlite {

Backend* BackendRegistry::Add(std::unique_ptr<Backend> backend) {
  backends_.push_back(std::move(backend));
  return backends_.back().get();
}

std::vector<Backend*> BackendRegistry::Candidates(DeviceKind kind, RequestType type) const {
  std::vector<Backend*> out;
  for (const auto& b : backends_)
    if (b->Device() == kind) out.push_back(b.get());
  if (kind == DeviceKind::kCuda) {
    const std::string& preferred = config_->job().gpu_backend[static_cast<int>(type)];
    std::stable_partition(out.begin(), out.end(), [&](Backend* b) { return preferred == b->Name(); });
  }
  return out;
}

Backend* BackendRegistry::Select(const Response& r, std::string* error) const {
  const DeviceKind kind = KindOfDevice(r.device);
  std::string why_not;
  for (Backend* b : Candidates(kind, r.type)) {
    std::string why;
    if (b->Supports(r, &why)) return b;
    why_not += std::string(why_not.empty() ? "" : "; ") + b->Name() + ": " + why;
  }
  *error = RequestLabel(r.type, r.names.empty() ? std::string() : r.names[0]) + ": no backend for " +
           DeviceKindName(kind) + " memory can run it" + (why_not.empty() ? std::string() : " (" + why_not + ")");
  return nullptr;
}

FusionLimits BackendRegistry::Fusion(DeviceKind kind) const {
  const int64_t threshold = config_->tunables().fusion_threshold_bytes;
  std::vector<Backend*> c = Candidates(kind, RequestType::kAllreduce);
  FusionLimits f;
  if (!c.empty()) f = c.front()->Fusion();
  f.allreduce_bytes = std::min(f.allreduce_bytes, threshold);
  f.allgather_bytes = std::min(f.allgather_bytes, threshold);
  // Reducescatters fuse only where the backend that runs them can.
  std::vector<Backend*> rs = Candidates(kind, RequestType::kReducescatter);
  f.reducescatter_bytes = rs.empty() ? 0 : std::min(rs.front()->Fusion().reducescatter_bytes, threshold);
  return f;
}

bool BackendRegistry::TwoLevelPossible() const {
  for (const auto& b : backends_)
    if (b->TwoLevelPossible()) return true;
  return false;
}

BackendStats BackendRegistry::Stats() const {
  BackendStats s;
  for (const auto& b : backends_) b->AddStats(&s);
  return s;
}

void BackendRegistry::AbortAll(const std::string& why) {
  for (const auto& b : backends_) b->Abort(why);
}

}  // namespace hvdlite
