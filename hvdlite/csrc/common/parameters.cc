#include "common/parameters.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <strings.h>
#include <string>

namespace hvdlite {

const char* GetEnv(const char* suffix) {
  std::string a = std::string("HVDLITE_") + suffix;
  if (const char* v = std::getenv(a.c_str())) return v;
  std::string b = std::string("HOROVOD_") + suffix;
  return std::getenv(b.c_str());
}

namespace {

bool Truthy(const char* v) {
  return v && (std::strcmp(v, "1") == 0 || strcasecmp(v, "true") == 0 || strcasecmp(v, "yes") == 0);
}

// Where FromEnvironment collects what it could not use (set while it runs, under the
// GIL like every caller of it).
std::vector<std::string>* g_problems = nullptr;

// A value that does not parse is reported and ignored (the default stays), rather
// than read as far as it goes: atoll("64MB") would silently mean 64 bytes.
void Ignored(const char* suffix, const char* v, const char* expected) {
  const char* name = std::getenv((std::string("HVDLITE_") + suffix).c_str()) ? "HVDLITE_" : "HOROVOD_";
  if (g_problems)
    g_problems->push_back(std::string("ignoring ") + name + suffix + "='" + v + "': expected " + expected +
                          "; using the default");
}

// The whole of `v` as an integer (trailing spaces allowed), or false.
bool ParseInt(const char* v, int64_t* out) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v, &end, 10);
  while (end && std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (end == v || *end != '\0' || errno == ERANGE) return false;
  *out = x;
  return true;
}

void ReadInt(const char* suffix, int64_t* out) {
  const char* v = GetEnv(suffix);
  if (v && !ParseInt(v, out)) Ignored(suffix, v, "an integer");
}

void ReadReal(const char* suffix, double* out) {
  const char* v = GetEnv(suffix);
  if (!v) return;
  char* end = nullptr;
  errno = 0;
  const double x = std::strtod(v, &end);
  while (end && std::isspace(static_cast<unsigned char>(*end))) ++end;
  if (end == v || *end != '\0' || errno == ERANGE) return Ignored(suffix, v, "a number");
  *out = x;
}

void ReadLogLevel(int* out) {
  const char* v = GetEnv("LOG_LEVEL");
  if (!v) return;
  const char* names[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  for (int i = 0; i < 6; ++i)
    if (strcasecmp(v, names[i]) == 0) return void(*out = i);
  if (strcasecmp(v, "warn") == 0) return void(*out = 3);
  int64_t level = -1;
  if (ParseInt(v, &level) && level >= 0 && level <= 5) *out = static_cast<int>(level);
  else Ignored("LOG_LEVEL", v, "trace, debug, info, warning, error, fatal or 0-5");
}

// HOROVOD_GPU_<suffix>: NCCL or MPI (host-staged). Horovod's other values (DDL, MLSL,
// CCL, GLOO) name backends hvdlite does not have: reported and ignored.
void ReadGpuBackend(const char* suffix, std::string* out) {
  const char* v = GetEnv(suffix);
  if (!v || !*v) return;
  if (strcasecmp(v, "NCCL") == 0) *out = "NCCL";
  else if (strcasecmp(v, "MPI") == 0) *out = "MPI";
  else Ignored(suffix, v, "NCCL or MPI (hvdlite has no other GPU backend)");
}

// HVDLITE_HIERARCHICAL_ALGORITHM: torus (0) or leader (1).
void ReadSchedule(int32_t* out) {
  const char* v = GetEnv("HIERARCHICAL_ALGORITHM");
  if (!v || !*v) return;
  if (strcasecmp(v, "torus") == 0) *out = 0;
  else if (strcasecmp(v, "leader") == 0) *out = 1;
  else Ignored("HIERARCHICAL_ALGORITHM", v, "torus or leader");
}

// HVDLITE_HIERARCHICAL_CROSS: mpi (0) or nccl (1).
void ReadCross(int32_t* out) {
  const char* v = GetEnv("HIERARCHICAL_CROSS");
  if (!v || !*v) return;
  if (strcasecmp(v, "mpi") == 0) *out = 0;
  else if (strcasecmp(v, "nccl") == 0) *out = 1;
  else Ignored("HIERARCHICAL_CROSS", v, "mpi or nccl");
}

}  // namespace

Parameters Parameters::FromEnvironment() {
  Parameters p;
  g_problems = &p.problems;
  p.elastic = Truthy(GetEnv("ELASTIC"));
  ReadInt("FUSION_THRESHOLD", &p.fusion_threshold_bytes);
  ReadReal("CYCLE_TIME", &p.cycle_time_ms);
  ReadInt("CACHE_CAPACITY", &p.cache_capacity);
  // "DYNAMIC" (Horovod's): no file until hvd.start_timeline() names one.
  if (const char* v = GetEnv("TIMELINE"); v && std::string(v) != "DYNAMIC") p.timeline_path = v;
  p.timeline_mark_cycles = Truthy(GetEnv("TIMELINE_MARK_CYCLES"));
  if (const char* v = GetEnv("THREAD_AFFINITY")) {
    std::vector<int> cores;
    std::string item;
    bool ok = true;
    for (const char* c = v;; ++c) {
      if (*c == ',' || *c == '\0') {
        int64_t core = -1;
        ok = ok && ParseInt(item.c_str(), &core) && core >= 0 && core < (1 << 20);
        cores.push_back(static_cast<int>(core));
        item.clear();
        if (*c == '\0') break;
      } else {
        item += *c;
      }
    }
    if (ok) p.thread_affinity = std::move(cores);
    else Ignored("THREAD_AFFINITY", v, "core numbers separated by commas, one per local rank");
  }
  ReadReal("STALL_CHECK_TIME_SECONDS", &p.stall_check_seconds);
  if (Truthy(GetEnv("STALL_CHECK_DISABLE"))) p.stall_check_seconds = 0;
  ReadReal("STALL_SHUTDOWN_TIME_SECONDS", &p.stall_shutdown_seconds);
  p.stall_evicts = Truthy(std::getenv("HVDLITE_LAUNCHER_REQUESTS"));
  ReadInt("HOST_CHUNK_BYTES", &p.host_chunk_bytes);
  ReadInt("FUSION_DIRECT_BYTES", &p.fusion_direct_bytes);
  ReadInt("RING_MIN_SEGMENT_BYTES", &p.ring_min_segment_bytes);
  ReadInt("SPIN_MICROSECONDS", &p.spin_us);
  if (const char* v = GetEnv("HIERARCHICAL_ALLREDUCE"); v && *v) p.two_level.allreduce = Truthy(v) ? 1 : 0;
  ReadInt("HIERARCHICAL_CHUNK_BYTES", &p.hierarchical_chunk_bytes);
  if (const char* v = GetEnv("HIERARCHICAL_ALLGATHER"); v && *v) p.two_level.allgather = Truthy(v) ? 1 : 0;
  ReadSchedule(&p.two_level.algorithm);
  ReadCross(&p.two_level.gpu_cross_nccl);
  ReadLogLevel(&p.log_level);
  if (const char* v = GetEnv("MALLOC_TUNING")) p.malloc_tuning = Truthy(v);
  if (const char* v = GetEnv("HUGE_PAGES")) p.huge_pages = Truthy(v);
  std::string all = "NCCL";
  ReadGpuBackend("GPU_OPERATIONS", &all);
  for (std::string& b : p.gpu_backend) b = all;
  ReadGpuBackend("GPU_ALLREDUCE", &p.gpu_backend[static_cast<int>(RequestType::kAllreduce)]);
  ReadGpuBackend("GPU_ALLGATHER", &p.gpu_backend[static_cast<int>(RequestType::kAllgather)]);
  ReadGpuBackend("GPU_BROADCAST", &p.gpu_backend[static_cast<int>(RequestType::kBroadcast)]);
  ReadGpuBackend("GPU_ALLTOALL", &p.gpu_backend[static_cast<int>(RequestType::kAlltoall)]);
  ReadGpuBackend("GPU_REDUCESCATTER", &p.gpu_backend[static_cast<int>(RequestType::kReducescatter)]);
  if (const char* v = GetEnv("AUTOTUNE")) p.autotune = Truthy(v);
  auto read_count = [](const char* suffix, int least, int* out) {
    int64_t n = *out;
    ReadInt(suffix, &n);
    if (n >= least && n <= 1000000) *out = static_cast<int>(n);
  };
  read_count("AUTOTUNE_WARMUP_SAMPLES", 0, &p.autotune_options.warmup_samples);
  read_count("AUTOTUNE_STEPS_PER_SAMPLE", 1, &p.autotune_options.steps_per_sample);
  read_count("AUTOTUNE_BAYES_OPT_MAX_SAMPLES", 1, &p.autotune_options.max_samples);
  if (const char* v = GetEnv("AUTOTUNE_LOG")) p.autotune_options.log_path = v;
  if (p.fusion_threshold_bytes < 0) p.fusion_threshold_bytes = 0;
  if (p.cycle_time_ms <= 0) p.cycle_time_ms = 1.0;
  if (p.cache_capacity < 0) p.cache_capacity = 0;
  if (p.cache_capacity > kMaxCacheCapacity) {
    p.problems.push_back("HOROVOD_CACHE_CAPACITY=" + std::to_string(p.cache_capacity) +
                         " is above hvdlite's limit; using " + std::to_string(kMaxCacheCapacity) +
                         " (every cycle carries two bits per entry)");
    p.cache_capacity = kMaxCacheCapacity;
  }
  if (p.spin_us < 0) p.spin_us = 0;
  if (p.host_chunk_bytes < 4096) p.host_chunk_bytes = 4096;
  if (p.hierarchical_chunk_bytes < 4096) p.hierarchical_chunk_bytes = 4096;
  g_problems = nullptr;
  return p;
}

}  // namespace hvdlite
