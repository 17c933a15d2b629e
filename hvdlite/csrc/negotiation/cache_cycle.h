// Steady-state negotiation without rank 0. Once a tensor's signature is in the response
// cache, the ranks agree that it is ready everywhere through a *cycle*: one
// BitAgreement (transport/control_transport.h) of a small vector with a bit per cache id, instead of a request to rank 0
// and rank 0's answer. Rank 0 still negotiates everything new; the negotiator runs its
// response lists and the cycles in one order that every rank follows (see
// docs/architecture.md, "Negotiation").
//
// The vector, combined with AND (fields that mean "any rank" are stored inverted):
//   word 0   the number of response lists rank 0 had sent when it started this cycle
//            (every other rank puts all ones)
//   word 1   flags, inverted; bit 0: evict every entry (a rank has joined)
//   W words  one bit per cache id: this rank has that tensor ready
//   W words  one bit per cache id, inverted: evict that entry (a rank's request no
//            longer matches it)
// Every rank evicts the same entries after the same cycle, and its ready requests for
// them go to rank 0 in full from then on; that keeps the ranks' caches alike at every
// cycle, which is what lets one bit stand for one signature.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <vector>

#include "common/config.h"
#include "common/message.h"
#include "negotiation/response_cache.h"
#include "transport/control_transport.h"

namespace hvdlite {

class CacheCycle {
 public:
  // What one completed cycle asks of the engine, identical on every rank except `moved`.
  struct Outcome {
    int64_t cycle = 0;         // its number: 1, 2, ...
    int64_t lists_before = 0;  // rank 0's response lists that run before this cycle's tensors
    std::vector<int32_t> ready;  // ready on every rank, in id order: see Collectives
    bool evict_all = false;
    std::vector<int32_t> evicted;  // entries every rank evicts now (with evict_all: all)
    std::vector<Request> moved;    // this rank's ready requests for evicted entries
    // When each of this rank's agreed tensors became ready here (for the timeline): in
    // the order of ids the cycle agreed on, the carried one included.
    std::vector<std::pair<int32_t, int64_t>> since_us;
    int64_t done_us = 0;  // when the cycle was seen complete
    // A tensor reduced inside the cycle itself (see CanCarry): its id (-1: none) and
    // its sum over all ranks before postscale, valid until the next cycle starts.
    int32_t reduced_id = -1;
    const void* reduced = nullptr;

    // Empties it for the next cycle, keeping what its lists have allocated.
    void Clear();
  };

  // The largest tensor a cycle carries. A tensor that every rank sends along in the
  // same cycle is reduced there and needs no collective of its own: a lone small
  // allreduce costs one exchange between ranks instead of two.
  static constexpr int64_t kMaxCarriedBytes = 16 * 1024;
  // Whether a cycle can carry this request's tensor: a Sum or Average allreduce of at
  // most kMaxCarriedBytes in host memory.
  static bool CanCarry(const Request& r);

  // Collective over `control` (a channel of its own for the agreement). `config`: the
  // engine's (which outlives the cycle): the response cache's capacity, what may be
  // fused per kind of device, and the cycle time, the longest pause between cycles that
  // keep finding nothing ready on every rank.
  CacheCycle(ControlTransport* control, const Config* config);

  // A request of this rank that matched cache entry `id`. `input`: its data, if a cycle
  // may carry it (CanCarry), else null.
  void AddReady(int32_t id, Request request, int64_t now_us, const void* input = nullptr);
  // This rank has a request under the name of entry `id` that no longer matches it.
  void Evict(int32_t id) { evict_.insert(id); }
  // While on (this rank's join is outstanding), every cycle it starts asks every rank to
  // evict every entry: joined ranks take part through rank 0 only.
  void SetEvictAll(bool on) { evict_all_ = on; }
  bool HasReady() const { return !ready_.empty(); }
  bool InFlight() const { return bits_->Active(); }
  int64_t started() const { return started_; }
  int64_t completed() const { return completed_; }

  // Starts the next cycle if this rank has a reason to: ready tensors (pausing a little
  // when cycles keep finding nothing), something to evict, or `must` (another rank
  // waits in a cycle this rank has not started). `lists_sent`: rank 0's count.
  bool MaybeStart(int64_t lists_sent, bool must, bool cache_empty, int64_t now_us);
  // Moves the cycle on; true when it completed, with `out` filled in.
  bool Poll(const ResponseCache& cache, int64_t now_us, Outcome* out);
  // A completed cycle's ready tensors as collectives, fused, in the order every rank
  // runs them. Called once rank 0's lists that precede the cycle have run: one of
  // them may have changed what may be fused (the autotuner), so fusing at Poll could
  // differ between rank 0 and the others.
  std::vector<std::vector<int32_t>> Collectives(const std::vector<int32_t>& ready, const ResponseCache& cache) const {
    return Fuse(ready, cache);
  }
  // This rank's ready tensors that have waited since before `before_us`: (id, since).
  std::vector<std::pair<int32_t, int64_t>> WaitingSince(int64_t before_us) const;
  void Cancel() { bits_->Cancel(); }
  void Revoke() { bits_->Revoke(); }  // after a peer failed

 private:
  struct Ready {
    Request request;
    int64_t since_us;
    const void* input;
  };
  std::vector<std::vector<int32_t>> Fuse(const std::vector<int32_t>& ids, const ResponseCache& cache) const;

  int words_;  // per bit field
  const Config* config_;
  std::unique_ptr<BitAgreement> bits_;
  std::vector<uint64_t> mine_;
  std::vector<uint8_t> carried_;  // the tensor this rank sends along, when it is prescaled
  // By cache id, in id order once SortReady ran: a list rather than a map, so that a
  // tensor's turn through the cycle allocates nothing in the steady state. Tensors
  // usually become ready in id order (the order they were first negotiated in).
  std::vector<std::pair<int32_t, Ready>> ready_;
  bool unsorted_ = false;
  void SortReady();
  std::set<int32_t> evict_;         // to announce
  std::set<int32_t> announced_;     // announced in the cycle in flight
  bool evict_all_ = false;
  bool changed_ = false;  // tensors became ready since the last cycle started
  int fruitless_ = 0;     // cycles in a row that found nothing to do while this rank waited
  int64_t last_done_us_ = 0;
  int64_t started_ = 0, completed_ = 0;
};

}  // namespace hvdlite
