#include "common/config.h"

namespace hvdlite {

Config::Config(const Parameters& job, std::vector<std::string> hosts) : job_(job), hosts_(std::move(hosts)) {
  tunables_.fusion_threshold_bytes = job.fusion_threshold_bytes;
  tunables_.cycle_time_ms = job.cycle_time_ms;
  tunables_.cache_enabled = job.cache_capacity > 0 ? 1 : 0;
  tunables_.hierarchical = job.two_level.allreduce;
}

std::string Config::RankName(int rank) const {
  std::string out = "rank " + std::to_string(rank);
  if (rank >= 0 && static_cast<size_t>(rank) < hosts_.size()) out += " (host " + hosts_[static_cast<size_t>(rank)] + ")";
  return out;
}

std::string Config::RankNames(const std::vector<int>& ranks) const {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const int r = ranks[i];
    out += (i ? ", " : "") + std::to_string(r);
    if (r >= 0 && static_cast<size_t>(r) < hosts_.size()) out += " (" + hosts_[static_cast<size_t>(r)] + ")";
  }
  return out + "]";
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
