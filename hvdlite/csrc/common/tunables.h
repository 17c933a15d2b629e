// The engine's settings that may change while a job runs (HOROVOD_AUTOTUNE), and how
// the autotuner is configured. Plain data: the autotuner (negotiation/autotune.h)
// proposes them, rank 0 carries them in a response list (common/message.h), and every
// rank applies them at the same point of the one order they all run in.
#pragma once

#include <cstdint>
#include <string>

namespace hvdlite {

// The settings the tuner varies; the same on every rank once applied.
struct Tunables {
  int64_t fusion_threshold_bytes = 0;
  double cycle_time_ms = 0.0;
  int32_t cache_enabled = 1;  // 0: no new response-cache entries, existing ones evicted
  int32_t hierarchical = -1;  // two-level host allreduce: -1 by size, 0 never, 1 always

  bool operator==(const Tunables& o) const {
    return fusion_threshold_bytes == o.fusion_threshold_bytes && cycle_time_ms == o.cycle_time_ms &&
           cache_enabled == o.cache_enabled && hierarchical == o.hierarchical;
  }
  bool operator!=(const Tunables& o) const { return !(*this == o); }
};

struct AutotuneOptions {
  int warmup_samples = 3;     // HOROVOD_AUTOTUNE_WARMUP_SAMPLES
  int steps_per_sample = 10;  // HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE
  int max_samples = 20;       // HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES: the search's budget
  std::string log_path;       // HOROVOD_AUTOTUNE_LOG: one CSV line per sample
};

}  // namespace hvdlite
