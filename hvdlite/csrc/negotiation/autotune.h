// Horovod's autotuner (HOROVOD_AUTOTUNE=1): while training runs, rank 0 tries settings
// of the engine, scores each by the bytes its collectives moved per second, and keeps
// the best. Like the coordinator it is fed observations and returns decisions, with no
// MPI inside; the engine carries a decision to every rank in a response list, so that
// every rank switches at the same point of the one order they all run in.
//
// A *sample* is `steps_per_sample` training steps: a step ends where a tensor name of
// the step comes again (each step reduces the same named gradients; names used once,
// such as an initial broadcast, do not get in the way). The first
// `warmup_samples` samples only warm up. Then the tuner searches one setting at a time
// (coordinate search): the fusion threshold, then the cycle time, then the response
// cache off, then (where the hosts allow it) the two-level allreduce forced on and off,
// each time keeping the best value found so far, for at most `max_samples` scored
// samples. Finally the best settings and the defaults are measured once more each, and
// the better of the two (by the mean of their samples) stays: tuning never settles on
// settings it measured slower than the defaults.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "common/tunables.h"

namespace hvdlite {

class Autotuner {
 public:
  // `defaults`: the settings the job started with. `hierarchical_possible`: the hosts
  // allow a two-level allreduce (several hosts, as many ranks on each).
  Autotuner(const Tunables& defaults, bool hierarchical_possible, const AutotuneOptions& options);

  // A collective ran on rank 0: its tensors' names and how many bytes they held, at
  // `now_us`. Returns true when the settings change; `next` then holds them.
  bool Record(const std::vector<std::string>& names, int64_t bytes, int64_t now_us, Tunables* next);

  bool Done() const { return done_; }

 private:
  struct Scored {
    Tunables settings;
    double score;  // bytes per second
  };
  // The candidates of the search's next coordinate, from the best settings so far.
  void PlanNextCoordinate();
  // Moves to the next candidate (or the final comparison); returns the settings to run.
  Tunables Advance();
  double MeanScore(const Tunables& t) const;
  void Log(const char* kind, const Tunables& t, double score, int64_t steps, double seconds);

  Tunables defaults_, current_, best_;
  double best_score_ = -1.0;
  bool hierarchical_possible_;
  AutotuneOptions options_;
  int coordinate_ = 0;            // 0 fusion, 1 cycle, 2 cache, 3 hierarchical, 4 final
  std::vector<Tunables> queue_;   // candidates left to measure
  std::vector<Scored> scores_;    // every scored sample
  int samples_ = 0;               // samples completed, warm-up included
  int scored_ = 0;                // samples scored by the search
  bool done_ = false;
  bool planned_ = false;          // the search's first coordinate is planned
  // The sample being measured.
  std::unordered_set<std::string> seen_;  // names of the current step; one seen again starts the next
  int steps_ = -1;                // steps completed in it (-1: not started)
  int64_t start_us_ = 0;
  int64_t bytes_ = 0;
  std::ofstream log_;
};

}  // namespace hvdlite
