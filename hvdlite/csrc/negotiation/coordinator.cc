#include "negotiation/coordinator.h"

#include <algorithm>
#include <sstream>

#include "common/logging.h"
#include "common/timeline.h"

namespace hvdlite {
namespace {

// "rank 0 sent [4, 3]; ranks 1, 2 sent [5, 3]" -- ranks grouped by what they sent.
std::string PerRank(const std::vector<std::pair<int, std::string>>& values) {
  std::vector<std::pair<std::string, std::vector<int>>> groups;
  for (const auto& [rank, v] : values) {
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == v; });
    if (it == groups.end()) groups.push_back({v, {rank}});
    else it->second.push_back(rank);
  }
  std::ostringstream os;
  for (size_t i = 0; i < groups.size(); ++i) {
    if (i) os << "; ";
    os << (groups[i].second.size() > 1 ? "ranks " : "rank ");
    for (size_t j = 0; j < groups[i].second.size(); ++j) os << (j ? ", " : "") << groups[i].second[j];
    os << " sent " << groups[i].first;
  }
  return os.str();
}

std::string RankList(const std::vector<int>& ranks) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < ranks.size(); ++i) os << (i ? ", " : "") << ranks[i];
  os << "]";
  return os.str();
}

std::string Num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

// A rank that submitted this tensor (every pending tensor has at least one).
int FirstRank(const std::vector<char>& have) {
  int r = 0;
  while (!have[r]) ++r;
  return r;
}

// Allreduces (or reducescatters) fuse only when they are reduced and scaled the same way.
bool SameFusionKey(const Response& a, const Response& b) {
  return a.type == b.type && a.dtype == b.dtype && a.reduce_op == b.reduce_op && a.prescale == b.prescale &&
         a.postscale == b.postscale && KindOfDevice(a.device) == KindOfDevice(b.device);
}

}  // namespace

Coordinator::Coordinator(int size, const Config* config, ResponseCache* cache, Timeline* timeline)
    : size_(size), config_(config), params_(config->job()), cache_(cache), timeline_(timeline), joined_(size, 0) {}

void Coordinator::AddRequest(const Request& r, int64_t now_us) {
  if (r.type == RequestType::kJoin) {
    if (!joined_[r.rank]) {
      joined_[r.rank] = 1;
      ++joined_count_;
      last_joined_ = r.rank;
    }
    if (joined_count_ == size_) join_complete_ = true;
    // Tensors waiting only for ranks that have now joined can go ahead.
    for (auto& [name, p] : table_) MarkReadyIfComplete(name);
    return;
  }
  auto [it, inserted] = table_.try_emplace(r.name);
  Pending& p = it->second;
  if (inserted) {
    p.requests.resize(size_);
    p.have.assign(size_, 0);
    p.arrival_us.assign(size_, 0);
    p.first_us = now_us;
    p.last_warn_us = now_us;
  }
  if (p.have[r.rank]) {  // a rank cannot have the same name twice in flight
    HVD_DEBUG("rank " << r.rank << " sent " << r.name << " again while it was in flight; dropped");
    return;
  }
  p.requests[r.rank] = r;
  p.have[r.rank] = 1;
  p.arrival_us[r.rank] = now_us;
  ++p.count;
  if (p.doomed.empty()) {
    if (const std::string* why = FailedGroup(p)) Doom(r.name, p, *why);
  }
  MarkReadyIfComplete(r.name);
}

const std::string* Coordinator::FailedGroup(const Pending& p) const {
  if (failed_groups_.empty()) return nullptr;
  for (int r = 0; r < size_; ++r) {
    if (!p.have[r] || p.requests[r].group_id < 0) continue;
    auto it = failed_groups_.find({r, p.requests[r].group_id});
    if (it != failed_groups_.end()) return &it->second;
  }
  return nullptr;
}

// Fails `name` at the next TakeReady, whether or not every rank has sent it.
void Coordinator::Doom(const std::string& name, Pending& p, const std::string& why) {
  p.doomed = RequestLabel(RequestType::kAllreduce, name) + ": not run, another member of its group failed: " + why;
  if (!IsReady(name)) ready_.push_back(name);
}

bool Coordinator::IsReady(const std::string& name) const {
  return std::find(ready_.begin(), ready_.end(), name) != ready_.end();
}

