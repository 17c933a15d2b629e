// The negotiator (negotiation/negotiator.h) of several simulated ranks on one thread,
// over the fake transport: new tensors through rank 0, known ones through the cycles,
// the one order every rank runs them in, carried tensors, refusals, and the shutdown
// and failure protocol end to end.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "common/tensor_queue.h"
#include "common/timeline.h"
#include "fake_transport.h"
#include "negotiation/negotiator.h"
#include "requests.h"

using namespace hvdlite;

namespace {

// Records what the negotiation hands on, as the executor would run it: each response's
// tensors leave this rank's queue.
class Recorder : public AgreedWork {
 public:
  explicit Recorder(TensorQueue* queue) : queue_(queue) {}
  void Run(const Response& r) override {
    std::string line = std::string(RequestTypeName(r.type));
    for (const std::string& n : r.names) line += " " + n;
    if (!r.error.empty()) line += " failed";
    ran.push_back(line);
    errors.push_back(r.error);
    const size_t n = r.type == RequestType::kJoin ? 1 : r.names.size();
    TensorEntry e;
    for (size_t i = 0; i < n; ++i) queue_->Pop(r.type == RequestType::kJoin ? "\x01join" : r.names[i], &e);
  }
  void RunCarried(const Request& sig, const void* sum) override {
    TensorEntry e;
    if (!queue_->Pop(sig.name, &e)) return;
    ran.push_back("carried " + sig.name);
    std::vector<float> v(static_cast<size_t>(NumElements(sig.shape)));
    std::memcpy(v.data(), sum, v.size() * sizeof(float));
    carried_sums.push_back(v);
  }
  bool DeviceBusy() const override { return false; }
  void Abort(const std::string& why) override { aborts.push_back(why); }
  void TunablesChanged() override { ++tunables_changed; }

  std::vector<std::string> ran, errors, aborts;
  std::vector<std::vector<float>> carried_sums;
  int tunables_changed = 0;

 private:
  TensorQueue* queue_;
};

// One simulated rank: its queue, configuration, timeline, recorder and negotiator.
struct Rank {
  Rank(unit::FakeWorld& world, int r, const Parameters& params)
      : config(unit::MakeConfig(params, unit::Limits(64 << 20, 1 << 20, 64 << 20, 64 << 20),
                                unit::Limits(64 << 20))),
        recorder(&queue),
        negotiator(world.rank(r), config.get(), &queue, &timeline, &recorder, /*process_set=*/0) {}

  // Submits `req` on this rank, with `data` as its input (kept alive by the caller).
  void Submit(Request req, const void* data = nullptr) {
    req.rank = negotiator.rank();
    TensorEntry e;
    e.request = std::move(req);
    e.input = data;
    e.handle = ++handles;
    CHECK(queue.Push(e, /*wake=*/false));
  }

  std::unique_ptr<Config> config;
  TensorQueue queue;
  Timeline timeline;
  Recorder recorder;
  Negotiator negotiator;
  int64_t handles = 0;
};

struct Job {
  explicit Job(int n, Parameters params = Parameters()) : world(n) {
    for (int r = 0; r < n; ++r) ranks.push_back(std::make_unique<Rank>(world, r, params));
  }
  // Steps every rank in turn until none makes progress for a few rounds (bounded).
  void Settle(int max_rounds = 2000) {
    int idle = 0;
    for (int round = 0; round < max_rounds && idle < 40; ++round) {
      bool progress = false;
      for (auto& r : ranks) progress = r->negotiator.Step(false) || progress;
      idle = progress ? 0 : idle + 1;
    }
  }
  Rank& operator[](int r) { return *ranks[r]; }

  unit::FakeWorld world;
  std::vector<std::unique_ptr<Rank>> ranks;
};

// Too large for a cycle to carry (CacheCycle::kMaxCarriedBytes), so it runs as a collective.
Request Big(const std::string& name) { return unit::Allreduce(name, {8192}); }

}  // namespace

TEST(negotiator_new_tensor_goes_through_rank0_then_through_the_cycles) {
  Job job(2);
  for (int r = 0; r < 2; ++r) job[r].Submit(Big("a"));
  job.Settle();
  for (int r = 0; r < 2; ++r) {
    CHECK_EQ(job[r].recorder.ran, (std::vector<std::string>{"allreduce a"}));
    CHECK_EQ(job[r].negotiator.GetStats().requests_in_full, int64_t{1});
    CHECK_EQ(job[r].negotiator.GetStats().requests_as_ids, int64_t{0});
  }
  // The second time, the response cache knows it: agreed in a cycle, without rank 0.
  for (int r = 0; r < 2; ++r) job[r].Submit(Big("a"));
  job.Settle();
  for (int r = 0; r < 2; ++r) {
    CHECK_EQ(job[r].recorder.ran, (std::vector<std::string>{"allreduce a", "allreduce a"}));
    CHECK_EQ(job[r].negotiator.GetStats().requests_in_full, int64_t{1});
    CHECK_EQ(job[r].negotiator.GetStats().requests_as_ids, int64_t{1});
    CHECK(job[r].negotiator.GetStats().cycles >= 1);
  }
}

