// CacheCycle (negotiation/cache_cycle.h): the steady-state cycles, with N simulated
// ranks that agree through the in-process FakeWorld (fake_transport.h). Every rank has
// its own config, response cache and cycle, filled alike, as the engine keeps them.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "fake_transport.h"
#include "negotiation/cache_cycle.h"
#include "requests.h"

using namespace hvdlite;
using unit::Allgather;
using unit::Allreduce;
using unit::Limits;
using unit::OnRank;

namespace {

constexpr int64_t kT0 = 5000000;

struct Ranks {
  unit::FakeWorld world;
  std::vector<std::unique_ptr<Config>> configs;
  std::vector<std::unique_ptr<ResponseCache>> caches;
  std::vector<std::unique_ptr<CacheCycle>> cycles;
  int64_t now = kT0;

  explicit Ranks(int n, FusionLimits host = Limits(1 << 20, 1 << 20, 1 << 20), int64_t capacity = 256)
      : world(n) {
    Parameters p;
    p.cache_capacity = capacity;
    for (int r = 0; r < n; ++r) {
      configs.push_back(unit::MakeConfig(p, host, host));
      caches.push_back(std::make_unique<ResponseCache>(capacity));
      cycles.push_back(std::make_unique<CacheCycle>(world.rank(r), configs.back().get()));
    }
  }
  int size() const { return static_cast<int>(cycles.size()); }

  // Every rank caches `sig` under `id`.
  void Put(int32_t id, const Request& sig, std::vector<int64_t> sizes = {}) {
    for (auto& c : caches) c->Put(id, sig, sizes);
  }
  // Rank `rank` has its request for entry `id` ready.
  void Ready(int rank, int32_t id, const void* input = nullptr) {
    Request q = caches[rank]->Get(id);
    q.rank = rank;
    cycles[rank]->AddReady(id, q, now, input);
  }

  // Runs one cycle on every rank (rank 0 announcing `lists_sent`); the outcomes by rank.
  std::vector<CacheCycle::Outcome> Cycle(int64_t lists_sent = 0) {
    now += 100;
    for (int r = 0; r < size(); ++r) {
      const bool started = cycles[r]->MaybeStart(r == 0 ? lists_sent : -1, /*must=*/true, caches[r]->Empty(), now);
      if (!started) throw std::logic_error("rank " + std::to_string(r) + " did not start the cycle");
    }
    std::vector<CacheCycle::Outcome> out(size());
    for (int r = 0; r < size(); ++r)
      if (!cycles[r]->Poll(*caches[r], now, &out[r]))
        throw std::logic_error("rank " + std::to_string(r) + "'s cycle did not complete");
    return out;
  }
};

std::vector<std::string> MovedNames(const CacheCycle::Outcome& o) {
  std::vector<std::string> out;
  for (const Request& q : o.moved) out.push_back(q.name);
  return out;
}

}  // namespace

TEST(fake_transport_agreement_is_and_and_waits_for_every_rank) {
  unit::FakeWorld world(3);
  std::vector<std::unique_ptr<BitAgreement>> a;
  for (int r = 0; r < 3; ++r) a.push_back(world.rank(r)->NewBitAgreement(2, 64));
  const uint64_t words[3][2] = {{0xF0F0, 7}, {0xFF00, 5}, {0xF000, 13}};
  a[0]->Start(words[0], 0, nullptr, 0, DataType::kFloat32);
  a[1]->Start(words[1], 0, nullptr, 0, DataType::kFloat32);
  CHECK(!a[0]->Progress());  // rank 2 has not started
  CHECK(a[0]->Active());
  a[2]->Start(words[2], 0, nullptr, 0, DataType::kFloat32);
  for (int r = 0; r < 3; ++r) {
    REQUIRE(a[r]->Progress());
    CHECK(!a[r]->Active());
    CHECK_EQ(a[r]->Result()[0], uint64_t{0xF000});
    CHECK_EQ(a[r]->Result()[1], uint64_t{5});
    CHECK_EQ(a[r]->ResultKey(), uint64_t{0});
  }
}

