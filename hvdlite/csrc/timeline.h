// Chrome/Perfetto trace of every phase of every tensor, written by the world's rank 0.
// One trace "process" per tensor name; phases are complete ("X") events; the file is a
// JSON array flushed as it goes and closed with "]" at stop, so it is valid JSON after
// a normal shutdown (and still loadable by chrome://tracing if the job was killed).
#pragma once

#include <cstdint>
#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

namespace hvdlite {

// The trace file itself, shared by every engine of the process (the global set's and
// each process set's), so that one file holds them all.
class TimelineWriter {
 public:
  ~TimelineWriter();
  // Opens (or reopens) the trace file; returns false with a message if it cannot.
  bool Start(const std::string& path, bool mark_cycles, std::string* error);
  void Stop();
  bool Active() const { return active_; }  // read by the background threads without the lock

  // A phase of one tensor, [start_us, end_us] on the steady clock.
  void Phase(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us,
             const std::string& args_json = "");
  void Instant(const std::string& tensor, const char* what, int64_t ts_us, const std::string& args_json = "");
  void CycleMark(int64_t ts_us);
  void Flush();

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

// One engine's view of the trace. The global set's engine owns the writer (it alone
// starts and stops it, and marks cycles); a process set's engine writes into the same
// file, its tensors named "NAME (process set ID)" so that they stay apart from the
// global set's tensors of the same name.
class Timeline {
 public:
  Timeline() : writer_(std::make_shared<TimelineWriter>()) {}
  Timeline(std::shared_ptr<TimelineWriter> shared, int32_t process_set)
      : writer_(std::move(shared)), owner_(false),
        suffix_(" (process set " + std::to_string(process_set) + ")") {}
  ~Timeline() { Stop(); }
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  bool Start(const std::string& path, bool mark_cycles, std::string* error) {
    return owner_ ? writer_->Start(path, mark_cycles, error) : true;
  }
  void Stop() {
    if (owner_ && writer_) writer_->Stop();
  }
  bool Active() const { return writer_->Active(); }
  void Phase(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us,
             const std::string& args_json = "") {
    writer_->Phase(Name(tensor), phase, start_us, end_us, args_json);
  }
  void Instant(const std::string& tensor, const char* what, int64_t ts_us, const std::string& args_json = "") {
    writer_->Instant(Name(tensor), what, ts_us, args_json);
  }
  void CycleMark(int64_t ts_us) {
    if (owner_) writer_->CycleMark(ts_us);
  }
  void Flush() { writer_->Flush(); }  // called by the background thread after each busy cycle
  const std::shared_ptr<TimelineWriter>& writer() const { return writer_; }

 private:
  std::string Name(const std::string& tensor) const { return suffix_.empty() ? tensor : tensor + suffix_; }

  std::shared_ptr<TimelineWriter> writer_;
  bool owner_ = true;
  std::string suffix_;
};

std::string JsonEscape(const std::string& s);

}  // namespace hvdlite
