#include "negotiation/negotiator.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <sstream>
#include <thread>

#include "common/logging.h"

namespace hvdlite {
namespace {

constexpr int64_t kStallCheckEveryMicros = 1000000;
// How often a rank sends rank 0 the timeline records it relays (it also sends them when
// it leaves), so that rank 0's trace shows every process set's collectives soon.
constexpr int64_t kRelayEveryMicros = 50000;
// How long rank 0, failing, listens for a worker's report of the failure's cause.
constexpr int64_t kPeerReportGraceMicros = 200000;
// How long rank 0, shutting down for a stall, waits for the workers' acknowledgements.
constexpr int64_t kAcknowledgeMicros = 2000000;

std::string Seconds(double s) {
  std::ostringstream os;
  os << s;
  return os.str();
}

std::shared_ptr<const std::vector<uint8_t>> Bytes(std::vector<uint8_t> v) {
  return std::make_shared<const std::vector<uint8_t>>(std::move(v));
}

}  // namespace

Negotiator::Negotiator(ControlTransport* control, Config* config, TensorQueue* queue, Timeline* timeline,
                       AgreedWork* work, int32_t process_set)
    : control_(control), config_(config), queue_(queue), timeline_(timeline), work_(work),
      process_set_(process_set), rank_(control->rank()), size_(control->size()),
      cache_(config->job().cache_capacity) {
  if (rank_ == 0) coordinator_ = std::make_unique<Coordinator>(size_, config_, &cache_, timeline_);
  cycle_ = std::make_unique<CacheCycle>(control_, config_);
}

void Negotiator::StartTuning(bool two_level_possible) {
  if (rank_ == 0 && process_set_ == 0 && config_->job().autotune)
    tuner_ = std::make_unique<Autotuner>(config_->tunables(), two_level_possible, config_->job().autotune_options);
}

Negotiator::Stats Negotiator::GetStats() const {
  Stats s;
  s.requests_in_full = requests_in_full_;
  s.requests_as_ids = requests_as_ids_;
  s.cycles = cycle_->completed();
  return s;
}

void Negotiator::Revoke() {
  control_->Revoke();
  cycle_->Revoke();
}

void Negotiator::Close() {
  cycle_->Cancel();
  control_->Reap(true);
}

namespace {
// The names of a list's requests, for debug logs.
std::string NamesOf(const std::vector<Request>& requests) {
  std::string out;
  for (const Request& r : requests) out += (out.empty() ? "" : ", ") + r.name;
  return out;
}
}  // namespace

void Negotiator::Send(const RequestList& list) {
  if (!list.requests.empty()) HVD_DEBUG("requests to rank 0: " << NamesOf(list.requests));
  control_->SendToCoordinator(Bytes(Serialize(list)));
}

bool Negotiator::Step(bool stop_requested) {
  if (shutdown_.Stopped()) return false;
  return rank_ == 0 ? CoordinatorStep(stop_requested) : WorkerStep(stop_requested);
}

// ---- Shutdown and failure (the states and transitions are Shutdown's) ----

void Negotiator::BeginShutdown(const std::string& reason, bool failure, bool hold) {
  if (!shutdown_.Begin(reason, failure, hold, NowMicros())) return;
  if (failure) work_->Abort(reason);
  AnnounceShutdown();
}

void Negotiator::AnnounceShutdown() {
  ResponseList s;
  s.shutdown = true;
  s.shutdown_reason = shutdown_.reason();
  s.failure = shutdown_.failure();
  if (!s.failure) s.shutdown_cycles = cycle_->completed();
  control_->SendToWorkers(Bytes(Serialize(s)));
}

void Negotiator::StopWorker() {
  RequestList ack;
  ack.shutdown_ack = true;
  if (process_set_ == 0) ack.timeline = timeline_->writer()->TakeRelayed();  // rank 0 writes it before it closes
  Send(ack);
  shutdown_.Stop();
}

void Negotiator::Fail(const std::string& reason) {
  HVD_ERROR(reason);
  if (shutdown_.peer_failed()) {  // the communicators are revoked: no one to tell
    work_->Abort(reason);
    return;
  }
  if (rank_ == 0) {
    // A worker that fails reports to this rank before it aborts its device work, and
    // that abort may be what failed here: its report, if it comes within a moment,
    // names the cause and becomes the job's reason.
    std::string cause = reason;
    std::vector<uint8_t> buf;
    int from = -1;
    const int64_t until = NowMicros() + kPeerReportGraceMicros;
    while (size_ > 1 && !shutdown_.Begun() && NowMicros() < until && cause == reason) {
      if (!control_->ReceiveRequest(&buf, &from)) {
        std::this_thread::sleep_for(std::chrono::microseconds(200));
        continue;
      }
      RequestList list = DeserializeRequestList(buf.data(), buf.size());
      if (list.shutdown_ack) shutdown_.Acknowledged();
      else if (list.shutdown && list.failure) cause = list.shutdown_reason;
    }
    BeginShutdown(cause, /*failure=*/true);  // aborts this rank's device work too
    return;
  }
  // Tell the coordinator before aborting: the abort makes the peers' device work fail
  // too, and the job's reason should be this rank's, the cause.
  if (!shutdown_.Begun()) {
    RequestList report;
    report.shutdown = true;
    report.failure = true;
    report.shutdown_reason = reason;
    Send(report);
  }
  shutdown_.Leave(/*failure=*/true);
  work_->Abort(reason);  // nothing of this rank's waits for a peer any more
}

// ---- Routing ----

void Negotiator::Route(Request r, const void* input, int64_t now, RequestList* to_coordinator) {
  if (r.type != RequestType::kAllreduce || r.group_id < 0 || r.group_size <= 1) {
    RouteOne(std::move(r), input, now, to_coordinator);
    return;
  }
  PartialGroup& held = partial_groups_[r.group_id];
  if (held.members.empty()) held.since_us = now;
  held.members.push_back(std::move(r));
  if (static_cast<int>(held.members.size()) < held.members.front().group_size) return;
  std::vector<Request> group = std::move(held.members);
  partial_groups_.erase(group.front().group_id);
  // Every rank puts a whole group into one cycle, so its members are agreed on in the
  // same cycle everywhere and fused together, as the group asks. Where one member is
  // not cached here, the others go to rank 0 with it; RouteInFull evicts their entries
  // on every rank, so that the other ranks' members follow them there.
  std::vector<int32_t> ids;
  for (const Request& m : group) {
    const int32_t id = join_outstanding_ ? -1 : cache_.Lookup(m);
    if (id < 0) break;
    ids.push_back(id);
  }
  const bool cached = ids.size() == group.size();
  for (size_t i = 0; i < group.size(); ++i) {
    if (!cached) {
      RouteInFull(std::move(group[i]), now, to_coordinator);
      continue;
    }
    const void* member_input = queue_->InputOf(group[i].name);
    ToCycle(ids[i], std::move(group[i]), member_input, now);
  }
}

// A front end submits a group's members in one call, so a group held for long lacks a
// member this rank will not send (a bug in the caller): it goes to rank 0 in full, where
// the stall inspector names what is missing, rather than wait here unseen.
bool Negotiator::FlushHeldGroups(int64_t now, RequestList* to_coordinator) {
  bool flushed = false;
  for (auto it = partial_groups_.begin(); it != partial_groups_.end();) {
    if (now - it->second.since_us < kGroupHoldMicros) {
      ++it;
      continue;
    }
    for (Request& m : it->second.members) RouteInFull(std::move(m), now, to_coordinator);
    it = partial_groups_.erase(it);
    flushed = true;
  }
  return flushed;
}

void Negotiator::RouteOne(Request r, const void* input, int64_t now, RequestList* to_coordinator) {
  const int32_t id = join_outstanding_ ? -1 : cache_.Lookup(r);
  if (id >= 0) ToCycle(id, std::move(r), input, now);
  else RouteInFull(std::move(r), now, to_coordinator);
}

void Negotiator::ToCycle(int32_t id, Request r, const void* input, int64_t now) {
  ++requests_as_ids_;
  if (!CacheCycle::CanCarry(r)) input = nullptr;
  cycle_->AddReady(id, std::move(r), now, input);
}

void Negotiator::RouteInFull(Request r, int64_t now, RequestList* to_coordinator) {
  // The name is cached with another signature (or this rank refuses it, or another
  // member of its group is not cached): every rank's request for it must go to rank 0,
  // so the entry is evicted everywhere.
  const int32_t stale = cache_.IdOf(r.name);
  if (stale >= 0) cycle_->Evict(stale);
  if (r.type == RequestType::kJoin) {
    join_outstanding_ = true;
    cycle_->SetEvictAll(true);
  }
  ++requests_in_full_;
  if (rank_ == 0) coordinator_->AddRequest(r, now);
  else to_coordinator->requests.push_back(std::move(r));
}

// ---- Rank 0 ----

bool Negotiator::CoordinatorStep(bool stop_requested) {
  bool progress = false;
  const int64_t now = NowMicros();
  queue_->TakeNew(&fresh_);
  for (TensorQueue::New& n : fresh_) {
    progress = true;
    if (!shutdown_.Begun()) Route(std::move(n.request), n.input, now, nullptr);
  }
  // The cycle before and after the control channel (see CycleStep).
  if (!shutdown_.Begun()) progress = CycleStep(now) || progress;
  std::vector<uint8_t> buf;
  int from = -1;
  // Alone, there is no one to hear from (and probing costs a system call).
  while (size_ > 1 && control_->ReceiveRequest(&buf, &from)) {
    progress = true;
    RequestList list = DeserializeRequestList(buf.data(), buf.size());
    if (!list.timeline.empty()) timeline_->writer()->WriteRelayed(list.timeline);
    if (list.shutdown_ack) {
      shutdown_.Acknowledged();
      continue;
    }
    if (shutdown_.Begun()) continue;
    if (!list.requests.empty()) HVD_DEBUG("requests from rank " << from << ": " << NamesOf(list.requests));
    for (Request& r : list.requests) coordinator_->AddRequest(r, now);
    for (size_t i = 0; i < list.waiting_ids.size(); ++i)
      if (cache_.Has(list.waiting_ids[i]))
        coordinator_->ReportCachedWait(from, list.waiting_ids[i], cache_.Get(list.waiting_ids[i]), list.waiting_us[i],
                                       list.waiting_cycle, now);
    if (list.shutdown && list.failure) {
      BeginShutdown(list.shutdown_reason, true);
    } else if (list.shutdown) {
      // If the departing rank completed the cycle in flight here, every rank has started
      // it: the announcement waits for it, so that what every rank submitted finishes.
      const bool hold = cycle_->InFlight() && list.cycles_completed >= cycle_->started();
      BeginShutdown("rank " + std::to_string(from) + " shut down (it called shutdown() or its process is exiting)",
                    false, hold);
    }
  }
  if (stop_requested && !shutdown_.Begun())
    BeginShutdown("rank 0 shut down (it called shutdown() or its process is exiting)", false);
  if (!shutdown_.Begun()) {
    // GPU tensors wait while this rank's GPU work runs, so that they go out fused.
    ResponseList ready = coordinator_->TakeReady(/*hold_device=*/work_->DeviceBusy());
    if (has_proposal_.load(std::memory_order_acquire)) {  // the global tuner's, for this set
      std::lock_guard<std::mutex> lk(tunables_mu_);
      if (proposed_) {
        proposed_->hierarchical = config_->tunables().hierarchical;
        if (*proposed_ != config_->tunables()) tunables_to_send_ = *proposed_;
        proposed_.reset();
      }
      has_proposal_.store(false, std::memory_order_relaxed);
    }
    if (tunables_to_send_) {
      // The autotuner's next settings ride on this list (alone if it is empty): every
      // rank applies them before its collectives, where it falls in the one order.
      ready.has_tunables = true;
      ready.tunables = *tunables_to_send_;
      tunables_to_send_.reset();
    }
    if (!ready.responses.empty() || ready.has_tunables) {
      progress = true;
      // With a cycle in flight, the list runs after that cycle's tensors, on every rank.
      const bool after_cycle = cycle_->InFlight();
      ready.after_cycle = after_cycle ? cycle_->started() : cycle_->completed();
      ++lists_sent_;
      if (size_ > 1) control_->SendToWorkers(Bytes(Serialize(ready)));
      if (after_cycle) deferred_.push_back(std::move(ready));
      else Execute(ready);
    }
    progress = CycleStep(now) || progress;
    // The step's clock serves it all: a step takes microseconds, a stall check is due
    // once a second.
    if (now - last_stall_check_us_ >= kStallCheckEveryMicros) {
      last_stall_check_us_ = now;
      SendStallReports(now);
      FlushHeldGroups(now, nullptr);
      std::vector<int> overdue;
      std::string reason = coordinator_->CheckStalls(now, &overdue);
      if (!reason.empty() && EvictInstead(overdue)) reason.clear();
      if (!reason.empty()) {
        HVD_ERROR(reason);
        // A worker that is only late acknowledges at once; one that is stopped, hung or
        // cut off never does, and the shutdown does not wait for it.
        shutdown_.AcknowledgeBy(now + kAcknowledgeMicros);
        BeginShutdown(reason, false);
      }
    }
  }
  if (shutdown_.state() == ShutdownState::State::kHolding) {
    progress = CycleStep(now) || progress;  // the cycle in flight, seen through
    const bool in_flight = cycle_->InFlight();
    if (shutdown_.HoldOver(in_flight, NowMicros())) {
      if (in_flight) HVD_WARN("shutting down with cycle " << cycle_->started() << " unfinished");
      AnnounceShutdown();
      progress = true;
    }
  }
  return progress;
}

// ---- Workers ----

bool Negotiator::WorkerStep(bool stop_requested) {
  bool progress = false;
  const int64_t now = NowMicros();
  queue_->TakeNew(&fresh_);
  const bool ask_shutdown = stop_requested && !shutdown_.Begun();
  // Timeline records of process sets without the world's rank 0 go to it with this
  // rank's next message (so a barrier after them brings them there first), or alone
  // now and then.
  const bool relay = process_set_ == 0 && timeline_->writer()->HasRelayed() &&
                     (!fresh_.empty() || ask_shutdown || now - last_relay_us_ >= kRelayEveryMicros);
  if (!fresh_.empty() || ask_shutdown || relay) {
    progress = true;
    RequestList list;
    for (TensorQueue::New& n : fresh_) Route(std::move(n.request), n.input, now, &list);
    if (ask_shutdown) {
      list.shutdown = true;
      list.cycles_completed = cycle_->completed();
      shutdown_.Leave(/*failure=*/false);
    }
    if (relay) {
      list.timeline = timeline_->writer()->TakeRelayed();
      last_relay_us_ = now;
    }
    if (!list.requests.empty() || list.shutdown || !list.timeline.empty()) Send(list);
  }
  // The cycle before and after the control channel (see CycleStep).
  progress = CycleStep(now) || progress;
  std::vector<uint8_t> buf;
  if (control_->ReceiveResponse(&buf)) {
    if (!TakeResponse(buf)) return true;
    // Return now: a caller driving the engine is likely waiting on what just ran, and
    // a further probe here would delay its return. The next step reads on.
    if (received_.empty()) return true;
    progress = true;
  }
  if (shutdown_.Stopped()) return progress;
  progress = CycleStep(now) || progress;
  bool unfinished = false;
  const int64_t drain_to = shutdown_.drain_to();
  if (shutdown_.DrainOver(cycle_->completed(), NowMicros(), &unfinished)) {
    if (unfinished) HVD_WARN("shutting down with cycle " << drain_to << " unfinished");
    StopWorker();
    return true;
  }
  if (now - last_stall_check_us_ >= kStallCheckEveryMicros) {
    last_stall_check_us_ = now;
    if (CoordinatorSilent(now)) return true;
    SendStallReports(now);
    RequestList list;
    if (FlushHeldGroups(now, &list)) Send(list);
  }
  return progress;
}

// Rank 0 of an elastic job whose launcher ends processes on request: the ranks that
// missed a collective past the stall shutdown time are evicted rather than the job shut
// down, if they are fewer than half (a majority missing is more likely the others'
// mistake, and the job could not go on without it). Python's stall watch
// (hvdlite.common.membership) reads them and asks the launcher to end their processes;
// their deaths then reach every survivor as a peer failure.
bool Negotiator::EvictInstead(const std::vector<int>& overdue) {
  if (!config_->job().stall_evicts || overdue.empty() || 2 * overdue.size() >= static_cast<size_t>(size_))
    return false;
  std::lock_guard<std::mutex> lock(stalled_mu_);
  if (stalled_ != overdue)
    HVD_WARN("ranks " << config_->RankNames(overdue)
             << " missed collectives for longer than the stall shutdown time (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS "
             << Seconds(config_->job().stall_shutdown_seconds) << "); asking the launcher to end "
             << (overdue.size() == 1 ? "it" : "them") << ", and the others go on without "
             << (overdue.size() == 1 ? "it" : "them"));
  stalled_ = overdue;
  return true;
}

std::vector<int> Negotiator::StalledRanks() const {
  std::lock_guard<std::mutex> lock(stalled_mu_);
  return stalled_;
}

// A worker's own stall limit. Rank 0 ends the job with the stall's reason once a tensor
// has waited past the stall shutdown time (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS), and
// tells every rank. A worker whose work has waited that long and a moment more, with no
// word from rank 0, concludes that rank 0 itself stopped answering (stopped, hung or
// cut off) and stops on its own: nothing else would ever end its wait.
bool Negotiator::CoordinatorSilent(int64_t now) {
  const double limit_s = config_->job().stall_shutdown_seconds;
  if (limit_s <= 0 || shutdown_.Begun()) return false;
  int64_t oldest = queue_->OldestEnqueueUs();
  for (const auto& [id, since] : cycle_->WaitingSince(now)) oldest = std::min(oldest, since);
  // Rank 0's clock for a tensor starts when the request reaches it: a worker holds a
  // grouped allreduce's partial group for up to kGroupHoldMicros and sends it at its
  // next check (a second later at most), rank 0 checks its stalls once a second, and
  // its word takes a moment: 3 s, and half a second to spare.
  // Where rank 0 evicts ranks that stall, the launcher's kill and the failure's news
  // take a moment more: 10 s.
  const int64_t grace_us = kGroupHoldMicros + 5 * kStallCheckEveryMicros / 2 +
                           (config_->job().stall_evicts ? 10 * kStallCheckEveryMicros : 0);
  const int64_t limit_us = static_cast<int64_t>(limit_s * 1e6) + grace_us;
  if (oldest == INT64_MAX || now - oldest < limit_us) return false;
  const std::string reason = "hvdlite shut down: " + config_->RankName(0) +
                             ", which coordinates the ranks, has not answered while this rank's work waited " +
                             std::to_string((now - oldest) / 1000000) +
                             " s (HOROVOD_STALL_SHUTDOWN_TIME_SECONDS " + Seconds(limit_s) +
                             "); it is stopped, hung or cut off from the network";
  HVD_ERROR(reason);
  shutdown_.CoordinatorLost(reason);
  work_->Abort(reason);
  return true;
}

bool Negotiator::TakeResponse(std::vector<uint8_t>& buf) {
  ResponseList list = DeserializeResponseList(buf.data(), buf.size());
  if (list.shutdown) {
    // No new cycles from now on, nothing more to rank 0 but the acknowledgement.
    const bool stop_now = shutdown_.Told(list.shutdown_reason, list.failure, list.shutdown_cycles,
                                         cycle_->completed(), cycle_->started(), NowMicros());
    if (list.failure) work_->Abort(list.shutdown_reason);
    if (!stop_now) return true;  // draining: see the cycle through (WorkerStep), then stop
    StopWorker();
    return false;
  }
  received_.push_back(std::move(list));
  return RunReceivedLists();
}

bool Negotiator::RunReceivedLists(int64_t upto) {
  std::vector<uint8_t> buf;
  while (!shutdown_.Stopped() && upto >= 0 && lists_run_ < upto) {
    if (received_.empty()) {
      // Rank 0 sent it before it started the cycle that just completed: it is on its way.
      if (control_->ReceiveResponse(&buf)) {
        if (!TakeResponse(buf)) return false;
      }
      continue;
    }
    ResponseList list = std::move(received_.front());
    received_.pop_front();
    ++lists_run_;
    Execute(list);
  }
  while (!shutdown_.Stopped() && !received_.empty() && received_.front().after_cycle <= cycles_run_) {
    ResponseList list = std::move(received_.front());
    received_.pop_front();
    ++lists_run_;
    Execute(list);
  }
  return !shutdown_.Stopped();
}

// ---- Cycles ----

// A step moves the cycle on both before and after it probes the control channel. A
// probe that finds nothing lets Open MPI yield the core (its mpi_yield_when_idle, set
// whenever ranks share cores). Before: the cycle's messages are on their way to the
// peers before that yield (probed first, the yield sat between a collective's
// submission and its first message, and a lone 4 KiB allreduce took 15 % longer).
// After: a result that came in during the yield is seen, and a waiting caller returns,
// without another probe. Rank 0's lists of the same step then follow the cycle, as
// lists sent while a cycle is in flight always do.
bool Negotiator::CycleStep(int64_t now) {
  if (shutdown_.Stopped()) return false;
  bool progress = false;
  if (shutdown_.Begun()) {
    // No cycle starts. One in flight moves on only where every rank sees it through
    // (rank 0's hold, a worker's drain), since its collectives then run everywhere.
    if (!shutdown_.CyclesMove()) return false;
  } else {
    // A list rank 0 sent while its cycle was in flight waits for that cycle, which needs
    // this rank's part too.
    const bool peer_waits = !received_.empty() && received_.back().after_cycle > cycle_->started();
    progress = cycle_->MaybeStart(rank_ == 0 ? lists_sent_ : -1, peer_waits, cache_.Empty(), now);
  }
  if (cycle_->Poll(cache_, now, &outcome_)) {
    RunCycle(outcome_);
    progress = true;
  }
  return progress;
}

// A completed cycle, on every rank in the same order: rank 0's lists sent before the
// cycle started, the evictions, the tensors every rank had ready, then the lists rank 0
// sent while the cycle was in flight.
void Negotiator::RunCycle(CacheCycle::Outcome& out) {
  if (rank_ != 0 && !RunReceivedLists(out.lists_before)) return;
  if (out.evict_all) {
    cache_.Clear();
  } else {
    for (int32_t id : out.evicted) cache_.Erase(id);
  }
  if (rank_ == 0) {
    for (int32_t id : out.evicted) coordinator_->CachedRan(id, out.cycle);
  }
  // This rank's ready requests for evicted entries go to rank 0 in full; so do every
  // other rank's, after this same cycle.
  const int64_t now = out.done_us;
  RequestList full;
  for (Request& r : out.moved) {
    ++requests_in_full_;
    if (rank_ == 0) coordinator_->AddRequest(r, now);
    else full.requests.push_back(std::move(r));
  }
  if (!full.requests.empty()) Send(full);
  // Rank 0 accounts for (and traces the negotiation of) what the cycle agreed on.
  auto agreed = [&](int32_t id) {
    if (rank_ != 0) return;
    coordinator_->CachedRan(id, out.cycle);
    if (!timeline_->Active()) return;
    auto since = std::find_if(out.since_us.begin(), out.since_us.end(), [&](const auto& s) { return s.first == id; });
    const Request& q = cache_.Get(id);
    std::string phase = std::string("NEGOTIATE_") + RequestTypeName(q.type);
    for (auto& c : phase) c = static_cast<char>(std::toupper(c));
    timeline_->Phase(q.name, phase.c_str(), since == out.since_us.end() ? now : since->second, now,
                     "{\"cycle\": " + std::to_string(out.cycle) + "}");
  };
  if (out.reduced_id >= 0) {
    agreed(out.reduced_id);
    work_->RunCarried(cache_.Get(out.reduced_id), out.reduced);
  }
  for (const std::vector<int32_t>& ids : cycle_->Collectives(out.ready, cache_)) {
    for (int32_t id : ids) agreed(id);
    Run(FromCache(ids), /*cached=*/true);
  }
  cycles_run_ = out.cycle;
  if (rank_ == 0) {
    while (!deferred_.empty()) {
      ResponseList list = std::move(deferred_.front());
      deferred_.pop_front();
      Execute(list);
    }
  } else {
    RunReceivedLists();
  }
}

// Stall reports: this rank's cached tensors that have waited in cycles past the stall
// check time go to rank 0, whose stall inspector names the ranks that have not
// submitted them. (Only reports travel: a healthy cycle involves no rank 0.)
void Negotiator::SendStallReports(int64_t now) {
  const double check_s = config_->job().stall_check_seconds;
  if (check_s <= 0) return;
  const int64_t check_us = static_cast<int64_t>(check_s * 1e6);
  auto waiting = cycle_->WaitingSince(now - check_us);
  if (waiting.empty()) return;
  if (rank_ == 0) {
    for (const auto& [id, since] : waiting)
      if (cache_.Has(id)) coordinator_->ReportCachedWait(0, id, cache_.Get(id), now - since, cycle_->completed(), now);
    return;
  }
  RequestList report;
  report.waiting_cycle = cycle_->completed();
  for (const auto& [id, since] : waiting) {
    report.waiting_ids.push_back(id);
    report.waiting_us.push_back(now - since);
  }
  Send(report);
}

// ---- What was agreed ----

std::vector<int64_t> Negotiator::PartsOf(const Response& r, size_t i) {
  if (r.type == RequestType::kAlltoall) return r.sizes;
  if (r.type != RequestType::kAllgather || r.names.empty()) return {};
  const size_t per = r.sizes.size() / r.names.size();
  return std::vector<int64_t>(r.sizes.begin() + static_cast<std::ptrdiff_t>(i * per),
                              r.sizes.begin() + static_cast<std::ptrdiff_t>((i + 1) * per));
}

Response Negotiator::FromCache(const std::vector<int32_t>& ids) const {
  Response r = ResponseTo(cache_.Get(ids.front()));
  for (int32_t id : ids) {
    const Request& q = cache_.Get(id);
    r.names.push_back(q.name);
    const std::vector<int64_t>& parts = cache_.Sizes(id);  // every rank's rows or splits
    if (parts.empty()) r.sizes.push_back(NumElements(q.shape));
    else r.sizes.insert(r.sizes.end(), parts.begin(), parts.end());
    r.cache_ids.push_back(id);
  }
  return r;
}

void Negotiator::Execute(const ResponseList& list) {
  HVD_DEBUG("executing " << list.responses.size() << " negotiated collective(s)");
  if (list.has_tunables) ApplyTunables(list.tunables);
  for (const Response& r : list.responses) Run(r);
}

void Negotiator::Run(const Response& r, bool cached) {
  // Remember the agreed signatures under the ids the coordinator assigned (a cycle's
  // tensors are known already).
  if (!cached && r.error.empty() && r.joined_ranks.empty()) {
    const size_t n = r.names.size();
    for (size_t i = 0; i < r.cache_ids.size() && i < n; ++i) {
      if (r.cache_ids[i] < 0) continue;
      Request sig;
      if (!queue_->RequestOf(r.names[i], &sig)) continue;
      if (cache_.Lookup(sig) == r.cache_ids[i]) continue;  // already known
      sig.rank = 0;
      cache_.Put(r.cache_ids[i], sig, PartsOf(r, i));
    }
  }
  if (r.type == RequestType::kJoin && r.error.empty()) {
    join_outstanding_ = false;  // every rank has joined
    cycle_->SetEvictAll(!Caching());
  }
  work_->Run(r);
}

void Negotiator::ApplyTunables(const Tunables& t) {
  HVD_INFO("autotune: fusion threshold " << t.fusion_threshold_bytes << " B, cycle time " << t.cycle_time_ms
           << " ms, response cache " << (t.cache_enabled ? "on" : "off") << ", hierarchical allreduce "
           << t.hierarchical);
  // Every component reads the settings from the one configuration: the backends'
  // fusion threshold and two-level choice, the coordinator's and the cycles' fusion
  // limits and caching, the cycles' pause.
  config_->Apply(t);
  work_->TunablesChanged();
  // Caching off: rank 0 gives new tensors no entries, and the cycles evict the ones
  // there are (every rank alike, as when a rank joins); their requests go to rank 0 in
  // full.
  cycle_->SetEvictAll(join_outstanding_ || !Caching());
  std::function<void(const Tunables&)> tell;
  {
    std::lock_guard<std::mutex> lk(tunables_mu_);
    tell = on_tunables_;
  }
  if (tell) tell(t);
}

void Negotiator::ProposeTunables(const Tunables& t) {
  if (!coordinator_) return;  // the set's other ranks apply what its rank 0 sends
  std::lock_guard<std::mutex> lk(tunables_mu_);
  proposed_ = t;
  has_proposal_.store(true, std::memory_order_release);
  queue_->Wake();
}

void Negotiator::OnTunablesApplied(std::function<void(const Tunables&)> fn) {
  std::lock_guard<std::mutex> lk(tunables_mu_);
  on_tunables_ = std::move(fn);
}

void Negotiator::Tune(const std::vector<std::string>& names, int64_t bytes) {
  Tunables next;
  if (tuner_->Record(names, bytes, NowMicros(), &next)) tunables_to_send_ = next;
  if (tuner_->Done()) tuner_.reset();  // settled: nothing more to count on the hot path
}

}  // namespace hvdlite