void Coordinator::ReportCachedWait(int rank, int32_t id, const Request& sig, int64_t waited_us, int64_t cycle,
                                   int64_t now_us) {
  auto ran = cached_ran_.find(id);
  // `cycle`: the cycles the rank had completed while it waited, so the tensor waits for
  // a later one. One that ran in a later cycle is stale; one that ran in cycle `cycle`
  // itself is the step before (a training loop's tensor waits again right after it ran).
  if (ran != cached_ran_.end() && ran->second > cycle) return;
  auto [it, inserted] = cached_waits_.try_emplace(id);
  CachedWait& w = it->second;
  if (inserted || w.name != sig.name) {
    w.type = sig.type;
    w.name = sig.name;
    w.have.assign(size_, 0);
    w.since_us.assign(size_, 0);
    w.cycle.assign(size_, 0);
    w.last_warn_us = now_us - waited_us;
  }
  w.have[rank] = 1;
  w.since_us[rank] = now_us - waited_us;
  w.cycle[rank] = cycle;
}

void Coordinator::CachedRan(int32_t id, int64_t cycle) {
  cached_ran_[id] = cycle;
  auto it = cached_waits_.find(id);
  if (it == cached_waits_.end()) return;
  CachedWait& w = it->second;
  bool any = false;
  for (int r = 0; r < size_; ++r) {
    if (w.have[r] && w.cycle[r] < cycle) w.have[r] = 0;
    any = any || w.have[r];
  }
  if (!any) cached_waits_.erase(it);
}

bool Coordinator::Complete(const Pending& p) const {
  if (p.count == 0) return false;
  for (int r = 0; r < size_; ++r)
    if (!p.have[r] && !joined_[r]) return false;
  return true;
}

void Coordinator::MarkReadyIfComplete(const std::string& name) {
  const Pending& p = table_.at(name);
  if (!Complete(p) || !p.doomed.empty()) return;
  if (!IsReady(name)) ready_.push_back(name);
}

