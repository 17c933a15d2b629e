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
//
// The world's rank 0 writes the file. On every other rank the writer relays: it keeps
// the records of the process sets rank 0 is not in (their own rank 0 records them),
// which the global engine sends to the world's rank 0 on its control channel, where
// WriteRelayed adds them to the file. Relayed times travel on the system clock, which
// hosts keep in step, and are placed on rank 0's steady clock when written.
class TimelineWriter {
 public:
  ~TimelineWriter();
  // Opens (or reopens) the trace file; returns false with a message if it cannot.
  bool Start(const std::string& path, bool mark_cycles, std::string* error);
  // On a rank other than the world's rank 0: keep records for rank 0 from now on.
  void StartRelay();
  void Stop();
  bool Active() const { return active_; }  // read by the background threads without the lock
  bool Relaying() const { return relaying_; }

  // A phase of one tensor, [start_us, end_us] on the steady clock.
  void Phase(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us,
             const std::string& args_json = "");
  void Instant(const std::string& tensor, const char* what, int64_t ts_us, const std::string& args_json = "");
  void CycleMark(int64_t ts_us);
  void Flush();

  // Relaying side: whether records wait to be sent, and all of them, encoded (cleared).
  bool HasRelayed() const { return has_relayed_; }
  std::string TakeRelayed();
  // Writing side: records another rank relayed.
  void WriteRelayed(const std::string& encoded);

 private:
  int TensorPid(const std::string& tensor);
  void Write(const std::string& s);
  void WritePhase(const std::string& tensor, const std::string& phase, int64_t start_us, int64_t end_us,
                  const std::string& args_json);
  void WriteInstant(const std::string& tensor, const std::string& what, int64_t ts_us, const std::string& args_json);
  void Relay(char kind, const std::string& tensor, const std::string& what, int64_t start_us, int64_t end_us,
             const std::string& args_json);

  std::mutex mu_;
  std::FILE* file_ = nullptr;
  bool mark_cycles_ = false;
  std::atomic<bool> active_{false};
  std::atomic<bool> relaying_{false};
  std::atomic<bool> has_relayed_{false};
  bool first_ = true;
  int64_t origin_us_ = 0;
  int64_t system_minus_steady_us_ = 0;  // this process's system clock less its steady clock
  std::string relayed_;                 // encoded records waiting to be sent
  std::unordered_map<std::string, int> pids_;
};

// One engine's view of the trace. The global set's engine owns the writer (it alone
// starts and stops it, and marks cycles); a process set's engine writes into the same
// file, its tensors named "NAME (process set ID)" so that they stay apart from the
// global set's tensors of the same name. Where the writer relays (ranks other than the
// world's 0), only the view of a set without the world's rank 0, on that set's rank 0,
// records (`relays`): what rank 0 cannot see itself.
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
  // On a rank other than the world's 0: whether this engine's records go to rank 0.
  void SetRelays(bool relays) { relays_ = relays; }
  bool Active() const { return writer_->Active() && (relays_ || !writer_->Relaying()); }
  void Phase(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us,
             const std::string& args_json = "") {
    if (relays_ || !writer_->Relaying()) writer_->Phase(Name(tensor), phase, start_us, end_us, args_json);
  }
  void Instant(const std::string& tensor, const char* what, int64_t ts_us, const std::string& args_json = "") {
    if (relays_ || !writer_->Relaying()) writer_->Instant(Name(tensor), what, ts_us, args_json);
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
  bool relays_ = false;
  std::string suffix_;
};

std::string JsonEscape(const std::string& s);

}  // namespace hvdlite