TEST(cache_cycle_ready_on_every_rank) {
  Ranks ranks(3);
  ranks.Put(0, Allreduce("a", {100000}));  // too large to carry
  ranks.Put(1, Allreduce("b", {100000}));
  for (int r = 0; r < 3; ++r) {
    ranks.Ready(r, 0);
    ranks.Ready(r, 1);
  }
  auto out = ranks.Cycle();
  for (int r = 0; r < 3; ++r) {
    CHECK_EQ(out[r].cycle, 1);
    CHECK_EQ(out[r].ready, (std::vector<int32_t>{0, 1}));
    CHECK(out[r].evicted.empty());
    CHECK(out[r].moved.empty());
    CHECK(!out[r].evict_all);
    CHECK_EQ(out[r].reduced_id, -1);
    REQUIRE_EQ(out[r].since_us.size(), 2u);  // when each agreed tensor became ready, in id order
    CHECK_EQ(out[r].since_us[0].first, 0);
    CHECK_EQ(out[r].since_us[1].first, 1);
    CHECK(!ranks.cycles[r]->HasReady());
    CHECK_EQ(ranks.cycles[r]->completed(), 1);
  }
}

TEST(cache_cycle_ready_on_some_ranks_waits) {
  Ranks ranks(3);
  ranks.Put(4, Allreduce("a", {100000}));
  ranks.Ready(0, 4);
  ranks.Ready(2, 4);
  auto out = ranks.Cycle();
  for (int r = 0; r < 3; ++r) {
    CHECK(out[r].ready.empty());
    CHECK(out[r].moved.empty());
  }
  CHECK(ranks.cycles[0]->HasReady());  // still waiting for rank 1
  CHECK(ranks.cycles[2]->HasReady());
  CHECK(!ranks.cycles[1]->HasReady());
  // Waiting since the first cycle: what the stall inspector is told.
  auto waiting = ranks.cycles[0]->WaitingSince(ranks.now + 1);
  REQUIRE_EQ(waiting.size(), 1u);
  CHECK_EQ(waiting[0].first, 4);
  CHECK(ranks.cycles[0]->WaitingSince(kT0).empty());
  ranks.Ready(1, 4);
  out = ranks.Cycle();
  for (int r = 0; r < 3; ++r) {
    CHECK_EQ(out[r].cycle, 2);
    CHECK_EQ(out[r].ready, std::vector<int32_t>{4});
    CHECK(!ranks.cycles[r]->HasReady());
  }
}

TEST(cache_cycle_agrees_in_id_order_whatever_order_tensors_became_ready) {
  Ranks ranks(2);
  for (int32_t id = 0; id < 5; ++id) ranks.Put(id, Allreduce("t" + std::to_string(id), {100000}));
  for (int32_t id : {4, 1, 3, 0}) ranks.Ready(0, id);  // out of id order here
  for (int32_t id : {0, 1, 2, 4}) ranks.Ready(1, id);
  // One outcome reused from cycle to cycle, as the negotiator keeps it.
  std::vector<CacheCycle::Outcome> kept(2);
  auto cycle = [&] {
    ranks.now += 100;
    for (int r = 0; r < 2; ++r) REQUIRE(ranks.cycles[r]->MaybeStart(r == 0 ? 0 : -1, true, false, ranks.now));
    for (int r = 0; r < 2; ++r) REQUIRE(ranks.cycles[r]->Poll(*ranks.caches[r], ranks.now, &kept[r]));
  };
  cycle();
  for (int r = 0; r < 2; ++r) {
    CHECK_EQ(kept[r].ready, (std::vector<int32_t>{0, 1, 4}));
    REQUIRE_EQ(kept[r].since_us.size(), 3u);
    CHECK_EQ(kept[r].since_us[2].first, 4);
  }
  // What waits stays, in order, and goes in the next cycle with what joins it.
  ranks.Ready(0, 2);
  ranks.Ready(1, 3);
  cycle();
  for (int r = 0; r < 2; ++r) {
    CHECK_EQ(kept[r].cycle, 2);
    CHECK_EQ(kept[r].ready, (std::vector<int32_t>{2, 3}));
    CHECK_EQ(kept[r].since_us.size(), 2u);
    CHECK(!ranks.cycles[r]->HasReady());
  }
}

