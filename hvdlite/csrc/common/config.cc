#include "common/config.h"

namespace hvdlite {

Config::Config(const Parameters& job, std::vector<std::string> hosts) : job_(job), hosts_(std::move(hosts)) {
  tunables_.fusion_threshold_bytes = job.fusion_threshold_bytes;
  tunables_.cycle_time_ms = job.cycle_time_ms;
  tunables_.cache_enabled = job.cache_capacity > 0 ? 1 : 0;
  tunables_.hierarchical = job.two_level.allreduce;
}

const std::string* Config::HostOf(int rank) const {
  return rank >= 0 && static_cast<size_t>(rank) < hosts_.size() ? &hosts_[static_cast<size_t>(rank)] : nullptr;
}

std::string Config::RankName(int rank) const {
  const std::string* host = HostOf(rank);
  return "rank " + std::to_string(rank) + (host ? " (host " + *host + ")" : "");
}

std::string Config::RankNames(const std::vector<int>& ranks) const {
  std::string out = "[";
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::string* host = HostOf(ranks[i]);
    out += (i ? ", " : "") + std::to_string(ranks[i]) + (host ? " (" + *host + ")" : "");
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
