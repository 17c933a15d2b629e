// Autotuner (negotiation/autotune.h), fed synthetic training steps on a made-up clock
// whose step time depends on the settings in force. What it measured is read back from
// its HOROVOD_AUTOTUNE_LOG file.
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "common/logging.h"
#include "negotiation/autotune.h"
#include "stderr_capture.h"

using namespace hvdlite;

namespace {

constexpr int64_t kMiB = 1024 * 1024;

Tunables Defaults() {
  Tunables t;
  t.fusion_threshold_bytes = 128 * kMiB;
  t.cycle_time_ms = 1.0;
  t.cache_enabled = 1;
  t.hierarchical = -1;
  return t;
}

// A temporary file name, removed with the object.
struct TempPath {
  std::string path;
  TempPath() {
    const char* dir = std::getenv("TMPDIR");
    std::string pattern = std::string(dir && *dir ? dir : "/tmp") + "/hvdlite_autotune_XXXXXX";
    std::vector<char> buf(pattern.begin(), pattern.end());
    buf.push_back('\0');
    const int fd = mkstemp(buf.data());
    if (fd < 0) throw std::runtime_error("mkstemp failed");
    close(fd);
    path = buf.data();
  }
  ~TempPath() { std::remove(path.c_str()); }
};

struct LogLine {
  int sample;
  std::string kind;
  double fusion_mb, cycle_ms;
  int cache, hierarchical, steps;
  double seconds, score;
};

std::vector<LogLine> ReadLog(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  std::vector<LogLine> out;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    if (f.size() != 9) throw std::runtime_error("autotune log line with " + std::to_string(f.size()) + " fields: " + line);
    out.push_back(LogLine{std::stoi(f[0]), f[1], std::stod(f[2]), std::stod(f[3]), std::stoi(f[4]), std::stoi(f[5]),
                          std::stoi(f[6]), std::stod(f[7]), std::stod(f[8])});
  }
  return out;
}

std::vector<LogLine> OfKind(const std::vector<LogLine>& log, const std::string& kind) {
  std::vector<LogLine> out;
  for (const LogLine& l : log)
    if (l.kind == kind) out.push_back(l);
  return out;
}

// "fusion MiB/cycle ms/cache/hierarchical" of a log line, for comparing sequences.
std::string Key(double fusion_mb, double cycle_ms, int cache, int hierarchical) {
  std::ostringstream os;
  os << fusion_mb << "/" << cycle_ms << "/" << cache << "/" << hierarchical;
  return os.str();
}
std::string Key(const LogLine& l) { return Key(l.fusion_mb, l.cycle_ms, l.cache, l.hierarchical); }
std::string Key(const Tunables& t) {
  return Key(static_cast<double>(t.fusion_threshold_bytes) / kMiB, t.cycle_time_ms, t.cache_enabled, t.hierarchical);
}

// A training job: every step allreduces three named gradients of 1 MiB each and takes
// `step_us(settings, sample)` microseconds, `sample` counting from 0 (warm-up included).
struct Job {
  Autotuner tuner;
  Tunables current = Defaults();
  std::vector<Tunables> changes;  // every change the tuner asked for
  int64_t now = 1000000;
  int steps_per_sample;

  Job(const AutotuneOptions& o, bool hierarchical_possible)
      : tuner(Defaults(), hierarchical_possible, o), steps_per_sample(o.steps_per_sample) {}

  void Run(int steps, const std::function<int64_t(const Tunables&, int)>& step_us) {
    for (int s = 0; s < steps; ++s) {
      for (const char* name : {"grad.0", "grad.1", "grad.2"}) {
        Tunables next;
        if (tuner.Record({name}, kMiB, now, &next)) {
          current = next;
          changes.push_back(next);
        }
      }
      now += step_us(current, s / steps_per_sample);
    }
  }
  // Steps until the tuner is done (at most `limit`); the steps taken.
  int RunUntilDone(int limit, const std::function<int64_t(const Tunables&, int)>& step_us) {
    int steps = 0;
    while (!tuner.Done() && steps < limit) {
      Run(1, [&](const Tunables& t, int) { return step_us(t, steps / steps_per_sample); });
      ++steps;
    }
    return steps;
  }
};

