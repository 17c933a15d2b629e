#include "timeline.h"

#include <cstring>
#include <sstream>

#include "common.h"

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
  pids_.clear();
  std::fputs("[\n", file_);
  std::fflush(file_);
  active_ = true;
  return true;
}

void TimelineWriter::Stop() {
  std::lock_guard<std::mutex> lk(mu_);
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
  if (!file_) return;
  int pid = TensorPid(tensor);
  std::ostringstream os;
  os << "{\"name\": \"" << phase << "\", \"ph\": \"X\", \"pid\": " << pid << ", \"tid\": 1, \"ts\": "
     << (start_us - origin_us_) << ", \"dur\": " << (end_us > start_us ? end_us - start_us : 0);
  if (!args_json.empty()) os << ", \"args\": " << args_json;
  os << "}";
  Write(os.str());
}

void TimelineWriter::Instant(const std::string& tensor, const char* what, int64_t ts_us, const std::string& args_json) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!file_) return;
  int pid = TensorPid(tensor);
  std::ostringstream os;
  os << "{\"name\": \"" << what << "\", \"ph\": \"i\", \"s\": \"p\", \"pid\": " << pid
     << ", \"tid\": 1, \"ts\": " << (ts_us - origin_us_);
  if (!args_json.empty()) os << ", \"args\": " << args_json;
  os << "}";
  Write(os.str());
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