std::string Coordinator::Validate(const std::string& name, const Pending& p) const {
  std::vector<int> present;
  for (int r = 0; r < size_; ++r)
    if (p.have[r]) present.push_back(r);
  // A rank that could not take part (its own input check failed) fails it everywhere.
  std::string refused;
  for (int r : present) {
    const std::string& e = p.requests[r].error;
    if (e.empty()) continue;
    refused += (refused.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) + ": " + e;
  }
  if (!refused.empty()) return refused;
  const Request& first = p.requests[present.front()];
  // Built only for a message: this runs for every tensor on every step.
  auto op = [&] { return std::string(RequestTypeName(first.type)); };
  auto label = [&] { return RequestLabel(first.type, name); };
  auto differ = [&](auto get) {
    for (int r : present)
      if (get(p.requests[r]) != get(p.requests[present.front()])) return true;
    return false;
  };
  auto describe = [&](const char* what, auto to_string) {
    std::vector<std::pair<int, std::string>> v;
    for (int r : present) v.push_back({r, to_string(p.requests[r])});
    return label() + ": ranks disagree on " + what + ": " + PerRank(v);
  };
  if (differ([](const Request& r) { return r.type; }))
    return "tensor '" + name + "': ranks disagree on the operation: " +
           [&] {
             std::vector<std::pair<int, std::string>> v;
             for (int r : present) v.push_back({r, RequestTypeName(p.requests[r].type)});
             return PerRank(v);
           }();
  if (differ([](const Request& r) { return r.dtype; }))
    return describe("the data type", [](const Request& r) { return std::string(DataTypeName(r.dtype)); });
  // Each rank drives its own GPU, so only the kind of device must agree.
  if (differ([](const Request& r) { return KindOfDevice(r.device); }))
    return describe("the device", [](const Request& r) { return DeviceLabel(r.device); });
  if (differ([](const Request& r) { return r.process_set; }))
    return describe("the process set", [](const Request& r) { return std::to_string(r.process_set); });

  std::vector<int> joined;
  for (int r = 0; r < size_; ++r)
    if (joined_[r]) joined.push_back(r);
  if (!joined.empty() && first.type != RequestType::kAllreduce)
    return label() + " cannot run while ranks " + RankList(joined) +
           " have joined; only allreduce proceeds with zeros from joined ranks (sparse gradients "
           "are allgathered: pass sparse_as_dense=True to the DistributedOptimizer or gradient tape)";

  auto shape_str = [](const Request& r) { return ShapeString(r.shape); };
  auto tail_str = [](const Request& r) {
    return r.shape.empty() ? std::string("a scalar") : ShapeString(std::vector<int64_t>(r.shape.begin() + 1, r.shape.end())) + " after the first dimension";
  };
  switch (first.type) {
    case RequestType::kAllreduce:
    case RequestType::kReducescatter:
      if (differ([](const Request& r) { return r.shape; })) return describe("the shape", shape_str);
      if (differ([](const Request& r) { return r.reduce_op; }))
        return describe("the reduce op", [](const Request& r) { return std::string(ReduceOpName(r.reduce_op)); });
      if (differ([](const Request& r) { return r.prescale; }))
        return describe("prescale_factor", [](const Request& r) { return Num(r.prescale); });
      if (differ([](const Request& r) { return r.postscale; }))
        return describe("postscale_factor", [](const Request& r) { return Num(r.postscale); });
      if (first.reduce_op == ReduceOp::kAdasum) {
        if (first.dtype != DataType::kFloat16 && first.dtype != DataType::kFloat32 &&
            first.dtype != DataType::kFloat64)
          return label() + ": Adasum takes float16, float32 or float64 tensors, not " + DataTypeName(first.dtype);
        if ((size_ & (size_ - 1)) != 0)
          return label() + ": Adasum needs a power-of-2 number of ranks (1, 2, 4, 8, ...); this one has " +
                 std::to_string(size_);
      }
      if (first.type == RequestType::kAllreduce && differ([](const Request& r) { return r.group_size; }))
        return describe("the size of the group", [](const Request& r) { return std::to_string(r.group_size); });
      if (first.type == RequestType::kReducescatter) {
        if (first.reduce_op != ReduceOp::kSum && first.reduce_op != ReduceOp::kAverage &&
            first.reduce_op != ReduceOp::kAdasum)
          return label() + ": reducescatter supports Sum, Average and Adasum, not " + ReduceOpName(first.reduce_op);
        if (first.shape.empty()) return label() + ": reducescatter needs at least one dimension";
      }
      break;
    case RequestType::kBroadcast:
      if (differ([](const Request& r) { return r.root; }))
        return describe("the root rank", [](const Request& r) { return std::to_string(r.root); });
      if (first.root < 0 || first.root >= size_)
        return label() + ": root rank " + std::to_string(first.root) + " is outside the world of " +
               std::to_string(size_) + " ranks (valid: 0.." + std::to_string(size_ - 1) + ")";
      if (differ([](const Request& r) { return r.shape; })) return describe("the shape", shape_str);
      break;
    case RequestType::kAllgather:
    case RequestType::kAlltoall: {
      for (int r : present)
        if (p.requests[r].shape.empty())
          return label() + ": rank " + std::to_string(r) + " sent a scalar; " + op() +
                 " needs at least one dimension";
      if (differ([](const Request& r) { return r.shape.size(); }))
        return describe("the number of dimensions", shape_str);
      if (differ([](const Request& r) { return std::vector<int64_t>(r.shape.begin() + 1, r.shape.end()); }))
        return describe("the shape", tail_str);
      if (first.type == RequestType::kAlltoall) {
        for (int r : present) {
          const Request& q = p.requests[r];
          if (q.splits.empty()) {
            if (q.shape[0] % size_ != 0)
              return label() + ": rank " + std::to_string(r) + " has first dimension " +
                     std::to_string(q.shape[0]) + ", which does not divide evenly among " + std::to_string(size_) +
                     " ranks; pass splits";
            continue;
          }
          int64_t sum = 0;
          bool negative = false;
          for (int64_t s : q.splits) {
            sum += s;
            negative = negative || s < 0;
          }
          if (static_cast<int>(q.splits.size()) != size_ || negative || sum != q.shape[0])
            return label() + ": rank " + std::to_string(r) + " sent splits " + ShapeString(q.splits) +
                   ", which must be " + std::to_string(size_) + " non-negative counts summing to its first dimension " +
                   std::to_string(q.shape[0]);
        }
      }
      break;
    }
    case RequestType::kBarrier:
    case RequestType::kJoin:
      break;
  }
  return "";
}

Response Coordinator::MakeResponse(const std::string& name, const Pending& p, const std::string& error) const {
  const Request& q = p.requests[FirstRank(p.have)];
  Response resp = ResponseTo(q);
  resp.error = error;
  resp.names = {name};
  resp.cache_ids = {-1};
  if (!error.empty()) return resp;
  switch (q.type) {
    case RequestType::kAllreduce:
    case RequestType::kBroadcast:
    case RequestType::kReducescatter:
      resp.sizes = {NumElements(q.shape)};
      break;
    case RequestType::kAllgather:
      for (int r = 0; r < size_; ++r) resp.sizes.push_back(p.requests[r].shape[0]);
      break;
    case RequestType::kAlltoall:
      for (int r = 0; r < size_; ++r) {
        const Request& s = p.requests[r];
        for (int j = 0; j < size_; ++j)
          resp.sizes.push_back(s.splits.empty() ? s.shape[0] / size_ : s.splits[j]);
      }
      break;
    default:
      break;
  }
  return resp;
}

