#include "negotiation/shutdown.h"

namespace hvdlite {

const char* ShutdownState::StateName(State s) {
  switch (s) {
    case State::kRunning: return "running";
    case State::kHolding: return "holding";
    case State::kAnnounced: return "announced";
    case State::kLeaving: return "leaving";
    case State::kDraining: return "draining";
    case State::kStopped: return "stopped";
  }
  return "?";
}

bool ShutdownState::Begin(const std::string& reason, bool failure, bool hold, int64_t now_us) {
  if (state_ != State::kRunning && !(state_ == State::kHolding && failure)) return false;
  reason_ = reason;
  failure_ = failure;
  if (hold && !failure) {
    state_ = State::kHolding;
    deadline_us_ = now_us + kDrainMicros;
    return false;
  }
  state_ = State::kAnnounced;
  return true;
}

bool ShutdownState::HoldOver(bool cycle_in_flight, int64_t now_us) {
  if (state_ != State::kHolding) return false;
  if (cycle_in_flight && now_us <= deadline_us_) return false;
  state_ = State::kAnnounced;
  return true;
}

void ShutdownState::Leave(bool failure) {
  if (failure) failure_ = true;
  if (state_ == State::kRunning) state_ = State::kLeaving;
}

bool ShutdownState::Told(const std::string& reason, bool failure, int64_t shutdown_cycles, int64_t completed,
                    int64_t started, int64_t now_us) {
  reason_ = reason;
  if (failure) failure_ = true;
  if (!failure && completed < shutdown_cycles && started >= shutdown_cycles) {
    // Rank 0 completed the cycle this rank has in flight, so every rank started it and
    // its messages are on their way: see it through, then stop.
    state_ = State::kDraining;
    drain_to_ = shutdown_cycles;
    deadline_us_ = now_us + kDrainMicros;
    return false;
  }
  state_ = State::kStopped;
  return true;
}

bool ShutdownState::DrainOver(int64_t completed, int64_t now_us, bool* unfinished) {
  if (state_ != State::kDraining) return false;
  if (completed < drain_to_ && now_us <= deadline_us_) return false;
  *unfinished = completed < drain_to_;
  drain_to_ = -1;
  state_ = State::kStopped;
  return true;
}

void ShutdownState::PeerFailed(const std::string& reason) {
  reason_ = reason;
  failure_ = true;
  peer_failed_ = true;
  state_ = State::kStopped;
}

void ShutdownState::EngineFailed(const std::string& reason) {
  reason_ = reason;
  failure_ = true;
  state_ = State::kStopped;
}

bool ShutdownState::Finished(int size, int64_t now_us) {
  if (state_ != State::kAnnounced) return false;
  if (acks_ >= size - 1) return true;
  if (ack_deadline_us_ < 0 || now_us <= ack_deadline_us_) return false;
  unresponsive_ = true;
  return true;
}

void ShutdownState::CoordinatorLost(const std::string& reason) {
  reason_ = reason;
  failure_ = true;
  unresponsive_ = true;
  state_ = State::kStopped;
}

}  // namespace hvdlite
