// The shutdown and failure state machine (negotiation/shutdown.h): every transition of
// the table in docs/architecture.md, "Errors and shutdown".
#include "check.h"
#include "negotiation/shutdown.h"

using hvdlite::ShutdownState;
using State = hvdlite::ShutdownState::State;

namespace {
constexpr int64_t kDrain = ShutdownState::kDrainMicros;
}

TEST(shutdown_starts_running_and_accepts_work) {
  ShutdownState s;
  CHECK(s.state() == State::kRunning);
  CHECK(!s.Begun());
  CHECK(s.CyclesMove());
  CHECK(!s.Stopped());
  CHECK(!s.failure());
  CHECK_EQ(std::string(ShutdownState::StateName(s.state())), std::string("running"));
}

TEST(shutdown_rank0_clean_announces_at_once_without_a_cycle_to_hold) {
  ShutdownState s;
  CHECK(s.Begin("rank 1 shut down", /*failure=*/false, /*hold=*/false, 0));
  CHECK(s.state() == State::kAnnounced);
  CHECK(s.Begun());
  CHECK(!s.CyclesMove());  // announced: no cycle moves on rank 0 any more
  CHECK_EQ(s.reason(), std::string("rank 1 shut down"));
  CHECK(!s.failure());
}

TEST(shutdown_rank0_holds_for_the_cycle_in_flight_then_announces) {
  ShutdownState s;
  CHECK(!s.Begin("rank 1 shut down", false, /*hold=*/true, 1000));
  CHECK(s.state() == State::kHolding);
  CHECK(s.Begun());
  CHECK(s.CyclesMove());  // the cycle in flight is seen through
  CHECK(!s.HoldOver(/*cycle_in_flight=*/true, 1000 + kDrain));  // still within the limit
  CHECK(s.state() == State::kHolding);
  CHECK(s.HoldOver(/*cycle_in_flight=*/false, 2000));  // the cycle completed
  CHECK(s.state() == State::kAnnounced);
}

TEST(shutdown_rank0_hold_ends_when_time_is_up) {
  ShutdownState s;
  s.Begin("why", false, true, 1000);
  CHECK(!s.HoldOver(true, 1000 + kDrain));
  CHECK(s.HoldOver(true, 1000 + kDrain + 1));
  CHECK(s.state() == State::kAnnounced);
  CHECK(!s.HoldOver(false, 1000 + kDrain + 2));  // only once
}

TEST(shutdown_rank0_failure_during_a_hold_is_announced_at_once) {
  ShutdownState s;
  s.Begin("rank 1 shut down", false, true, 0);
  CHECK(s.Begin("GPU collective failed", /*failure=*/true, /*hold=*/false, 10));
  CHECK(s.state() == State::kAnnounced);
  CHECK(s.failure());
  CHECK_EQ(s.reason(), std::string("GPU collective failed"));
}

TEST(shutdown_rank0_a_failure_is_never_held) {
  ShutdownState s;
  CHECK(s.Begin("stall", /*failure=*/true, /*hold=*/true, 0));
  CHECK(s.state() == State::kAnnounced);
  CHECK(s.failure());
}

TEST(shutdown_rank0_ignores_a_second_shutdown_once_announced) {
  ShutdownState s;
  s.Begin("first", false, false, 0);
  CHECK(!s.Begin("second", true, false, 1));  // announced already: nothing changes
  CHECK_EQ(s.reason(), std::string("first"));
  CHECK(!s.failure());
  ShutdownState h;
  h.Begin("first", false, true, 0);
  CHECK(!h.Begin("second, clean", false, false, 1));  // holding: only a failure gets through
  CHECK(h.state() == State::kHolding);
  CHECK_EQ(h.reason(), std::string("first"));
}

TEST(shutdown_rank0_finishes_when_every_worker_acknowledged) {
  ShutdownState s;
  CHECK(!s.Finished(3, 0));  // running
  s.Acknowledged();
  s.Acknowledged();
  CHECK(!s.Finished(3, 0));  // acknowledgements count only once announced
  s.Begin("why", false, false, 0);
  CHECK(s.Finished(3, 0));
  ShutdownState t;
  t.Begin("why", false, false, 0);
  t.Acknowledged();
  CHECK(!t.Finished(3, 0));
  t.Acknowledged();
  CHECK(t.Finished(3, 0));
  ShutdownState alone;
  alone.Begin("why", false, false, 0);
  CHECK(alone.Finished(1, 0));  // no workers to wait for
}

TEST(shutdown_worker_leaves_then_stops_when_told) {
  ShutdownState s;
  s.Leave(/*failure=*/false);
  CHECK(s.state() == State::kLeaving);
  CHECK(s.Begun());
  CHECK(!s.CyclesMove());
  CHECK(s.Told("rank 1 shut down", false, /*shutdown_cycles=*/5, /*completed=*/5, /*started=*/5, 0));
  CHECK(s.Stopped());
  CHECK_EQ(s.reason(), std::string("rank 1 shut down"));
  CHECK(!s.failure());
}

TEST(shutdown_worker_drains_the_cycle_rank0_completed) {
  ShutdownState s;
  // Rank 0 completed cycle 7; this rank has started it and not completed it.
  CHECK(!s.Told("rank 0 shut down", false, 7, /*completed=*/6, /*started=*/7, 100));
  CHECK(s.state() == State::kDraining);
  CHECK(s.CyclesMove());
  CHECK_EQ(s.drain_to(), int64_t{7});
  bool unfinished = true;
  CHECK(!s.DrainOver(6, 200, &unfinished));
  CHECK(s.DrainOver(7, 300, &unfinished));
  CHECK(!unfinished);
  CHECK(s.Stopped());
  CHECK_EQ(s.drain_to(), int64_t{-1});
}

