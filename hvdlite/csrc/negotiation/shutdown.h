// How an engine stops: one state machine for the clean shutdown handshake and for every
// kind of failure, with its states and transitions here and nowhere else (the table is
// in docs/architecture.md, "Shutdown and failure"). It decides; the negotiator does
// what it decides (sends the announcement, the acknowledgement, the report), so it holds
// no transport and is tested on its own.
//
// Rank 0 (the coordinator):
//   Running --Begin(clean, cycle in flight that every rank started)--> Holding
//   Running --Begin(clean, otherwise) or Begin(failure)--> Announced
//   Holding --HoldOver (cycle done, or kDrainMicros passed)--> Announced
//   Holding --Begin(failure)--> Announced (a failure is announced at once)
//   Announced --every worker acknowledged, or (a stall) the acknowledgement deadline
//              passed: those silent are unresponsive()--> Finished()
// A worker:
//   Running --Leave (it shuts down, or reports its own failure)--> Leaving
//   Running/Leaving --Told(failure, or nothing to see through)--> Stopped
//   Running/Leaving --Told(clean, a cycle to see through)--> Draining
//   Draining --DrainOver (cycle done, or kDrainMicros passed)--> Stopped
//   any --CoordinatorLost (rank 0 silent past the stall limit)--> Stopped
// Any rank:
//   any --PeerFailed--> Stopped (no handshake: the communicators are revoked)
//   any --EngineFailed--> Stopped
#pragma once

#include <cstdint>
#include <string>

namespace hvdlite {

class ShutdownState {
 public:
  enum class State { kRunning, kHolding, kAnnounced, kLeaving, kDraining, kStopped };
  // A clean shutdown sees a cycle in flight through, if every rank has started it (a
  // rank that shut down had completed it): its messages are on their way and it ends
  // within microseconds. This bounds the wait should it not.
  static constexpr int64_t kDrainMicros = 2000000;

  State state() const { return state_; }
  static const char* StateName(State s);
  // Shutdown has begun: no new work is routed, no new cycle starts.
  bool Begun() const { return state_ != State::kRunning; }
  // A cycle in flight may still move on: before shutdown, and while rank 0 holds its
  // announcement or a worker drains, since every rank then sees that cycle through.
  bool CyclesMove() const {
    return state_ == State::kRunning || state_ == State::kHolding || state_ == State::kDraining;
  }
  bool Stopped() const { return state_ == State::kStopped; }
  const std::string& reason() const { return reason_; }
  bool failure() const { return failure_; }
  bool peer_failed() const { return peer_failed_; }
  // Ranks stopped answering (a worker did not acknowledge a stall's shutdown, or rank 0
  // fell silent): they may never take part again, so MPI_Finalize, which waits for
  // every process, must not be called.
  bool unresponsive() const { return unresponsive_; }

  // Rank 0. A shutdown begins for `reason`. `hold`: a clean shutdown whose announcement
  // waits for the cycle in flight. Returns true if the announcement is due now
  // (Announced); false if it is held, or if a shutdown had begun already (a failure
  // while holding is announced at once; anything else after the first is ignored).
  bool Begin(const std::string& reason, bool failure, bool hold, int64_t now_us);
  // Rank 0, holding: whether to announce now (then Announced).
  bool HoldOver(bool cycle_in_flight, int64_t now_us);
  void Acknowledged() { ++acks_; }
  // Rank 0, shutting down for a stall: a worker whose acknowledgement has not come by
  // `deadline_us` stopped answering (a rank that is merely late still has a live
  // engine, which acknowledges at once).
  void AcknowledgeBy(int64_t deadline_us) { ack_deadline_us_ = deadline_us; }
  // Rank 0: announced, and every one of the `size` - 1 workers acknowledged, or the
  // acknowledgement deadline passed (then unresponsive()).
  bool Finished(int size, int64_t now_us);

  // A worker leaves: it asked rank 0 to shut down (failure false), or reported its own
  // failure (true). Its reason is what rank 0 then announces (Told). Once shutdown has
  // begun, only a failure is recorded.
  void Leave(bool failure);
  // A worker is told to shut down. With a clean shutdown after cycle
  // `shutdown_cycles`, which this rank has started (`started`) and not completed
  // (`completed`), it drains; otherwise it stops now. Returns true when it stops now.
  bool Told(const std::string& reason, bool failure, int64_t shutdown_cycles, int64_t completed, int64_t started,
            int64_t now_us);
  // A worker draining: the cycle to see through has completed, or time is up. True
  // when it stops now (then Stopped); `unfinished` says whether time ran out.
  bool DrainOver(int64_t completed, int64_t now_us, bool* unfinished);
  // The cycle a draining worker sees through.
  int64_t drain_to() const { return drain_to_; }
  // A worker stops (after its acknowledgement).
  void Stop() { state_ = State::kStopped; }

  // A peer died: the communicators are revoked, and nothing more is said to anyone.
  void PeerFailed(const std::string& reason);
  // The engine itself failed (an exception in its thread).
  void EngineFailed(const std::string& reason);
  // A worker: rank 0 has said nothing while this rank's work waited past the stall
  // limit. Nobody is told (rank 0 does not answer); the rank stops with `reason`.
  void CoordinatorLost(const std::string& reason);
  // The reason, when none was given (a clean stop).
  void DefaultReason(const std::string& reason) {
    if (reason_.empty()) reason_ = reason;
  }

 private:
  State state_ = State::kRunning;
  std::string reason_;
  bool failure_ = false;
  bool peer_failed_ = false;
  bool unresponsive_ = false;
  int acks_ = 0;
  int64_t ack_deadline_us_ = -1;  // none: wait for every acknowledgement
  int64_t drain_to_ = -1;
  int64_t deadline_us_ = 0;  // the end of rank 0's hold or a worker's drain
};

}  // namespace hvdlite
