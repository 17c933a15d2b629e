// Minimal leveled logging to stderr, prefixed with the rank.
#pragma once

#include <iostream>
#include <sstream>

namespace hvdlite {

void SetLogContext(int rank, int level);
int LogLevel();
void EmitLog(int level, const std::string& message);

}  // namespace hvdlite

#define HVD_LOG(level, expr)                                   \
  do {                                                         \
    if ((level) >= ::hvdlite::LogLevel()) {                    \
      std::ostringstream hvd_log_os_;                          \
      hvd_log_os_ << expr;                                     \
      ::hvdlite::EmitLog((level), hvd_log_os_.str());          \
    }                                                          \
  } while (0)

#define HVD_DEBUG(expr) HVD_LOG(1, expr)
#define HVD_INFO(expr) HVD_LOG(2, expr)
#define HVD_WARN(expr) HVD_LOG(3, expr)
#define HVD_ERROR(expr) HVD_LOG(4, expr)