TEST(shutdown_worker_drain_ends_when_time_is_up) {
  ShutdownState s;
  s.Told("why", false, 3, 2, 3, 100);
  bool unfinished = false;
  CHECK(!s.DrainOver(2, 100 + kDrain, &unfinished));
  CHECK(s.DrainOver(2, 100 + kDrain + 1, &unfinished));
  CHECK(unfinished);
  CHECK(s.Stopped());
}

TEST(shutdown_worker_does_not_drain_a_cycle_it_has_not_started) {
  ShutdownState s;
  // Rank 0 completed cycle 4, which this rank never started: nothing to see through.
  CHECK(s.Told("why", false, 4, /*completed=*/3, /*started=*/3, 0));
  CHECK(s.Stopped());
  ShutdownState t;
  CHECK(t.Told("why", false, 4, /*completed=*/4, /*started=*/4, 0));  // completed already
  CHECK(t.Stopped());
}

TEST(shutdown_worker_told_of_a_failure_stops_without_draining) {
  ShutdownState s;
  CHECK(s.Told("rank 2 failed", /*failure=*/true, 7, 6, 7, 0));
  CHECK(s.Stopped());
  CHECK(s.failure());
  CHECK_EQ(s.reason(), std::string("rank 2 failed"));
}

TEST(shutdown_worker_own_failure_is_kept_but_rank0s_reason_wins) {
  ShutdownState s;
  s.Leave(/*failure=*/true);
  CHECK(s.state() == State::kLeaving);
  CHECK(s.failure());
  CHECK(s.reason().empty());  // the reason comes from rank 0's announcement
  s.Told("rank 1: NCCL failed", true, 0, 0, 0, 0);
  CHECK_EQ(s.reason(), std::string("rank 1: NCCL failed"));
  // A clean announcement after this rank's own failure leaves the failure recorded.
  ShutdownState t;
  t.Leave(true);
  t.Told("rank 0 shut down", false, 0, 0, 0, 0);
  CHECK(t.Stopped());
  CHECK(t.failure());
}

TEST(shutdown_worker_second_leave_only_records_a_failure) {
  ShutdownState s;
  s.Leave(false);
  s.Leave(true);
  CHECK(s.state() == State::kLeaving);
  CHECK(s.failure());
}

TEST(shutdown_peer_failure_stops_any_state_without_handshake) {
  for (int start = 0; start < 4; ++start) {
    ShutdownState s;
    if (start == 1) s.Begin("clean", false, true, 0);  // holding
    if (start == 2) s.Leave(false);                    // leaving
    if (start == 3) s.Told("why", false, 2, 1, 2, 0);  // draining
    s.PeerFailed("rank 3 of 4 failed");
    CHECK(s.Stopped());
    CHECK(s.peer_failed());
    CHECK(s.failure());
    CHECK_EQ(s.reason(), std::string("rank 3 of 4 failed"));
    CHECK(!s.CyclesMove());
  }
}

TEST(shutdown_engine_failure_stops) {
  ShutdownState s;
  s.EngineFailed("hvdlite engine failed: boom");
  CHECK(s.Stopped());
  CHECK(s.failure());
  CHECK(!s.peer_failed());
}

TEST(shutdown_default_reason_only_fills_an_empty_one) {
  ShutdownState s;
  s.DefaultReason("hvdlite was shut down");
  CHECK_EQ(s.reason(), std::string("hvdlite was shut down"));
  ShutdownState t;
  t.Begin("rank 2 shut down", false, false, 0);
  t.DefaultReason("hvdlite was shut down");
  CHECK_EQ(t.reason(), std::string("rank 2 shut down"));
}

TEST(shutdown_rank0_after_a_stall_waits_for_acknowledgements_until_a_deadline) {
  ShutdownState s;
  s.AcknowledgeBy(5000);
  s.Begin("hvdlite shut down after a stall of 5 s", false, false, 0);
  s.Acknowledged();
  s.Acknowledged();
  CHECK(!s.Finished(4, 4000));  // one of three workers has not answered yet
  CHECK(!s.unresponsive());
  CHECK(s.Finished(4, 5001));  // past the deadline: it stopped answering
  CHECK(s.unresponsive());
}

TEST(shutdown_rank0_after_a_stall_with_every_worker_answering_is_clean) {
  ShutdownState s;
  s.AcknowledgeBy(5000);
  s.Begin("hvdlite shut down after a stall of 5 s", false, false, 0);
  for (int i = 0; i < 3; ++i) s.Acknowledged();
  CHECK(s.Finished(4, 100));  // a late rank's engine acknowledged: MPI_Finalize can wait for it
  CHECK(!s.unresponsive());
}

TEST(shutdown_without_a_deadline_waits_for_every_worker) {
  ShutdownState s;
  s.Begin("rank 1 shut down", false, false, 0);
  s.Acknowledged();
  s.Acknowledged();
  CHECK(!s.Finished(4, 1LL << 60));
  CHECK(!s.unresponsive());
}

TEST(shutdown_worker_stops_on_its_own_when_rank0_is_silent) {
  ShutdownState s;
  s.CoordinatorLost("rank 0 (host h1) has not answered");
  CHECK(s.Stopped());
  CHECK(s.failure());
  CHECK(s.unresponsive());
  CHECK(!s.peer_failed());  // no communicator was revoked
  CHECK_EQ(s.reason(), std::string("rank 0 (host h1) has not answered"));
}
