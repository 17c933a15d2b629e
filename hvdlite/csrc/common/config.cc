#include "common/config.h"

namespace hvdlite {

Config::Config(const Parameters& job) : job_(job) {
  tunables_.fusion_threshold_bytes = job.fusion_threshold_bytes;
  tunables_.cycle_time_ms = job.cycle_time_ms;
  tunables_.cache_enabled = job.cache_capacity > 0 ? 1 : 0;
  tunables_.hierarchical = job.two_level.allreduce;
}

void Config::Apply(const Tunables& t) {
  std::lock_guard<std::mutex> lk(mu_);
  tunables_ = t;
  ++version_;
  ++applied_;
}

void Config::SetFusion(const FusionLimits& host, const FusionLimits& cuda) {
  std::lock_guard<std::mutex> lk(mu_);
  fusion_[static_cast<int>(DeviceKind::kHost)] = host;
  fusion_[static_cast<int>(DeviceKind::kCuda)] = cuda;
  ++version_;
}

Tunables Config::Snapshot(int64_t* applied) const {
  std::lock_guard<std::mutex> lk(mu_);
  if (applied) *applied = applied_;
  return tunables_;
}

}  // namespace hvdlite