// Faster with a 4 MiB fusion threshold, a 0.5 ms cycle and the two-level allreduce
// forced on; slower with the response cache off.
int64_t StepUs(const Tunables& t) {
  int64_t us = 2000;
  if (t.fusion_threshold_bytes == 4 * kMiB) us -= 500;
  if (t.cycle_time_ms == 0.5) us -= 300;
  if (!t.cache_enabled) us += 400;
  if (t.hierarchical == 1) us -= 100;
  return us;
}

AutotuneOptions Options(const std::string& log, int warmup, int steps, int max_samples) {
  AutotuneOptions o;
  o.warmup_samples = warmup;
  o.steps_per_sample = steps;
  o.max_samples = max_samples;
  o.log_path = log;
  return o;
}

}  // namespace

TEST(autotune_searches_coordinate_by_coordinate_and_keeps_best) {
  TempPath log;
  Job job(Options(log.path, /*warmup=*/2, /*steps=*/3, /*max_samples=*/20), /*hierarchical_possible=*/true);
  const int steps = job.RunUntilDone(1000, [](const Tunables& t, int) { return StepUs(t); });
  CHECK(job.tuner.Done());
  // 2 warm-up samples, 12 searched, 2 confirming, and the step that ends the last one.
  CHECK_EQ(steps, (2 + 12 + 2) * 3 + 1);
  std::vector<LogLine> lines = ReadLog(log.path);
  const std::vector<LogLine> search = OfKind(lines, "search");
  std::vector<std::string> searched;
  for (const LogLine& l : search) searched.push_back(Key(l));
  // Fusion threshold first (the defaults, then each candidate), then the cycle time
  // from the best threshold, then the cache off, then the two-level allreduce.
  const std::vector<std::string> expected = {
      "128/1/1/-1", "1/1/1/-1",   "4/1/1/-1",   "16/1/1/-1", "64/1/1/-1", "4/0.2/1/-1",
      "4/0.5/1/-1", "4/2.5/1/-1", "4/5/1/-1",   "4/0.5/0/-1", "4/0.5/1/1", "4/0.5/1/0"};
  CHECK_EQ(searched, expected);
  for (const LogLine& l : search) CHECK_EQ(l.steps, 3);
  // The score is bytes per second: 3 steps of 3 MiB each.
  REQUIRE(!search.empty());
  CHECK(std::abs(search[0].score - 9.0 * kMiB / (3 * 2000e-6)) < 1.0);
  const std::vector<LogLine> confirm = OfKind(lines, "confirm");
  REQUIRE_EQ(confirm.size(), 2u);
  CHECK_EQ(Key(confirm[0]), "4/0.5/1/1");
  CHECK_EQ(Key(confirm[1]), "128/1/1/-1");
  const std::vector<LogLine> best = OfKind(lines, "best");
  REQUIRE_EQ(best.size(), 1u);
  CHECK_EQ(Key(best[0]), "4/0.5/1/1");
  // The settings in force at the end are the best ones.
  CHECK_EQ(Key(job.current), "4/0.5/1/1");
  REQUIRE(!job.changes.empty());
  CHECK_EQ(Key(job.changes.back()), "4/0.5/1/1");
  // Done: nothing changes any more.
  Tunables next;
  CHECK(!job.tuner.Record({"grad.0"}, kMiB, job.now + 1000000, &next));
}

TEST(autotune_warmup_samples_are_not_scored) {
  TempPath log;
  Job job(Options(log.path, /*warmup=*/3, /*steps=*/2, /*max_samples=*/20), /*hierarchical_possible=*/false);
  // The warm-up runs at the defaults and impossibly fast: were it scored, the defaults
  // would win every comparison.
  job.RunUntilDone(1000, [](const Tunables& t, int sample) { return sample < 3 ? int64_t{1} : StepUs(t); });
  CHECK(job.tuner.Done());
  std::vector<LogLine> lines = ReadLog(log.path);
  REQUIRE(lines.size() > 3u);
  for (int i = 0; i < 3; ++i) {
    CHECK_EQ(lines[i].kind, "warmup");
    CHECK_EQ(lines[i].sample, i + 1);
  }
  CHECK_EQ(OfKind(lines, "warmup").size(), 3u);
  CHECK_EQ(lines[3].kind, "search");
  CHECK_EQ(Key(lines[3]), "128/1/1/-1");  // the search measures the defaults first
  CHECK_EQ(Key(job.current), "4/0.5/1/-1");
  // No hierarchical candidates where the hosts do not allow it.
  for (const LogLine& l : lines) CHECK_EQ(l.hierarchical, -1);
}

