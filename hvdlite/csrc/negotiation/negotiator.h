// The negotiation of one engine: which of this rank's requests every rank has made, so
// that they can run, in one order that every rank follows.
//
// Two channels agree on collectives. Rank 0's coordinator negotiates every tensor it
// has not seen (requests in full, answered by response lists), and the cache cycles
// agree on tensors the response cache knows (a bit per tensor, no rank 0). The
// negotiator routes each request to one of them and merges what both agree on into one
// ordered stream, handed to an AgreedWork (the executor): rank 0's lists sent before a
// cycle started run before that cycle's tensors, the lists sent while it was in flight
// after them. It also runs the shutdown and failure protocol (shutdown.h), the stall
// reports, and on rank 0 the autotuner's decisions, carried in the lists so that every
// rank applies them at the same point of the order.
//
// It holds no MPI: it talks through a ControlTransport. Called on the engine's thread
// (or by a caller driving the engine, under the engine's lock), except ProposeTunables
// and OnTunablesApplied.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config.h"
#include "common/message.h"
#include "common/tensor_queue.h"
#include "common/timeline.h"
#include "negotiation/agreed_work.h"
#include "negotiation/autotune.h"
#include "negotiation/cache_cycle.h"
#include "negotiation/coordinator.h"
#include "negotiation/response_cache.h"
#include "negotiation/shutdown.h"
#include "transport/control_transport.h"

namespace hvdlite {

class Negotiator {
 public:
  // `process_set`: the id of the set this engine serves (0: the world). Everything
  // pointed to outlives the negotiator. Collective (the cycles' channel).
  Negotiator(ControlTransport* control, Config* config, TensorQueue* queue, Timeline* timeline, AgreedWork* work,
             int32_t process_set);

  int rank() const { return rank_; }
  int size() const { return size_; }

  // One round: routes this rank's new requests, takes in and answers messages, moves
  // the cycles on, and hands on what became agreed. `stop_requested`: this rank shuts
  // down. True if anything happened.
  bool Step(bool stop_requested);
  // Forgets control messages that have left (after each step).
  void Reap() { control_->Reap(false); }

  const ShutdownState& shutdown() const { return shutdown_; }
  // Rank 0: the ranks to evict for missing collectives past the stall shutdown time
  // (EvictInstead); empty elsewhere. Any thread.
  std::vector<int> StalledRanks() const;
  // Rank 0 announced the shutdown and every worker acknowledged it.
  bool Finished() { return rank_ == 0 && shutdown_.Finished(size_, NowMicros()); }
  bool CycleInFlight() const { return cycle_->InFlight(); }

  // A failure on this rank that the others must hear of (a GPU collective failed, or
  // never finished): the job shuts down everywhere, device work aborted.
  void Fail(const std::string& reason);
  // A peer died: the negotiation stops without the handshake (the caller revokes the
  // communicators, so every other rank hears of it at its next call).
  void PeerFailed(const std::string& reason) { shutdown_.PeerFailed(reason); }
  // The engine itself failed.
  void EngineFailed(const std::string& reason) { shutdown_.EngineFailed(reason); }
  // The reason for a stop that gave none.
  void DefaultReason(const std::string& reason) { shutdown_.DefaultReason(reason); }
  // Every call on the transport's channels fails from now on, on every rank (ULFM).
  void Revoke();
  // The engine has stopped: a cycle in flight is abandoned, every send is waited for.
  void Close();

  // HOROVOD_AUTOTUNE with process sets: the settings the global set's tuner chose, for
  // this set to take up (sent by the set's rank 0 in its next list, so that every member
  // applies them at the same point). Any thread; ignored except on the set's rank 0.
  void ProposeTunables(const Tunables& t);
  // Called on this engine's thread, on every rank, with the settings just applied.
  void OnTunablesApplied(std::function<void(const Tunables&)> fn);
  // HOROVOD_AUTOTUNE: rank 0 of the global set starts its tuner. `two_level_possible`:
  // some backend can run a two-level allreduce here.
  void StartTuning(bool two_level_possible);
  // Rank 0 of the global set, with HOROVOD_AUTOTUNE: a collective ran (its tensors'
  // names, and the bytes they held).
  bool Tuning() const { return tuner_ != nullptr; }
  void Tune(const std::vector<std::string>& names, int64_t bytes);

  struct Stats {
    int64_t requests_in_full = 0;
    int64_t requests_as_ids = 0;
    int64_t cycles = 0;
  };
  Stats GetStats() const;