TEST(cache_cycle_eviction_by_one_rank_evicts_on_all) {
  Ranks ranks(3);
  ranks.Put(0, Allreduce("keep", {100000}));
  ranks.Put(1, Allreduce("changed", {100000}));
  for (int r = 0; r < 3; ++r) ranks.Ready(r, 0);
  ranks.Ready(0, 1);
  ranks.Ready(2, 1);
  ranks.cycles[1]->Evict(1);  // rank 1's request for "changed" no longer matches
  auto out = ranks.Cycle();
  for (int r = 0; r < 3; ++r) {
    CHECK_EQ(out[r].evicted, std::vector<int32_t>{1});
    CHECK_EQ(out[r].ready, std::vector<int32_t>{0});
    CHECK(!out[r].evict_all);
    CHECK(!ranks.cycles[r]->HasReady());
  }
  // The ranks that had it ready get their requests back, to send to rank 0 in full.
  REQUIRE_EQ(MovedNames(out[0]), std::vector<std::string>{"changed"});
  CHECK_EQ(out[0].moved[0].rank, 0);
  CHECK(out[1].moved.empty());
  REQUIRE_EQ(MovedNames(out[2]), std::vector<std::string>{"changed"});
  CHECK_EQ(out[2].moved[0].rank, 2);
}

TEST(cache_cycle_evict_all) {
  Ranks ranks(2);
  ranks.Put(0, Allreduce("a", {4}));
  ranks.Put(1, Allreduce("b", {100000}));
  std::vector<float> data(4, 1.0f);
  for (int r = 0; r < 2; ++r) {
    ranks.Ready(r, 0, data.data());
    ranks.Ready(r, 1);
  }
  ranks.cycles[1]->SetEvictAll(true);  // rank 1 has joined
  auto out = ranks.Cycle();
  for (int r = 0; r < 2; ++r) {
    CHECK(out[r].evict_all);
    CHECK(out[r].ready.empty());
    CHECK_EQ(out[r].reduced_id, -1);  // nothing is reduced in an evicting cycle
    CHECK_EQ(MovedNames(out[r]), (std::vector<std::string>{"a", "b"}));
  }
  // Without evict_all the next cycle evicts nothing.
  ranks.cycles[1]->SetEvictAll(false);
  out = ranks.Cycle();
  CHECK(!out[0].evict_all);
  CHECK(!out[1].evict_all);
}

TEST(cache_cycle_carries_small_sum_allreduce) {
  Ranks ranks(3);
  ranks.Put(2, Allreduce("small", {5}));
  std::vector<std::vector<float>> in(3);
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 5; ++i) in[r].push_back(static_cast<float>(10 * r + i));
  for (int r = 0; r < 3; ++r) ranks.Ready(r, 2, in[r].data());
  auto out = ranks.Cycle();
  for (int r = 0; r < 3; ++r) {
    CHECK_EQ(out[r].reduced_id, 2);
    CHECK(out[r].ready.empty());  // needs no collective of its own
    REQUIRE(out[r].reduced != nullptr);
    const float* sum = static_cast<const float*>(out[r].reduced);
    for (int i = 0; i < 5; ++i) CHECK_EQ(sum[i], static_cast<float>(30 + 3 * i));
  }
}

TEST(cache_cycle_carried_tensor_is_prescaled) {
  Ranks ranks(2);
  Request q = Allreduce("scaled", {3}, DataType::kFloat64);
  q.prescale = 0.5;
  ranks.Put(0, q);
  const std::vector<double> a = {1.0, 2.0, 3.0}, b = {10.0, 20.0, 30.0};
  ranks.Ready(0, 0, a.data());
  ranks.Ready(1, 0, b.data());
  auto out = ranks.Cycle();
  REQUIRE_EQ(out[1].reduced_id, 0);
  const double* sum = static_cast<const double*>(out[1].reduced);
  CHECK_EQ(sum[0], 5.5);
  CHECK_EQ(sum[1], 11.0);
  CHECK_EQ(sum[2], 16.5);
  CHECK_EQ(a[0], 1.0);  // the input is left alone
}

TEST(cache_cycle_different_carried_ids_are_not_reduced) {
  Ranks ranks(2);
  ranks.Put(1, Allreduce("one", {4}));
  ranks.Put(2, Allreduce("two", {4}));
  std::vector<float> data(4, 2.0f);
  // Rank 0 carries entry 1 (its first), rank 1 only has entry 2.
  ranks.Ready(0, 1, data.data());
  ranks.Ready(0, 2, data.data());
  ranks.Ready(1, 2, data.data());
  auto out = ranks.Cycle();
  for (int r = 0; r < 2; ++r) {
    CHECK_EQ(out[r].reduced_id, -1);
    CHECK_EQ(out[r].ready, std::vector<int32_t>{2});  // runs as a collective instead
  }
  CHECK(ranks.cycles[0]->HasReady());  // entry 1 waits for rank 1
}

