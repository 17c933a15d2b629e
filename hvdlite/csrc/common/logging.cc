#include "common/logging.h"

#include <atomic>
#include <cstdio>

namespace hvdlite {
namespace {
std::atomic<int> g_rank{-1};
std::atomic<int> g_level{3};
const char* kNames[] = {"TRACE", "DEBUG", "INFO", "WARNING", "ERROR", "FATAL"};
}  // namespace

void SetLogContext(int rank, int level) { g_rank = rank; g_level = level; }
int LogLevel() { return g_level; }

void EmitLog(int level, const std::string& message) {
  if (level < 0) level = 0;
  if (level > 5) level = 5;
  std::fprintf(stderr, "[hvdlite %s rank %d] %s\n", kNames[level], g_rank.load(), message.c_str());
  std::fflush(stderr);
}

}  // namespace hvdlite
