// An engine's configuration, in one place. The job's settings are fixed once the
// engine starts (rank 0's values where every rank must agree); the tunables are the
// few the autotuner may change while the job runs, with the fusion limits that follow
// from them. Every component of the engine reads this one object, which the engine
// owns: nothing keeps a copy, and a change reaches every reader at once.
//
// Threads: the engine's thread (or a caller driving the engine, under its lock)
// applies changes and is the only one reading `tunables()` and `fusion()` unlocked;
// any other thread takes a Snapshot().
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "common/fusion.h"
#include "common/parameters.h"
#include "common/tunables.h"

namespace hvdlite {

class Config {
 public:
  // `job`: the settings this engine runs with. The tunables start at the job's values.
  explicit Config(const Parameters& job, std::vector<std::string> hosts = {});
  Config(const Config&) = delete;
  Config& operator=(const Config&) = delete;

  // Fixed for the engine's life. Its fusion threshold, cycle time and hierarchical
  // allreduce are the values the job started with; the ones in force are tunables().
  const Parameters& job() const { return job_; }
  // Rank `rank` as messages name it: "rank 3 (host node2)", or "rank 3" where the
  // hosts are not known.
  std::string RankName(int rank) const;
  // Ranks as messages list them: "[1 (node2), 3 (node4)]".
  std::string RankNames(const std::vector<int>& ranks) const;
  const Tunables& tunables() const { return tunables_; }
  const FusionLimits& fusion(DeviceKind kind) const { return fusion_[static_cast<int>(kind)]; }
  // Bumped by every change: a reader that derives something from the tunables can
  // tell when to derive it again.
  uint64_t version() const { return version_; }
  int64_t cycle_time_us() const { return static_cast<int64_t>(tunables_.cycle_time_ms * 1000); }

  // The engine's thread only.
  void Apply(const Tunables& t);
  void SetFusion(const FusionLimits& host, const FusionLimits& cuda);

  // Any thread: the tunables in force and how many changes were applied.
  Tunables Snapshot(int64_t* applied = nullptr) const;

 private:
  const Parameters job_;
  const std::vector<std::string> hosts_;  // every rank's host, by rank
  const std::string* HostOf(int rank) const;  // null where not known
  Tunables tunables_;
  FusionLimits fusion_[kNumDeviceKinds];
  uint64_t version_ = 0;
  int64_t applied_ = 0;
  mutable std::mutex mu_;  // guards writes, and reads from other threads
};

}  // namespace hvdlite