TEST(autotune_never_keeps_settings_slower_than_defaults) {
  TempPath log;
  Job job(Options(log.path, /*warmup=*/1, /*steps=*/2, /*max_samples=*/20), /*hierarchical_possible=*/false);
  // A 4 MiB threshold looks faster during the search (samples 1..10) but is much slower
  // when measured again: the final comparison keeps the defaults.
  job.RunUntilDone(1000, [](const Tunables& t, int sample) -> int64_t {
    if (t.fusion_threshold_bytes != 4 * kMiB) return 2000;
    return sample <= 10 ? 1500 : 100000;
  });
  CHECK(job.tuner.Done());
  std::vector<LogLine> lines = ReadLog(log.path);
  const std::vector<LogLine> confirm = OfKind(lines, "confirm");
  REQUIRE_EQ(confirm.size(), 2u);
  CHECK_EQ(Key(confirm[0]), "4/1/1/-1");
  CHECK_EQ(Key(confirm[1]), "128/1/1/-1");
  const std::vector<LogLine> best = OfKind(lines, "best");
  REQUIRE_EQ(best.size(), 1u);
  CHECK_EQ(Key(best[0]), Key(Defaults()));
  CHECK_EQ(Key(job.current), Key(Defaults()));
}

TEST(autotune_stops_searching_at_max_samples) {
  TempPath log;
  Job job(Options(log.path, /*warmup=*/1, /*steps=*/1, /*max_samples=*/3), /*hierarchical_possible=*/true);
  job.RunUntilDone(1000, [](const Tunables& t, int) { return StepUs(t); });
  CHECK(job.tuner.Done());
  std::vector<LogLine> lines = ReadLog(log.path);
  std::vector<std::string> searched;
  for (const LogLine& l : OfKind(lines, "search")) searched.push_back(Key(l));
  CHECK_EQ(searched, (std::vector<std::string>{"128/1/1/-1", "1/1/1/-1", "4/1/1/-1"}));
  CHECK_EQ(OfKind(lines, "confirm").size(), 2u);
  CHECK_EQ(Key(job.current), "4/1/1/-1");
}

TEST(autotune_sample_spans_steps_by_repeated_names) {
  // One step = the names until one comes again; a name used once (an initial
  // broadcast) belongs to the first step and ends none.
  Autotuner tuner(Defaults(), false, Options("", /*warmup=*/1, /*steps=*/2, /*max_samples=*/20));
  Tunables next;
  int64_t now = 0;
  CHECK(!tuner.Record({"init.broadcast"}, 10, now, &next));
  CHECK(!tuner.Record({}, 10, now, &next));  // nothing ran
  bool changed = false;
  int step = 0;
  for (; step < 20 && !changed; ++step) {
    now += 1000;
    for (const char* n : {"a", "b"}) changed = tuner.Record({n}, 100, now, &next) || changed;
  }
  // Samples of 2 steps: the warm-up ends where step 2 starts and the defaults are
  // measured next; that sample ends where step 4 starts, and the first candidate follows.
  CHECK(changed);
  CHECK_EQ(step, 5);
  CHECK_EQ(next.fusion_threshold_bytes, 1 * kMiB);
  CHECK_EQ(next.cycle_time_ms, 1.0);
}

TEST(autotune_unwritable_log_warns_and_goes_on) {
  SetLogContext(0, 3);
  std::string err = unit::StderrOf([] {
    Autotuner tuner(Defaults(), false, Options("/nonexistent-dir/autotune.csv", 0, 1, 2));
    Tunables next;
    for (int i = 0; i < 20; ++i) tuner.Record({"a"}, 100, i * 1000, &next);
  });
  CHECK_CONTAINS(err, "HOROVOD_AUTOTUNE_LOG: cannot write /nonexistent-dir/autotune.csv");
}