TEST(negotiator_every_rank_runs_lists_and_cycles_in_one_order) {
  Job job(3);
  for (int r = 0; r < 3; ++r) {
    job[r].Submit(Big("a"));
    job[r].Submit(Big("b"));
  }
  job.Settle();
  // Known "a" and "b" (cycles) mixed with new "c" and "d" (rank 0), submitted in
  // different orders on different ranks.
  job[0].Submit(Big("c"));
  job[0].Submit(Big("a"));
  job[1].Submit(Big("a"));
  job[1].Submit(Big("d"));
  job[1].Submit(Big("c"));
  job[2].Submit(Big("d"));
  job[2].Submit(Big("c"));
  job[2].Submit(Big("a"));
  job[0].Submit(Big("d"));
  job.Settle();
  for (int r = 0; r < 3; ++r) job[r].Submit(Big("b"));
  job.Settle();
  const std::vector<std::string>& first = job[0].recorder.ran;
  REQUIRE(!first.empty());
  for (int r = 1; r < 3; ++r) CHECK_EQ(job[r].recorder.ran, first);
  // Every tensor ran once per submission: a and b twice, c and d once (fused or not).
  std::string all;
  for (const std::string& line : first) all += line + " ";
  for (const char* name : {" a ", " b ", " c ", " d "}) {
    size_t count = 0;
    for (size_t at = all.find(name); at != std::string::npos; at = all.find(name, at + 1)) ++count;
    const size_t want = (std::string(name) == " a " || std::string(name) == " b ") ? 2 : 1;
    CHECK_EQ(count, want);
  }
  for (int r = 0; r < 3; ++r) CHECK(!job[r].queue.HasOutstanding());
}

TEST(negotiator_a_small_known_tensor_is_carried_and_summed_by_the_cycle) {
  Job job(2);
  std::vector<float> in[2] = {{1, 2, 3, 4}, {10, 20, 30, 40}};
  for (int r = 0; r < 2; ++r) job[r].Submit(unit::Allreduce("s", {4}), in[r].data());
  job.Settle();
  for (int r = 0; r < 2; ++r) CHECK_EQ(job[r].recorder.ran, (std::vector<std::string>{"allreduce s"}));
  for (int r = 0; r < 2; ++r) job[r].Submit(unit::Allreduce("s", {4}), in[r].data());
  job.Settle();
  for (int r = 0; r < 2; ++r) {
    CHECK_EQ(job[r].recorder.ran, (std::vector<std::string>{"allreduce s", "carried s"}));
    REQUIRE(job[r].recorder.carried_sums.size() == 1u);
    CHECK_EQ(job[r].recorder.carried_sums[0], (std::vector<float>{11, 22, 33, 44}));
  }
}

TEST(negotiator_ranks_that_disagree_fail_the_tensor_on_every_rank) {
  Job job(2);
  job[0].Submit(unit::Allreduce("x", {4, 4}));
  job[1].Submit(unit::Allreduce("x", {4, 5}));
  job.Settle();
  for (int r = 0; r < 2; ++r) {
    CHECK_EQ(job[r].recorder.ran, (std::vector<std::string>{"allreduce x failed"}));
    REQUIRE(job[r].recorder.errors.size() == 1u);
    CHECK_CONTAINS(job[r].recorder.errors[0], "x");
  }
  // The failure leaves the negotiation usable: a good request runs afterwards.
  for (int r = 0; r < 2; ++r) job[r].Submit(Big("y"));
  job.Settle();
  for (int r = 0; r < 2; ++r) CHECK_EQ(job[r].recorder.ran.back(), std::string("allreduce y"));
}

TEST(negotiator_a_worker_that_shuts_down_shuts_the_job_down_with_a_handshake) {
  Job job(3);
  CHECK(job[2].negotiator.Step(/*stop_requested=*/true));
  CHECK(job[2].negotiator.shutdown().state() == ShutdownState::State::kLeaving);
  job.Settle();
  CHECK(job[0].negotiator.Finished());
  for (int r = 1; r < 3; ++r) CHECK(job[r].negotiator.shutdown().Stopped());
  for (int r = 0; r < 3; ++r) {
    CHECK_CONTAINS(job[r].negotiator.shutdown().reason(), "rank 2 shut down");
    CHECK(!job[r].negotiator.shutdown().failure());
    CHECK(job[r].recorder.aborts.empty());
  }
}

TEST(negotiator_rank0_that_shuts_down_tells_every_worker) {
  Job job(2);
  job[0].negotiator.Step(/*stop_requested=*/true);
  CHECK(job[0].negotiator.shutdown().state() == ShutdownState::State::kAnnounced);
  CHECK(!job[0].negotiator.Finished());  // the worker has not acknowledged yet
  job.Settle();
  CHECK(job[0].negotiator.Finished());
  CHECK(job[1].negotiator.shutdown().Stopped());
  CHECK_CONTAINS(job[1].negotiator.shutdown().reason(), "rank 0 shut down");
}

TEST(negotiator_a_workers_failure_stops_every_rank_with_its_reason) {
  Job job(3);
  job[1].negotiator.Fail("allreduce 'g' failed on rank 1: NCCL error");
  CHECK(job[1].negotiator.shutdown().failure());
  REQUIRE(job[1].recorder.aborts.size() == 1u);  // this rank's device work stops at once
  job.Settle();
  CHECK(job[0].negotiator.Finished());
  for (int r = 0; r < 3; ++r) {
    CHECK(job[r].negotiator.shutdown().failure());
    CHECK_EQ(job[r].negotiator.shutdown().reason(), std::string("allreduce 'g' failed on rank 1: NCCL error"));
    CHECK(!job[r].recorder.aborts.empty());
  }
}

TEST(negotiator_requests_after_shutdown_are_not_routed) {
  Job job(2);
  job[0].negotiator.Step(true);
  job.Settle();
  for (int r = 0; r < 2; ++r) job[r].Submit(Big("late"));
  job.Settle();
  for (int r = 0; r < 2; ++r) {
    CHECK(job[r].recorder.ran.empty());
    CHECK(job[r].queue.HasOutstanding());  // left for the engine to fail with the reason
  }
}
