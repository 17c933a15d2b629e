// Shared by the fake CUDA runtime (fake_cudart.cc) and the fake NCCL (fake_nccl.cc).
//
// Neither library may include CUDA or NCCL headers (CI machines have neither), so the
// few ABI types they share are declared here, with the values of the real headers.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

// ---- The part of the CUDA runtime ABI that both libraries use -------------------------
struct CUstream_st;  // opaque, as in the real headers
struct CUevent_st;
typedef CUstream_st* cudaStream_t;
typedef CUevent_st* cudaEvent_t;
typedef int cudaError_t;  // an enum in the real headers; int-sized either way
typedef void (*cudaHostFn_t)(void* user_data);

FAKE_EXPORT cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data);
FAKE_EXPORT cudaError_t cudaGetDevice(int* device);
FAKE_EXPORT const char* cudaGetErrorString(cudaError_t error);

namespace fake_common {

// Reads an integer environment variable; `fallback` when unset or unparsable.
inline long env_long(const char* name, long fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s) return fallback;
  return v;
}

inline double env_double(const char* name, double fallback) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  char* end = nullptr;
  double v = std::strtod(s, &end);
  return end == s ? fallback : v;
}

inline std::string env_string(const char* name) {
  const char* s = std::getenv(name);
  return s == nullptr ? std::string() : std::string(s);
}

// An append-only log file named by an environment variable. Each line goes out in ONE
// write() on an O_APPEND descriptor, so lines from several threads and processes never
// interleave. Disabled (every call a no-op) when the variable is unset.
class AppendLog {
 public:
  explicit AppendLog(const char* env_var) {
    std::string path = env_string(env_var);
    if (!path.empty()) fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  }
  ~AppendLog() {
    if (fd_ >= 0) ::close(fd_);
  }
  AppendLog(const AppendLog&) = delete;
  AppendLog& operator=(const AppendLog&) = delete;

  bool enabled() const { return fd_ >= 0; }

  // printf-style; a newline is appended. Lines are truncated at 511 characters.
  __attribute__((format(printf, 2, 3))) void line(const char* fmt, ...) const {
    if (fd_ < 0) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = std::vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if (n > static_cast<int>(sizeof(buf)) - 2) n = static_cast<int>(sizeof(buf)) - 2;
    buf[n++] = '\n';
    ssize_t ignored = ::write(fd_, buf, static_cast<size_t>(n));
    (void)ignored;
  }

 private:
  int fd_ = -1;
};

}  // namespace fake_common
