#include "common/message.h"

#include <cstring>
#include <stdexcept>

namespace hvdlite {

Response ResponseTo(const Request& q) {
  Response r;
  r.type = q.type;
  r.dtype = q.dtype;
  r.reduce_op = q.reduce_op;
  r.prescale = q.prescale;
  r.postscale = q.postscale;
  r.root = q.root;
  r.device = q.device;
  r.process_set = q.process_set;
  return r;
}

int64_t GatheredBytes(const Request& q, const std::vector<int64_t>& rows) {
  int64_t total = 0;
  for (int64_t n : rows) total += n;
  return total * RowElements(q.shape) * DataTypeSize(q.dtype);
}

namespace {

class Writer {
 public:
  template <typename T> void Pod(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    buf_.insert(buf_.end(), p, p + sizeof(T));
  }
  void Str(const std::string& s) {
    Pod<uint32_t>(static_cast<uint32_t>(s.size()));
    buf_.insert(buf_.end(), s.begin(), s.end());
  }
  template <typename T> void Vec(const std::vector<T>& v) {
    Pod<uint32_t>(static_cast<uint32_t>(v.size()));
    const auto* p = reinterpret_cast<const uint8_t*>(v.data());
    buf_.insert(buf_.end(), p, p + v.size() * sizeof(T));
  }
  std::vector<uint8_t> Take() { return std::move(buf_); }

