#include "negotiation/cache_cycle.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "kernels/reduce.h"

namespace hvdlite {
namespace {

constexpr int kHeaderWords = 2;
constexpr uint64_t kEvictAllFlag = 1;
// Cycles that find nothing ready on every rank are started again at once this many
// times in a row; after that with a pause that doubles from kFirstPauseUs up to the cap.
// Ranks whose ready tensors differ for long are stalled, and they should not spin.
constexpr int kFreeRetries = 64;
constexpr int64_t kFirstPauseUs = 10;

bool SameFusionKey(const Request& a, const Request& b) {
  return a.type == b.type && a.dtype == b.dtype && a.reduce_op == b.reduce_op && a.prescale == b.prescale &&
         a.postscale == b.postscale && KindOfDevice(a.device) == KindOfDevice(b.device);
}

}  // namespace

CacheCycle::CacheCycle(ControlTransport* control, const Config* config)
    : words_(static_cast<int>((std::max<int64_t>(config->job().cache_capacity, 1) + 63) / 64)),
      config_(config),
      bits_(control->NewBitAgreement(kHeaderWords + 2 * words_, kMaxCarriedBytes)),
      mine_(kHeaderWords + 2 * words_) {}

void CacheCycle::Outcome::Clear() {
  cycle = lists_before = done_us = 0;
  ready.clear();
  evict_all = false;
  evicted.clear();
  moved.clear();
  since_us.clear();
  reduced_id = -1;
  reduced = nullptr;
}

bool CacheCycle::CanCarry(const Request& r) {
  const int64_t bytes = NumElements(r.shape) * DataTypeSize(r.dtype);
  return r.type == RequestType::kAllreduce && KindOfDevice(r.device) == DeviceKind::kHost &&
         (r.reduce_op == ReduceOp::kSum || r.reduce_op == ReduceOp::kAverage) && bytes > 0 &&
         bytes <= kMaxCarriedBytes;
}

void CacheCycle::AddReady(int32_t id, Request request, int64_t now_us, const void* input) {
  // An id is ready at most once: its name cannot be in flight twice.
  if (!ready_.empty() && id < ready_.back().first) unsorted_ = true;
  ready_.emplace_back(id, Ready{std::move(request), now_us, input});
  changed_ = true;
}

void CacheCycle::SortReady() {
  if (!unsorted_) return;
  std::sort(ready_.begin(), ready_.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  unsorted_ = false;
}

bool CacheCycle::MaybeStart(int64_t lists_sent, bool must, bool cache_empty, int64_t now_us) {
  if (bits_->Active()) return false;
  const bool announce = !evict_.empty() || (evict_all_ && !cache_empty);
  if (!must && !announce) {
    if (ready_.empty()) return false;
    if (!changed_ && fruitless_ > kFreeRetries) {
      const int doublings = std::min(fruitless_ - kFreeRetries, 30);
      const int64_t pause = std::min(std::max(config_->cycle_time_us(), kFirstPauseUs), kFirstPauseUs << doublings);
      if (now_us - last_done_us_ < pause) return false;
    }
  }
  SortReady();
  std::fill(mine_.begin(), mine_.end(), 0);
  mine_[0] = lists_sent >= 0 ? static_cast<uint64_t>(lists_sent) : ~uint64_t{0};
  mine_[1] = ~(evict_all_ ? kEvictAllFlag : uint64_t{0});
  uint64_t* ready_bits = &mine_[kHeaderWords];
  uint64_t* evict_bits = &mine_[kHeaderWords + words_];
  for (const auto& [id, r] : ready_) ready_bits[id / 64] |= uint64_t{1} << (id % 64);
  std::fill(evict_bits, evict_bits + words_, ~uint64_t{0});
  for (int32_t id : evict_) evict_bits[id / 64] &= ~(uint64_t{1} << (id % 64));
  // The first ready tensor a cycle can carry goes along; if every rank picks the same
  // one, it is reduced by the time the cycle completes.
  uint64_t key = 0;
  int64_t count = 0;
  DataType dtype = DataType::kFloat32;
  const void* payload = nullptr;
  if (!evict_all_) {
    for (const auto& [id, r] : ready_) {
      if (!r.input || evict_.count(id)) continue;
      count = NumElements(r.request.shape);
      dtype = r.request.dtype;
      payload = r.input;  // the agreement copies it at Start
      if (r.request.prescale != 1.0) {
        carried_.resize(static_cast<size_t>(count * DataTypeSize(dtype)));
        ScaleCopy(carried_.data(), r.input, count, dtype, r.request.prescale);
        payload = carried_.data();
      }
      key = static_cast<uint64_t>(id) + 1;
      break;
    }
  }
  announced_.swap(evict_);
  evict_.clear();
  changed_ = false;
  ++started_;
  bits_->Start(mine_.data(), key, payload, count, dtype);
  return true;
}

bool CacheCycle::Poll(const ResponseCache& cache, int64_t now_us, Outcome* out) {
  if (!bits_->Active() || !bits_->Progress()) return false;
  const uint64_t* v = bits_->Result();
  out->Clear();
  out->cycle = ++completed_;
  out->done_us = now_us;
  out->lists_before = static_cast<int64_t>(v[0]);
  out->evict_all = (~v[1] & kEvictAllFlag) != 0;
  const uint64_t* ready_bits = &v[kHeaderWords];
  const uint64_t* evict_bits = &v[kHeaderWords + words_];
  for (int w = 0; w < words_; ++w) {
    uint64_t e = ~evict_bits[w];
    while (e) {
      const int b = __builtin_ctzll(e);
      out->evicted.push_back(w * 64 + b);
      e &= e - 1;
    }
  }
  announced_.clear();
  SortReady();
  const bool waited = !ready_.empty();
  auto is_evicted = [&](int32_t id) {
    return out->evict_all || std::binary_search(out->evicted.begin(), out->evicted.end(), id);
  };
  // A grouped allreduce travels as a whole (Engine::Route): when one member's entry is
  // evicted, its ready partners here go to rank 0 with it, even one every rank agreed
  // on in this cycle (then every rank had the whole group ready, and moves it too).
  // Split, the members sent in full would wait at rank 0 for partners run here.
  // (With evict_all every ready entry leaves anyway; without evictions none does.)
  std::unordered_set<int32_t> split_groups;
  if (!out->evict_all && !out->evicted.empty())
    for (const auto& [id, r] : ready_)
      if (r.request.group_id >= 0 && r.request.group_size > 1 && is_evicted(id))
        split_groups.insert(r.request.group_id);
  std::vector<int32_t>& ids = out->ready;
  auto kept = ready_.begin();  // what stays ready here is moved up, in order
  for (auto it = ready_.begin(); it != ready_.end(); ++it) {
    const int32_t id = it->first;
    const Request& q = it->second.request;
    const bool evicted = is_evicted(id) || (q.group_id >= 0 && split_groups.count(q.group_id) > 0);
    if (evicted) {
      out->moved.push_back(std::move(it->second.request));
    } else if (ready_bits[id / 64] >> (id % 64) & 1) {
      ids.push_back(id);
      out->since_us.emplace_back(id, it->second.since_us);
    } else {
      if (kept != it) *kept = std::move(*it);
      ++kept;
    }
  }
  ready_.erase(kept, ready_.end());
  // Every rank sent the same tensor along (and nobody evicts it): it is reduced.
  const uint64_t key = bits_->ResultKey();
  if (key != 0) {
    auto it = std::find(ids.begin(), ids.end(), static_cast<int32_t>(key - 1));
    if (it != ids.end()) {
      out->reduced_id = *it;
      out->reduced = bits_->ResultPayload();
      ids.erase(it);
    }
  }
  // out->ready is fused by the engine once rank 0's earlier lists ran (Collectives).
  if (!ids.empty() || !out->moved.empty() || !waited) fruitless_ = 0;
  else ++fruitless_;
  last_done_us_ = now_us;
  return true;
}

// The ready entries as collectives, the same on every rank: in id order, allreduces
// (and reducescatters) that are reduced and scaled alike fused up to the device's
// limit, small allgathers on
// one kind of device fused up to theirs (as the coordinator fuses them), everything
// else alone. (Ids are given out in the order tensors were first negotiated, which for
// gradients is the order the backward pass produces them.)
std::vector<std::vector<int32_t>> CacheCycle::Fuse(const std::vector<int32_t>& ids,
                                                   const ResponseCache& cache) const {
  std::vector<std::vector<int32_t>> out;
  struct Open {
    size_t index;
    int64_t bytes;
  };
  std::vector<Open> open;
  Open gathers[kNumDeviceKinds] = {{0, -1}, {0, -1}};  // bytes -1: none open
  for (int32_t id : ids) {
    const Request& q = cache.Get(id);
    const FusionLimits& limits = config_->fusion(KindOfDevice(q.device));
    if (q.type == RequestType::kAllgather) {
      const int64_t bytes = GatheredBytes(q, cache.Sizes(id));
      Open& g = gathers[static_cast<int>(KindOfDevice(q.device))];
      if (bytes >= limits.allgather_tensor_bytes) {
        out.push_back({id});
      } else if (g.bytes >= 0 && g.bytes + bytes <= limits.allgather_bytes) {
        out[g.index].push_back(id);
        g.bytes += bytes;
      } else {
        g = Open{out.size(), bytes};
        out.push_back({id});
      }
      continue;
    }
    const bool scatter = q.type == RequestType::kReducescatter && limits.reducescatter_bytes > 0;
    if ((q.type != RequestType::kAllreduce && !scatter) || q.reduce_op == ReduceOp::kAdasum) {
      out.push_back({id});
      continue;
    }
    const int64_t bytes = NumElements(q.shape) * DataTypeSize(q.dtype);
    const int64_t limit = scatter ? limits.reducescatter_bytes : limits.allreduce_bytes;
    auto slot = std::find_if(open.begin(), open.end(),
                             [&](const Open& o) { return SameFusionKey(cache.Get(out[o.index].front()), q); });
    if (slot != open.end() && slot->bytes + bytes <= limit) {
      out[slot->index].push_back(id);
      slot->bytes += bytes;
      continue;
    }
    if (slot != open.end()) open.erase(slot);
    open.push_back(Open{out.size(), bytes});
    out.push_back({id});
  }
  return out;
}

std::vector<std::pair<int32_t, int64_t>> CacheCycle::WaitingSince(int64_t before_us) const {
  std::vector<std::pair<int32_t, int64_t>> out;
  for (const auto& [id, r] : ready_)
    if (r.since_us < before_us) out.emplace_back(id, r.since_us);
  return out;
}

}  // namespace hvdlite