void Coordinator::RecordNegotiation(const std::string& name, RequestType type, const std::vector<char>& have,
                                    const std::vector<int64_t>& arrival_us, int64_t first_us, int64_t now_us) {
  if (!timeline_ || !timeline_->Active()) return;
  std::ostringstream args;
  args << "{\"ready_ranks_us\": {";
  bool first = true;
  for (int r = 0; r < size_; ++r) {
    if (!have[r]) continue;
    args << (first ? "" : ", ") << "\"" << r << "\": " << (arrival_us[r] - first_us);
    first = false;
  }
  args << "}";
  int last = -1;
  for (int r = 0; r < size_; ++r)
    if (have[r] && (last < 0 || arrival_us[r] > arrival_us[last])) last = r;
  args << ", \"last_rank\": " << last << "}";
  std::string phase = std::string("NEGOTIATE_") + RequestTypeName(type);
  for (auto& c : phase) c = static_cast<char>(std::toupper(c));
  timeline_->Phase(name, phase.c_str(), first_us, now_us, args.str());
}

// One round of the coordinator: the tensors that became ready on every rank, checked,
// fused and ordered. Four steps: collect what is ready (holding back grouped
// allreduces until their group is whole), negotiate each tensor (validate, build its
// response, give it a cache id), fuse, and put the result in execution order.
ResponseList Coordinator::TakeReady(bool hold_device) {
  if (ready_.empty() && !join_complete_) return {};  // the steady state: cycles carry it all
  const int64_t now = NowMicros();
  Round round;
  for (int r = 0; r < size_; ++r)
    if (joined_[r]) round.joined.push_back(r);
  std::vector<Item> batch = CollectReady(now, hold_device);
  for (Item& item : batch) {
    Response resp = Negotiate(item, round);
    Fuse(std::move(resp), item, round);
  }
  if (round.group_failed) FailGroupsOfFailedMembers();
  return Order(std::move(round));
}

// Ready tensors in the order they became ready. A grouped allreduce's members wait in
// groups_ until the whole group is ready, then go out together.
std::vector<Coordinator::Item> Coordinator::CollectReady(int64_t now, bool hold_device) {
  std::vector<Item> batch;
  std::vector<std::string> held;
  for (const std::string& name : ready_) {
    if (hold_device && KindOfDevice(ReadyDevice(name)) == DeviceKind::kCuda) {
      held.push_back(name);
      continue;
    }
    auto it = table_.find(name);
    if (it == table_.end()) continue;
    Pending p = std::move(it->second);
    table_.erase(it);
    RecordNegotiation(name, p.requests[FirstRank(p.have)].type, p.have, p.arrival_us, p.first_us, now);
    const Request& q = p.requests[FirstRank(p.have)];
    // A member whose ranks disagree on the group's size goes ahead at once (to fail
    // in Validate): gated, it could wait for a member some ranks never send.
    bool sizes_agree = true;
    for (int r = 0; r < size_; ++r)
      if (p.have[r] && p.requests[r].group_size != q.group_size) sizes_agree = false;
    if (q.type == RequestType::kAllreduce && q.group_id >= 0 && q.group_size > 1 && sizes_agree &&
        p.doomed.empty()) {
      auto& members = groups_[q.group_id];
      members.emplace_back(name, std::move(p));
      if (static_cast<int>(members.size()) >= q.group_size) {
        for (auto& m : members) batch.push_back(Item{std::move(m.first), std::move(m.second)});
        groups_.erase(q.group_id);
      }
      continue;
    }
    batch.push_back(Item{name, std::move(p)});
  }
  ready_ = std::move(held);
  return batch;
}

int32_t Coordinator::ReadyDevice(const std::string& name) const {
  auto it = table_.find(name);
  return it == table_.end() ? kCpuDevice : it->second.requests[FirstRank(it->second.have)].device;
}