TEST(cache_cycle_can_carry) {
  Request q = Allreduce("x", {4});
  CHECK(CacheCycle::CanCarry(q));
  q.reduce_op = ReduceOp::kAverage;
  CHECK(CacheCycle::CanCarry(q));
  q.reduce_op = ReduceOp::kMax;
  CHECK(!CacheCycle::CanCarry(q));
  q.reduce_op = ReduceOp::kSum;
  q.device = 0;
  CHECK(!CacheCycle::CanCarry(q));  // GPU memory
  CHECK(CacheCycle::CanCarry(Allreduce("x", {CacheCycle::kMaxCarriedBytes / 4})));
  CHECK(!CacheCycle::CanCarry(Allreduce("x", {CacheCycle::kMaxCarriedBytes / 4 + 1})));
  CHECK(!CacheCycle::CanCarry(Allreduce("x", {0})));
  CHECK(!CacheCycle::CanCarry(Allgather("x", {4})));
}

TEST(cache_cycle_lists_before_is_rank_zeros_count) {
  Ranks ranks(3);
  ranks.Put(0, Allreduce("a", {100000}));
  for (int r = 0; r < 3; ++r) ranks.Ready(r, 0);
  auto out = ranks.Cycle(/*lists_sent=*/17);
  for (int r = 0; r < 3; ++r) CHECK_EQ(out[r].lists_before, 17);
  out = ranks.Cycle(/*lists_sent=*/18);
  for (int r = 0; r < 3; ++r) {
    CHECK_EQ(out[r].lists_before, 18);
    CHECK_EQ(out[r].cycle, 2);
  }
}

TEST(cache_cycle_collectives_fuse_by_config_limits) {
  // Each float32[25] allreduce holds 100 bytes; [10, 5] float32 allgathers on 2 ranks gather 400.
  Ranks ranks(2, Limits(/*allreduce=*/250, /*allgather_tensor=*/1000, /*allgather=*/800));
  ranks.Put(0, Allreduce("a", {25}));
  ranks.Put(1, Allreduce("b", {25}));
  ranks.Put(2, Allreduce("f64", {25}, DataType::kFloat64));
  ranks.Put(3, Allreduce("c", {25}));
  ranks.Put(4, Allreduce("d", {25}));
  ranks.Put(5, Allgather("g1", {10, 5}), {10, 10});
  ranks.Put(6, Allgather("g2", {10, 5}), {10, 10});
  ranks.Put(7, Allgather("big", {30, 5}), {30, 30});
  ranks.Put(8, Allgather("g3", {10, 5}), {10, 10});
  std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 6, 7, 8};
  auto plan = ranks.cycles[0]->Collectives(ids, *ranks.caches[0]);
  const std::vector<std::vector<int32_t>> expected = {{0, 1}, {2}, {3, 4}, {5, 6}, {7}, {8}};
  CHECK_EQ(plan, expected);
  CHECK_EQ(ranks.cycles[1]->Collectives(ids, *ranks.caches[1]), expected);
  // A change of the limits (the autotuner's) changes the plan.
  ranks.configs[0]->SetFusion(Limits(1 << 20, 1000, 1 << 20), Limits(0));
  plan = ranks.cycles[0]->Collectives(ids, *ranks.caches[0]);
  CHECK_EQ(plan, (std::vector<std::vector<int32_t>>{{0, 1, 3, 4}, {2}, {5, 6, 8}, {7}}));
}

TEST(cache_cycle_does_not_start_without_reason) {
  Ranks ranks(2);
  CHECK(!ranks.cycles[0]->MaybeStart(0, /*must=*/false, true, kT0));
  CHECK(!ranks.cycles[0]->InFlight());
  ranks.Put(0, Allreduce("a", {4}));
  ranks.Ready(0, 0);
  CHECK(ranks.cycles[0]->MaybeStart(0, false, false, kT0));
  CHECK(ranks.cycles[0]->InFlight());
  CHECK(!ranks.cycles[0]->MaybeStart(0, true, false, kT0));  // one at a time
  CacheCycle::Outcome out;
  CHECK(!ranks.cycles[0]->Poll(*ranks.caches[0], kT0, &out));  // rank 1 has not started
  CHECK(ranks.cycles[1]->MaybeStart(-1, /*must=*/true, false, kT0));
  CHECK(ranks.cycles[0]->Poll(*ranks.caches[0], kT0, &out));
  CHECK_EQ(ranks.cycles[0]->started(), 1);
  CHECK_EQ(ranks.cycles[0]->completed(), 1);
}
