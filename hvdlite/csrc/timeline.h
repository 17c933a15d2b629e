// Chrome/Perfetto trace of every phase of every tensor, written by rank 0.
// One trace "process" per tensor name; phases are complete ("X") events; the file is a
// JSON array flushed as it goes and closed with "]" at stop, so it is valid JSON after
// a normal shutdown (and still loadable by chrome://tracing if the job was killed).
#pragma once

#include <cstdint>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <string>
#include <unordered_map>

namespace hvdlite {

class Timeline {
 public:
  ~Timeline();
  // Opens (or reopens) the trace file; returns false with a message if it cannot.
  bool Start(const std::string& path, bool mark_cycles, std::string* error);
  void Stop();
  bool Active() const { return active_; }  // read by the background thread without the lock
  bool MarkCycles() const { return mark_cycles_; }

  // A phase of one tensor, [start_us, end_us] on the steady clock.
  void Phase(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us,
             const std::string& args_json = "");
  void Instant(const std::string& tensor, const char* what, int64_t ts_us, const std::string& args_json = "");
  void CycleMark(int64_t ts_us);
  void Flush();  // called by the background thread after each busy cycle

 private:
  int TensorPid(const std::string& tensor);
  void Write(const std::string& s);

  std::mutex mu_;
  std::FILE* file_ = nullptr;
  bool mark_cycles_ = false;
  std::atomic<bool> active_{false};
  bool first_ = true;
  int64_t origin_us_ = 0;
  std::unordered_map<std::string, int> pids_;
};

std::string JsonEscape(const std::string& s);

}  // namespace hvdlite