 private:
  std::vector<uint8_t> buf_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  template <typename T> T Pod() {
    Need(sizeof(T));
    T v;
    std::memcpy(&v, p_, sizeof(T));
    p_ += sizeof(T);
    return v;
  }
  std::string Str() {
    auto n = Pod<uint32_t>();
    Need(n);
    std::string s(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return s;
  }
  template <typename T> std::vector<T> Vec() {
    auto n = Pod<uint32_t>();
    Need(n * sizeof(T));
    std::vector<T> v(n);
    if (n) std::memcpy(v.data(), p_, n * sizeof(T));
    p_ += n * sizeof(T);
    return v;
  }

 private:
  void Need(size_t n) {
    if (static_cast<size_t>(end_ - p_) < n) throw std::runtime_error("hvdlite: truncated control message");
  }
  const uint8_t* p_;
  const uint8_t* end_;
};

void Put(Writer& w, const Request& r) {
  w.Pod(r.rank); w.Pod(static_cast<int32_t>(r.type)); w.Pod(static_cast<int32_t>(r.dtype));
  w.Str(r.name); w.Vec(r.shape); w.Pod(static_cast<int32_t>(r.reduce_op));
  w.Pod(r.prescale); w.Pod(r.postscale); w.Pod(r.root); w.Vec(r.splits);
  w.Pod(r.group_id); w.Pod(r.group_size); w.Pod(r.device); w.Pod(r.process_set); w.Str(r.error);
}

Request GetRequest(Reader& rd) {
  Request r;
  r.rank = rd.Pod<int32_t>();
  r.type = static_cast<RequestType>(rd.Pod<int32_t>());
  r.dtype = static_cast<DataType>(rd.Pod<int32_t>());
  r.name = rd.Str();
  r.shape = rd.Vec<int64_t>();
  r.reduce_op = static_cast<ReduceOp>(rd.Pod<int32_t>());
  r.prescale = rd.Pod<double>();
  r.postscale = rd.Pod<double>();
  r.root = rd.Pod<int32_t>();
  r.splits = rd.Vec<int64_t>();
  r.group_id = rd.Pod<int32_t>();
  r.group_size = rd.Pod<int32_t>();
  r.device = rd.Pod<int32_t>();
  r.process_set = rd.Pod<int32_t>();
  r.error = rd.Str();
  return r;
}

void Put(Writer& w, const Response& r) {
  w.Pod(static_cast<int32_t>(r.type)); w.Str(r.error);
  w.Pod<uint32_t>(static_cast<uint32_t>(r.names.size()));
  for (const auto& n : r.names) w.Str(n);
  w.Pod(static_cast<int32_t>(r.dtype)); w.Pod(static_cast<int32_t>(r.reduce_op));
  w.Pod(r.prescale); w.Pod(r.postscale); w.Pod(r.root); w.Pod(r.device); w.Pod(r.process_set);
  w.Vec(r.sizes); w.Vec(r.cache_ids); w.Vec(r.joined_ranks); w.Pod(r.last_joined);
}

Response GetResponse(Reader& rd) {
  Response r;
  r.type = static_cast<RequestType>(rd.Pod<int32_t>());
  r.error = rd.Str();
  auto n = rd.Pod<uint32_t>();
  r.names.reserve(n);
  for (uint32_t i = 0; i < n; ++i) r.names.push_back(rd.Str());
  r.dtype = static_cast<DataType>(rd.Pod<int32_t>());
  r.reduce_op = static_cast<ReduceOp>(rd.Pod<int32_t>());
  r.prescale = rd.Pod<double>();
  r.postscale = rd.Pod<double>();
  r.root = rd.Pod<int32_t>();
  r.device = rd.Pod<int32_t>();
  r.process_set = rd.Pod<int32_t>();
  r.sizes = rd.Vec<int64_t>();
  r.cache_ids = rd.Vec<int32_t>();
  r.joined_ranks = rd.Vec<int32_t>();
  r.last_joined = rd.Pod<int32_t>();
  return r;
}

}  // namespace

std::vector<uint8_t> Serialize(const RequestList& list) {
  Writer w;
  w.Pod<uint8_t>(list.shutdown); w.Pod<uint8_t>(list.shutdown_ack);
  w.Pod<uint8_t>(list.failure); w.Str(list.shutdown_reason);
  w.Vec(list.waiting_ids);
  w.Vec(list.waiting_us);
  w.Pod<int64_t>(list.waiting_cycle);
  w.Pod<int64_t>(list.cycles_completed);
  w.Pod<uint32_t>(static_cast<uint32_t>(list.requests.size()));
  for (const auto& r : list.requests) Put(w, r);
  w.Str(list.timeline);
  return w.Take();
}

RequestList DeserializeRequestList(const uint8_t* data, size_t size) {
  Reader rd(data, size);
  RequestList list;
  list.shutdown = rd.Pod<uint8_t>();
  list.shutdown_ack = rd.Pod<uint8_t>();
  list.failure = rd.Pod<uint8_t>();
  list.shutdown_reason = rd.Str();
  list.waiting_ids = rd.Vec<int32_t>();
  list.waiting_us = rd.Vec<int64_t>();
  list.waiting_cycle = rd.Pod<int64_t>();
  list.cycles_completed = rd.Pod<int64_t>();
  auto n = rd.Pod<uint32_t>();
  list.requests.reserve(n);
  for (uint32_t i = 0; i < n; ++i) list.requests.push_back(GetRequest(rd));
  list.timeline = rd.Str();
  return list;
}

std::vector<uint8_t> Serialize(const ResponseList& list) {
  Writer w;
  w.Pod<uint8_t>(list.shutdown); w.Str(list.shutdown_reason); w.Pod<uint8_t>(list.failure);
  w.Pod<int64_t>(list.shutdown_cycles);
  w.Pod<uint32_t>(static_cast<uint32_t>(list.responses.size()));
  for (const auto& r : list.responses) Put(w, r);
  w.Pod<int64_t>(list.after_cycle);
  w.Pod<uint8_t>(list.has_tunables);
  if (list.has_tunables) w.Pod<Tunables>(list.tunables);
  return w.Take();
}

ResponseList DeserializeResponseList(const uint8_t* data, size_t size) {
  Reader rd(data, size);
  ResponseList list;
  list.shutdown = rd.Pod<uint8_t>();
  list.shutdown_reason = rd.Str();
  list.failure = rd.Pod<uint8_t>();
  list.shutdown_cycles = rd.Pod<int64_t>();
  auto n = rd.Pod<uint32_t>();
  list.responses.reserve(n);
  for (uint32_t i = 0; i < n; ++i) list.responses.push_back(GetResponse(rd));
  list.after_cycle = rd.Pod<int64_t>();
  list.has_tunables = rd.Pod<uint8_t>();
  if (list.has_tunables) list.tunables = rd.Pod<Tunables>();
  return list;
}

}  // namespace hvdlite