// The response for one ready tensor: validated (an error response if the ranks
// disagree or one refused) and given a cache id.
Response Coordinator::Negotiate(const Item& item, Round& round) {
  const std::string& name = item.name;
  const Pending& p = item.p;
  // A doomed member that every rank sent keeps its own error if it has one (a rank
  // refused it); otherwise it fails for its group.
  std::string error = p.doomed.empty() || Complete(p) ? Validate(name, p) : p.doomed;
  if (error.empty()) error = p.doomed;
  Response resp = MakeResponse(name, p, error);
  const Request& q = p.requests[FirstRank(p.have)];
  if (!error.empty())
    for (int r = 0; r < size_; ++r)
      if (p.have[r] && p.requests[r].group_id >= 0) {
        failed_groups_.emplace(std::make_pair(r, p.requests[r].group_id), error);
        round.group_failed = true;
      }
  if (config_->tunables().cache_enabled && error.empty() && round.joined.empty() && ResponseCache::Cacheable(q)) {
    resp.cache_ids[0] = cache_->Lookup(q);
    if (resp.cache_ids[0] < 0) resp.cache_ids[0] = cache_->AssignId(name);
  }
  return resp;
}

// Adds `resp` to the round, folded into an open fused response where it fits: small
// allgathers of any dtype into one (the backend packs and unpacks them), allreduces
// with the same dtype, op, scaling and kind of device into one, reducescatters alike,
// up to the limits the backend for that kind of device declared. Errors and other
// collectives go alone.
void Coordinator::Fuse(Response resp, const Item& item, Round& round) {
  const FusionLimits& limits = config_->fusion(KindOfDevice(resp.device));
  if (resp.error.empty() && resp.type == RequestType::kAllgather) {
    const int64_t bytes = GatheredBytes(item.p.requests[FirstRank(item.p.have)], resp.sizes);
    const bool small = bytes < limits.allgather_tensor_bytes;
    OpenGather* slot = nullptr;
    for (OpenGather& g : round.open_gathers)
      if (KindOfDevice(round.responses[g.index].device) == KindOfDevice(resp.device)) slot = &g;
    if (small && slot && slot->bytes + bytes <= limits.allgather_bytes) {
      Response& f = round.responses[slot->index];
      f.names.push_back(resp.names[0]);
      f.sizes.insert(f.sizes.end(), resp.sizes.begin(), resp.sizes.end());
      f.cache_ids.push_back(-1);
      slot->bytes += bytes;
      return;
    }
    if (small) {
      if (slot) *slot = OpenGather{static_cast<int>(round.responses.size()), bytes};
      else round.open_gathers.push_back(OpenGather{static_cast<int>(round.responses.size()), bytes});
    }
  }
  // Adasum's dot products are per tensor: it is never fused. Reducescatters fuse where
  // the backend can and no rank has joined (a joined rank has no shares to give).
  const bool scatter = resp.type == RequestType::kReducescatter && limits.reducescatter_bytes > 0 &&
                       round.joined.empty();
  if (!resp.error.empty() || (resp.type != RequestType::kAllreduce && !scatter) ||
      resp.reduce_op == ReduceOp::kAdasum) {
    round.responses.push_back(std::move(resp));
    return;
  }
  if (!scatter) resp.joined_ranks = round.joined;
  const int64_t limit = scatter ? limits.reducescatter_bytes : limits.allreduce_bytes;
  const int64_t bytes = resp.sizes[0] * DataTypeSize(resp.dtype);
  auto slot = std::find_if(round.open.begin(), round.open.end(),
                           [&](const OpenAllreduce& o) { return SameFusionKey(round.responses[o.index], resp); });
  if (slot != round.open.end() && slot->bytes + bytes <= limit) {
    Response& f = round.responses[slot->index];
    f.names.push_back(resp.names[0]);
    f.sizes.push_back(resp.sizes[0]);
    f.cache_ids.push_back(resp.cache_ids[0]);
    slot->bytes += bytes;
    return;
  }
  if (slot != round.open.end()) round.open.erase(slot);
  round.open.push_back(OpenAllreduce{static_cast<int>(round.responses.size()), bytes});
  round.responses.push_back(std::move(resp));
}

// A failed member fails the rest of its group: members waiting for their group,
// members some ranks have not sent (they may never, if the ranks disagree on the
// group), and members that reach rank 0 later (AddRequest dooms those). They are
// answered in the next response list.
void Coordinator::FailGroupsOfFailedMembers() {
  for (auto& [name, p] : table_)
    if (p.doomed.empty())
      if (const std::string* why = FailedGroup(p)) Doom(name, p, *why);
  for (auto g = groups_.begin(); g != groups_.end();) {
    const std::string* why = g->second.empty() ? nullptr : FailedGroup(g->second.front().second);
    if (!why) {
      ++g;
      continue;
    }
    for (auto& [name, p] : g->second) {
      Doom(name, p, *why);
      table_.emplace(name, std::move(p));
    }
    g = groups_.erase(g);
  }
}