 private:
  bool CoordinatorStep(bool stop_requested);
  bool WorkerStep(bool stop_requested);
  // A new request of this rank: into the next cycle if its signature is cached, else
  // to rank 0 (appended to `to_coordinator` on the other ranks). A member of a grouped
  // allreduce waits for the rest of its group, and the group goes one way as a whole:
  // into the cycle if every member is cached, else every member to rank 0 (whose
  // coordinator holds a group until it is whole).
  // `input`: where this rank's tensor is (TensorQueue::New).
  void Route(Request r, const void* input, int64_t now, RequestList* to_coordinator);
  void RouteOne(Request r, const void* input, int64_t now, RequestList* to_coordinator);
  // A request whose signature is cached under `id`: into the next cycle.
  void ToCycle(int32_t id, Request r, const void* input, int64_t now);
  void RouteInFull(Request r, int64_t now, RequestList* to_coordinator);
  // Sends the members of groups held longer than kGroupHoldMicros to rank 0 in full.
  bool FlushHeldGroups(int64_t now, RequestList* to_coordinator);
  // Starts and moves on the cycles; runs what a completed one agreed on.
  bool CycleStep(int64_t now);
  void RunCycle(CacheCycle::Outcome& out);
  // Workers: runs the response lists received whose turn has come; with `upto`, first
  // waits for (and runs) rank 0's lists up to that count. False once stopped.
  bool RunReceivedLists(int64_t upto = -1);
  // A response list from rank 0 (or the shutdown); false once this rank stopped.
  bool TakeResponse(std::vector<uint8_t>& buf);
  void SendStallReports(int64_t now);
  // A worker: true when rank 0 has stayed silent past the stall limit (this rank then
  // stopped).
  bool CoordinatorSilent(int64_t now);
  // Rank 0: whether the ranks `overdue` are to be evicted instead of a shutdown.
  bool EvictInstead(const std::vector<int>& overdue);
  // Rank 0: the job shuts down (shutdown.h, Begin).
  void BeginShutdown(const std::string& reason, bool failure, bool hold = false);
  void AnnounceShutdown();  // rank 0: tells every worker
  void StopWorker();        // a worker: acknowledges the shutdown and stops
  void Send(const RequestList& list);
  // A response list: its tunables first, then its responses.
  void Execute(const ResponseList& list);
  // The autotuner's settings, applied on every rank at the same point of the order.
  void ApplyTunables(const Tunables& t);
  // Runs one agreed response: remembers the signatures it agreed on under the ids the
  // coordinator assigned (unless `cached`: a cycle's, known already), notes a completed
  // join, and hands it on.
  void Run(const Response& r, bool cached = false);
  Response FromCache(const std::vector<int32_t>& ids) const;
  // What response `r` says of every rank's part of its `i`-th tensor (allgather rows,
  // alltoall splits); empty for the other kinds.
  static std::vector<int64_t> PartsOf(const Response& r, size_t i);
  // New tensors get response-cache entries (the autotuner may turn it off).
  bool Caching() const { return config_->tunables().cache_enabled != 0; }

  ControlTransport* control_;
  Config* config_;
  TensorQueue* queue_;
  Timeline* timeline_;
  AgreedWork* work_;
  int32_t process_set_;
  int rank_, size_;
  ResponseCache cache_;
  std::unique_ptr<Coordinator> coordinator_;  // rank 0 only
  std::unique_ptr<CacheCycle> cycle_;
  CacheCycle::Outcome outcome_;  // the cycle being run, kept for its lists' capacity
  std::vector<TensorQueue::New> fresh_;  // the requests a step took from the queue
  ShutdownState shutdown_;

  // Members of grouped allreduces held until this rank has submitted the whole group
  // (see Route), by group id, and since when.
  struct PartialGroup {
    int64_t since_us = 0;
    std::vector<Request> members;
  };
  std::unordered_map<int32_t, PartialGroup> partial_groups_;
  static constexpr int64_t kGroupHoldMicros = 1000000;

  int64_t lists_sent_ = 0;            // rank 0: response lists sent so far
  std::list<ResponseList> deferred_;  // rank 0: lists to run after the cycle in flight
  std::list<ResponseList> received_;  // workers: lists received, not yet run
  int64_t lists_run_ = 0;             // workers: lists run so far
  int64_t cycles_run_ = 0;            // cycles whose tensors this rank has run
  bool join_outstanding_ = false;     // this rank's join has not completed

  // HOROVOD_AUTOTUNE (autotune.h): rank 0's tuner, and the settings it chose and has not
  // sent yet.
  std::unique_ptr<Autotuner> tuner_;
  std::optional<Tunables> tunables_to_send_;
  // Settings proposed by another thread (ProposeTunables), and whom to tell when new
  // ones apply; under tunables_mu_.
  mutable std::mutex tunables_mu_;
  std::atomic<bool> has_proposal_{false};
  std::optional<Tunables> proposed_;
  std::function<void(const Tunables&)> on_tunables_;

  int64_t last_stall_check_us_ = 0;
  mutable std::mutex stalled_mu_;
  std::vector<int> stalled_;  // EvictInstead's ranks, under stalled_mu_
  int64_t last_relay_us_ = 0;  // when this rank last sent rank 0 relayed timeline records
  std::atomic<int64_t> requests_in_full_{0}, requests_as_ids_{0};
};

}  // namespace hvdlite
