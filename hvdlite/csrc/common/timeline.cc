#include "common/timeline.h"

#include <chrono>
#include <cstring>
#include <sstream>

#include "common/common.h"

namespace hvdlite {

std::string JsonEscape(const std::string& s) {
  std::string out;
  out.reserve(s.size() + 2);
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

namespace {

int64_t SystemMinusSteadyMicros() {
  const auto system = std::chrono::duration_cast<std::chrono::microseconds>(
      std::chrono::system_clock::now().time_since_epoch()).count();
  return static_cast<int64_t>(system) - NowMicros();
}

// Relayed records: a kind byte ('X' phase, 'i' instant), the tensor, the phase's name
// and its arguments as length-prefixed strings, then start and end on the system clock.
void PutString(std::string* out, const std::string& s) {
  const uint32_t n = static_cast<uint32_t>(s.size());
  out->append(reinterpret_cast<const char*>(&n), sizeof n);
  out->append(s);
}

template <typename T>
void PutPod(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof v);
}

class RecordReader {
 public:
  explicit RecordReader(const std::string& s) : p_(s.data()), end_(s.data() + s.size()) {}
  bool Done() const { return p_ >= end_; }
  template <typename T>
  bool Pod(T* v) {
    if (static_cast<size_t>(end_ - p_) < sizeof(T)) return false;
    std::memcpy(v, p_, sizeof(T));
    p_ += sizeof(T);
    return true;
  }
  bool Str(std::string* s) {
    uint32_t n = 0;
    if (!Pod(&n) || static_cast<size_t>(end_ - p_) < n) return false;
    s->assign(p_, n);
    p_ += n;
    return true;
  }

 private:
  const char* p_;
  const char* end_;
};

}  // namespace

TimelineWriter::~TimelineWriter() { Stop(); }

bool TimelineWriter::Start(const std::string& path, bool mark_cycles, std::string* error) {
  std::lock_guard<std::mutex> lk(mu_);
  if (file_) {
    std::fputs("\n]\n", file_);
    std::fclose(file_);
    file_ = nullptr;
  }
  file_ = std::fopen(path.c_str(), "w");
  if (!file_) {
    *error = "cannot open timeline file '" + path + "': " + std::strerror(errno);
    return false;
  }
  mark_cycles_ = mark_cycles;
  first_ = true;
  origin_us_ = NowMicros();
  system_minus_steady_us_ = SystemMinusSteadyMicros();
  pids_.clear();
  std::fputs("[\n", file_);
  std::fflush(file_);
  active_ = true;
  return true;
}

void TimelineWriter::StartRelay() {
  std::lock_guard<std::mutex> lk(mu_);
  system_minus_steady_us_ = SystemMinusSteadyMicros();
  relaying_ = true;
  active_ = true;
}

void TimelineWriter::Stop() {
  std::lock_guard<std::mutex> lk(mu_);
  if (relaying_) {
    active_ = false;  // what was recorded is still sent
    return;
  }
  if (!file_) return;
  active_ = false;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

void TimelineWriter::Write(const std::string& s) {
  if (!first_) std::fputs(",\n", file_);
  first_ = false;
  std::fputs(s.c_str(), file_);
}

void TimelineWriter::Flush() {
  std::lock_guard<std::mutex> lk(mu_);
  if (file_) std::fflush(file_);
}

int TimelineWriter::TensorPid(const std::string& tensor) {
  auto it = pids_.find(tensor);
  if (it != pids_.end()) return it->second;
  int pid = static_cast<int>(pids_.size()) + 1;
  pids_.emplace(tensor, pid);
  std::ostringstream os;
  os << "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << pid
     << ", \"args\": {\"name\": \"" << JsonEscape(tensor) << "\"}}";
  Write(os.str());
  std::ostringstream os2;
  os2 << "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": " << pid
      << ", \"args\": {\"sort_index\": " << pid << "}}";
  Write(os2.str());
  return pid;
}

void TimelineWriter::Phase(const std::string& tensor, const char* phase, int64_t start_us, int64_t end_us,
                           const std::string& args_json) {
  std::lock_guard<std::mutex> lk(mu_);
  if (relaying_) {
    if (active_) Relay('X', tensor, phase, start_us, end_us, args_json);
    return;
  }
  if (file_) WritePhase(tensor, phase, start_us, end_us, args_json);
}

void TimelineWriter::Instant(const std::string& tensor, const char* what, int64_t ts_us, const std::string& args_json) {
  std::lock_guard<std::mutex> lk(mu_);
  if (relaying_) {
    if (active_) Relay('i', tensor, what, ts_us, ts_us, args_json);
    return;
  }
  if (file_) WriteInstant(tensor, what, ts_us, args_json);
}

void TimelineWriter::WritePhase(const std::string& tensor, const std::string& phase, int64_t start_us,
                                int64_t end_us, const std::string& args_json) {
  int pid = TensorPid(tensor);
  std::ostringstream os;
  os << "{\"name\": \"" << JsonEscape(phase) << "\", \"ph\": \"X\", \"pid\": " << pid
     << ", \"tid\": 1, \"ts\": " << (start_us - origin_us_) << ", \"dur\": "
     << (end_us > start_us ? end_us - start_us : 0);
  if (!args_json.empty()) os << ", \"args\": " << args_json;
  os << "}";
  Write(os.str());
}

void TimelineWriter::WriteInstant(const std::string& tensor, const std::string& what, int64_t ts_us,
                                  const std::string& args_json) {
  int pid = TensorPid(tensor);
  std::ostringstream os;
  os << "{\"name\": \"" << JsonEscape(what) << "\", \"ph\": \"i\", \"s\": \"p\", \"pid\": " << pid
     << ", \"tid\": 1, \"ts\": " << (ts_us - origin_us_);
  if (!args_json.empty()) os << ", \"args\": " << args_json;
  os << "}";
  Write(os.str());
}

void TimelineWriter::Relay(char kind, const std::string& tensor, const std::string& what, int64_t start_us,
                           int64_t end_us, const std::string& args_json) {
  // Sent at the global engine's next step; a backlog beyond this (a world engine idle
  // for long while a set works hard) is dropped rather than held without bound.
  constexpr size_t kMaxRelayedBytes = size_t{64} << 20;
  if (relayed_.size() > kMaxRelayedBytes) return;
  relayed_.push_back(kind);
  PutString(&relayed_, tensor);
  PutString(&relayed_, what);
  PutString(&relayed_, args_json);
  PutPod<int64_t>(&relayed_, start_us + system_minus_steady_us_);
  PutPod<int64_t>(&relayed_, end_us + system_minus_steady_us_);
  has_relayed_ = true;
}

std::string TimelineWriter::TakeRelayed() {
  std::lock_guard<std::mutex> lk(mu_);
  has_relayed_ = false;
  std::string out;
  out.swap(relayed_);
  return out;
}

void TimelineWriter::WriteRelayed(const std::string& encoded) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!file_) return;  // the trace was stopped meanwhile
  RecordReader rd(encoded);
  while (!rd.Done()) {
    char kind = 0;
    std::string tensor, what, args;
    int64_t start = 0, end = 0;
    if (!rd.Pod(&kind) || !rd.Str(&tensor) || !rd.Str(&what) || !rd.Str(&args) || !rd.Pod(&start) ||
        !rd.Pod(&end))
      return;  // cannot happen between two hvdlite processes of one build
    start -= system_minus_steady_us_;
    end -= system_minus_steady_us_;
    if (kind == 'X') WritePhase(tensor, what, start, end, args);
    else WriteInstant(tensor, what, start, args);
  }
}

void TimelineWriter::CycleMark(int64_t ts_us) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!file_ || !mark_cycles_) return;
  std::ostringstream os;
  os << "{\"name\": \"CYCLE_START\", \"ph\": \"i\", \"s\": \"g\", \"pid\": 0, \"tid\": 0, \"ts\": "
     << (ts_us - origin_us_) << "}";
  Write(os.str());
}

}  // namespace hvdlite