// Execution order: as negotiated, and a join that every rank has reached last.
ResponseList Coordinator::Order(Round round) {
  ResponseList out;
  out.responses = std::move(round.responses);
  if (join_complete_) {
    Response j;
    j.type = RequestType::kJoin;
    j.last_joined = last_joined_;
    out.responses.push_back(j);
    joined_.assign(size_, 0);
    joined_count_ = 0;
    join_complete_ = false;
  }
  return out;
}

std::string Coordinator::CheckStalls(int64_t now_us, std::vector<int>* overdue) {
  if (params_.stall_check_seconds <= 0) return "";
  std::string reason;
  std::vector<char> late(static_cast<size_t>(size_), 0);
  for (auto& [name, p] : table_)
    ReportStall(p.requests[FirstRank(p.have)].type, name, p.have, p.first_us, &p.last_warn_us, now_us, &reason,
                &late);
  for (auto& [id, w] : cached_waits_) {
    int64_t first_us = now_us;
    for (int r = 0; r < size_; ++r)
      if (w.have[r]) first_us = std::min(first_us, w.since_us[r]);
    ReportStall(w.type, w.name, w.have, first_us, &w.last_warn_us, now_us, &reason, &late);
  }
  if (overdue)
    for (int r = 0; r < size_; ++r)
      if (late[static_cast<size_t>(r)]) overdue->push_back(r);
  // Members of a grouped allreduce that every rank submitted, held for the rest of
  // their group: a member no rank has submitted is in no table, so say it here.
  for (auto& [gid, members] : groups_) {
    if (members.empty()) continue;
    Pending& first = members.front().second;
    const int group_size = first.requests[FirstRank(first.have)].group_size;
    std::ostringstream os;
    os << "grouped allreduce '" << members.front().first << "' (and " << members.size() - 1
       << " more) has waited " << (now_us - first.first_us) / 1000000 << " s for the other "
       << group_size - static_cast<int>(members.size()) << " of its " << group_size
       << " members, which no rank has submitted: check that every rank submits the whole group";
    WarnOfStall(os.str(), now_us - first.first_us, &first.last_warn_us, now_us, &reason);
  }
  return reason;
}

bool Coordinator::WarnOfStall(const std::string& what, int64_t waited_us, int64_t* last_warn_us, int64_t now_us,
                              std::string* reason) const {
  const int64_t check_us = static_cast<int64_t>(params_.stall_check_seconds * 1e6);
  const int64_t shutdown_us = static_cast<int64_t>(params_.stall_shutdown_seconds * 1e6);
  if (waited_us < check_us) return false;
  if (now_us - *last_warn_us >= check_us) {  // warn once per check interval
    HVD_WARN("stall detected: " << what);
    *last_warn_us = now_us;
  }
  if (shutdown_us <= 0 || waited_us < shutdown_us) return false;
  if (reason->empty())
    *reason = "hvdlite shut down after a stall of " + std::to_string(waited_us / 1000000) + " s: " + what;
  return true;
}

// Warns (once per check interval) about a tensor that some ranks submitted long ago
// and others not; sets `reason` when the stall has lasted past the shutdown limit.
void Coordinator::ReportStall(RequestType type, const std::string& name, const std::vector<char>& have,
                              int64_t first_us, int64_t* last_warn_us, int64_t now_us, std::string* reason,
                              std::vector<char>* overdue) const {
  const int64_t waited = now_us - first_us;
  if (waited < static_cast<int64_t>(params_.stall_check_seconds * 1e6)) return;
  std::vector<int> present, missing;
  for (int r = 0; r < size_; ++r) {
    if (have[r]) present.push_back(r);
    else if (!joined_[r]) missing.push_back(r);
  }
  std::ostringstream os;
  os << RequestTypeName(type) << " '" << name << "' has waited " << waited / 1000000
     << " s: submitted by ranks " << RankList(present) << ", missing ranks " << config_->RankNames(missing)
     << ". One or more ranks did not submit this tensor: check that every rank runs the same "
        "collectives with the same names (a rank that is stopped, hung or cut off from the network "
        "submits nothing)";
  if (WarnOfStall(os.str(), waited, last_warn_us, now_us, reason))
    for (int r : missing) (*overdue)[static_cast<size_t>(r)] = 1;
}

}  // namespace hvdlite
