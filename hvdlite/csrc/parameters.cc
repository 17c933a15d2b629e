#include "parameters.h"

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

int ParseLogLevel(const char* v) {
  const char* names[] = {"trace", "debug", "info", "warning", "error", "fatal"};
  for (int i = 0; i < 6; ++i)
    if (strcasecmp(v, names[i]) == 0) return i;
  if (strcasecmp(v, "warn") == 0) return 3;
  return std::atoi(v);
}

}  // namespace

Parameters Parameters::FromEnvironment() {
  Parameters p;
  if (const char* v = GetEnv("FUSION_THRESHOLD")) p.fusion_threshold_bytes = std::atoll(v);
  if (const char* v = GetEnv("CYCLE_TIME")) p.cycle_time_ms = std::atof(v);
  if (const char* v = GetEnv("CACHE_CAPACITY")) p.cache_capacity = std::atoll(v);
  if (const char* v = GetEnv("TIMELINE")) p.timeline_path = v;
  p.timeline_mark_cycles = Truthy(GetEnv("TIMELINE_MARK_CYCLES"));
  if (const char* v = GetEnv("STALL_CHECK_TIME_SECONDS")) p.stall_check_seconds = std::atof(v);
  if (Truthy(GetEnv("STALL_CHECK_DISABLE"))) p.stall_check_seconds = 0;
  if (const char* v = GetEnv("STALL_SHUTDOWN_TIME_SECONDS")) p.stall_shutdown_seconds = std::atof(v);
  if (const char* v = GetEnv("HOST_CHUNK_BYTES")) p.host_chunk_bytes = std::atoll(v);
  if (const char* v = GetEnv("FUSION_DIRECT_BYTES")) p.fusion_direct_bytes = std::atoll(v);
  if (const char* v = GetEnv("SPIN_MICROSECONDS")) p.spin_us = std::atoll(v);
  if (const char* v = GetEnv("LOG_LEVEL")) p.log_level = ParseLogLevel(v);
  if (const char* v = GetEnv("MALLOC_TUNING")) p.malloc_tuning = Truthy(v);
  if (p.fusion_threshold_bytes < 0) p.fusion_threshold_bytes = 0;
  if (p.cycle_time_ms <= 0) p.cycle_time_ms = 1.0;
  if (p.cache_capacity < 0) p.cache_capacity = 0;
  if (p.spin_us < 0) p.spin_us = 0;
  if (p.host_chunk_bytes < 4096) p.host_chunk_bytes = 4096;
  return p;
}

}  // namespace hvdlite
