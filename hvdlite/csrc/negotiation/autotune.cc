#include "negotiation/autotune.h"

#include <algorithm>
#include <iomanip>

#include "common/logging.h"

namespace hvdlite {

namespace {

constexpr int64_t kMiB = 1024 * 1024;
// The values each coordinate tries besides the best one so far.
const int64_t kFusionCandidates[] = {1 * kMiB, 4 * kMiB, 16 * kMiB, 64 * kMiB};
const double kCycleCandidates[] = {0.2, 0.5, 2.5, 5.0};

}  // namespace

Autotuner::Autotuner(const Tunables& defaults, bool hierarchical_possible, const AutotuneOptions& options)
    : defaults_(defaults), current_(defaults), best_(defaults), hierarchical_possible_(hierarchical_possible),
      options_(options) {
  options_.warmup_samples = std::max(0, options_.warmup_samples);
  options_.steps_per_sample = std::max(1, options_.steps_per_sample);
  options_.max_samples = std::max(1, options_.max_samples);
  if (!options_.log_path.empty()) {
    log_.open(options_.log_path, std::ios::out | std::ios::trunc);
    if (!log_) HVD_WARN("HOROVOD_AUTOTUNE_LOG: cannot write " << options_.log_path << "; autotuning goes on unlogged");
    else log_ << "sample,kind,fusion_threshold_mb,cycle_time_ms,response_cache,hierarchical_allreduce,steps,"
                 "seconds,bytes_per_second\n" << std::flush;
  }
}

bool Autotuner::Record(const std::vector<std::string>& names, int64_t bytes, int64_t now_us, Tunables* next) {
  if (done_ || names.empty()) return false;
  const bool repeats = std::any_of(names.begin(), names.end(), [&](const std::string& n) { return seen_.count(n); });
  if (steps_ >= 0 && !repeats) {  // the step goes on
    seen_.insert(names.begin(), names.end());
    bytes_ += bytes;
    return false;
  }
  // A name of this step comes again: the next step starts with this collective.
  seen_.clear();
  seen_.insert(names.begin(), names.end());
  if (steps_ < 0 || ++steps_ < options_.steps_per_sample) {
    if (steps_ < 0) {  // the first collective seen: the first sample starts here
      steps_ = 0;
      start_us_ = now_us;
      bytes_ = 0;
    }
    bytes_ += bytes;
    return false;
  }
  // A sample is complete: score it, and move on.
  const double seconds = std::max(1e-6, static_cast<double>(now_us - start_us_) / 1e6);
  const double score = static_cast<double>(bytes_) / seconds;
  ++samples_;
  if (samples_ <= options_.warmup_samples) {
    Log("warmup", current_, score, steps_, seconds);
  } else {
    scores_.push_back({current_, score});
    ++scored_;
    Log(coordinate_ < 4 ? "search" : "confirm", current_, score, steps_, seconds);
    if (coordinate_ < 4 && score > best_score_) {
      best_score_ = score;
      best_ = current_;
    }
  }
  const Tunables chosen = samples_ < options_.warmup_samples ? current_ : Advance();
  steps_ = 0;
  start_us_ = now_us;
  bytes_ = bytes;
  if (chosen == current_) return false;
  current_ = chosen;
  *next = chosen;
  return true;
}

Tunables Autotuner::Advance() {
  if (!planned_) {  // the search starts: the defaults first
    planned_ = true;
    PlanNextCoordinate();
  }
  if (coordinate_ < 4 && scored_ >= options_.max_samples) {  // the budget is spent
    coordinate_ = 4;
    PlanNextCoordinate();
  }
  while (queue_.empty() && coordinate_ < 4) {
    ++coordinate_;
    PlanNextCoordinate();
  }
  if (!queue_.empty()) {
    Tunables t = queue_.front();
    queue_.erase(queue_.begin());
    return t;
  }
  // The final comparison is measured: keep the better of the best and the defaults.
  done_ = true;
  const Tunables keep = MeanScore(best_) > MeanScore(defaults_) ? best_ : defaults_;
  Log("best", keep, MeanScore(keep), 0, 0.0);
  HVD_INFO("autotune: done after " << scored_ << " scored samples; keeping fusion threshold "
           << keep.fusion_threshold_bytes << " B, cycle time " << keep.cycle_time_ms << " ms, response cache "
           << (keep.cache_enabled ? "on" : "off") << ", hierarchical allreduce " << keep.hierarchical);
  return keep;
}

void Autotuner::PlanNextCoordinate() {
  queue_.clear();
  auto add = [&](const Tunables& t) {
    if (std::find(queue_.begin(), queue_.end(), t) == queue_.end()) queue_.push_back(t);
  };
  Tunables t = best_;
  switch (coordinate_) {
    case 0:
      add(defaults_);
      for (int64_t f : kFusionCandidates) {
        t.fusion_threshold_bytes = f;
        if (t != defaults_) add(t);
      }
      break;
    case 1:
      for (double c : kCycleCandidates) {
        t.cycle_time_ms = c;
        if (t != best_) add(t);
      }
      break;
    case 2:
      if (best_.cache_enabled) {
        t.cache_enabled = 0;
        add(t);
      }
      break;
    case 3:
      if (hierarchical_possible_)
        for (int32_t h : {1, 0}) {
          t.hierarchical = h;
          if (t != best_) add(t);
        }
      break;
    default:  // 4: the final comparison
      if (best_ != defaults_) {
        add(best_);
        add(defaults_);
      }
      break;
  }
}

double Autotuner::MeanScore(const Tunables& t) const {
  double sum = 0.0;
  int n = 0;
  for (const Scored& s : scores_)
    if (s.settings == t) {
      sum += s.score;
      ++n;
    }
  return n ? sum / n : -1.0;
}

void Autotuner::Log(const char* kind, const Tunables& t, double score, int64_t steps, double seconds) {
  if (!log_) return;
  log_ << samples_ << ',' << kind << ',' << std::setprecision(6) << static_cast<double>(t.fusion_threshold_bytes) / kMiB
       << ',' << t.cycle_time_ms << ',' << t.cache_enabled << ',' << t.hierarchical << ',' << steps << ',' << seconds
       << ',' << std::setprecision(10) << score << '\n'
       << std::flush;
}

}  // namespace hvdlite
