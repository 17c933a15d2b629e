// Coordinator (negotiation/coordinator.h): rank 0's counting, validation, ordering,
// fusion, joins, grouped allreduces, response-cache ids and stall reports, fed requests
// directly with made-up times.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "common/logging.h"
#include "negotiation/coordinator.h"
#include "requests.h"
#include "stderr_capture.h"

using namespace hvdlite;
using unit::Allgather;
using unit::Allreduce;
using unit::Broadcast;
using unit::Limits;
using unit::OnRank;
using unit::StderrOf;

namespace {

constexpr int64_t kT0 = 1000000000;  // a made-up clock, in microseconds
constexpr int64_t kSecond = 1000000;

// A coordinator of `size` ranks with its own config and response cache.
struct Rank0 {
  std::unique_ptr<Config> config;
  ResponseCache cache;
  Coordinator coordinator;

  explicit Rank0(int size, FusionLimits host = Limits(1 << 20, 1 << 20, 1 << 20), Parameters params = Parameters{})
      : config(unit::MakeConfig(params, host, host)),
        cache(params.cache_capacity),
        coordinator(size, config.get(), &cache, nullptr) {}

  // `r` from each of `ranks`.
  void Submit(const Request& r, const std::vector<int>& ranks, int64_t now = kT0) {
    for (int rank : ranks) coordinator.AddRequest(OnRank(r, rank), now);
  }
  ResponseList Take(bool hold_device = false) { return coordinator.TakeReady(hold_device); }
};

std::vector<std::string> Names(const ResponseList& list) {
  std::vector<std::string> out;
  for (const Response& r : list.responses)
    for (const std::string& n : r.names) out.push_back(n);
  return out;
}

// The error the coordinator answers when `per_rank[r]` is rank r's request for "x".
std::string ErrorFor(const std::vector<Request>& per_rank) {
  Rank0 c(static_cast<int>(per_rank.size()));
  for (size_t r = 0; r < per_rank.size(); ++r) c.coordinator.AddRequest(OnRank(per_rank[r], static_cast<int>(r)), kT0);
  ResponseList list = c.Take();
  if (list.responses.size() != 1) return "<" + std::to_string(list.responses.size()) + " responses>";
  return list.responses[0].error;
}

}  // namespace

TEST(coordinator_ready_only_when_every_rank_sent) {
  Rank0 c(3);
  c.Submit(Allreduce("x", {4}), {0, 2});
  CHECK(c.Take().responses.empty());
  CHECK(c.Take().responses.empty());  // asking again does not make it ready
  c.Submit(Allreduce("x", {4}), {1});
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 1u);
  const Response& r = list.responses[0];
  CHECK_EQ(r.error, "");
  CHECK_EQ(r.type, RequestType::kAllreduce);
  CHECK_EQ(r.names, std::vector<std::string>{"x"});
  CHECK_EQ(r.sizes, std::vector<int64_t>{4});
  CHECK(c.Take().responses.empty());  // answered once
}

TEST(coordinator_same_rank_twice_does_not_count_twice) {
  Rank0 c(2);
  c.Submit(Allreduce("x", {4}), {0});
  c.Submit(Allreduce("x", {4}), {0});
  CHECK(c.Take().responses.empty());
  c.Submit(Allreduce("x", {4}), {1});
  CHECK_EQ(Names(c.Take()), std::vector<std::string>{"x"});
}

TEST(coordinator_responses_in_order_tensors_became_ready) {
  Rank0 c(3, Limits(0));  // no fusion: one response per tensor
  c.Submit(Allreduce("first_sent", {4}), {0, 1});
  c.Submit(Allreduce("b", {4}), {0, 1, 2});
  c.Submit(Broadcast("c", {2}, 0), {2, 1, 0});
  c.Submit(Allreduce("first_sent", {4}), {2});
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 3u);
  CHECK_EQ(list.responses[0].names, std::vector<std::string>{"b"});
  CHECK_EQ(list.responses[1].names, std::vector<std::string>{"c"});
  CHECK_EQ(list.responses[1].type, RequestType::kBroadcast);
  CHECK_EQ(list.responses[1].root, 0);
  CHECK_EQ(list.responses[2].names, std::vector<std::string>{"first_sent"});
}

TEST(coordinator_error_when_ranks_disagree_on_dtype) {
  std::string e = ErrorFor({Allreduce("x", {4}), Allreduce("x", {4}, DataType::kFloat64),
                            Allreduce("x", {4}, DataType::kFloat64)});
  CHECK_CONTAINS(e, "allreduce 'x'");
  CHECK_CONTAINS(e, "ranks disagree on the data type");
  CHECK_CONTAINS(e, "rank 0 sent float32; ranks 1, 2 sent float64");
}

TEST(coordinator_error_when_ranks_disagree_on_shape) {
  std::string e = ErrorFor({Allreduce("x", {4, 3}), Allreduce("x", {5, 3}), Allreduce("x", {4, 3})});
  CHECK_CONTAINS(e, "allreduce 'x': ranks disagree on the shape");
  CHECK_CONTAINS(e, "ranks 0, 2 sent [4, 3]; rank 1 sent [5, 3]");
}

TEST(coordinator_error_when_ranks_disagree_on_reduce_op) {
  Request max = Allreduce("x", {4});
  max.reduce_op = ReduceOp::kMax;
  std::string e = ErrorFor({Allreduce("x", {4}), max});
  CHECK_CONTAINS(e, "ranks disagree on the reduce op");
  CHECK_CONTAINS(e, "rank 0 sent Sum; rank 1 sent Max");
}

TEST(coordinator_error_when_ranks_disagree_on_scale_factor) {
  Request scaled = Allreduce("x", {4});
  scaled.prescale = 0.5;
  std::string e = ErrorFor({Allreduce("x", {4}), scaled});
  CHECK_CONTAINS(e, "ranks disagree on prescale_factor");
  CHECK_CONTAINS(e, "rank 0 sent 1; rank 1 sent 0.5");
}

TEST(coordinator_error_when_ranks_disagree_on_broadcast_root) {
  std::string e = ErrorFor({Broadcast("w", {2}, 0), Broadcast("w", {2}, 1), Broadcast("w", {2}, 0)});
  CHECK_CONTAINS(e, "broadcast 'w': ranks disagree on the root rank");
  CHECK_CONTAINS(e, "ranks 0, 2 sent 0; rank 1 sent 1");
}

TEST(coordinator_error_when_broadcast_root_outside_world) {
  std::string e = ErrorFor({Broadcast("w", {2}, 3), Broadcast("w", {2}, 3), Broadcast("w", {2}, 3)});
  CHECK_CONTAINS(e, "root rank 3 is outside the world of 3 ranks");
}

TEST(coordinator_error_when_ranks_disagree_on_operation) {
  std::string e = ErrorFor({Allreduce("x", {2}), Broadcast("x", {2}, 0)});
  CHECK_CONTAINS(e, "tensor 'x': ranks disagree on the operation");
  CHECK_CONTAINS(e, "rank 0 sent allreduce; rank 1 sent broadcast");
}

TEST(coordinator_error_when_ranks_disagree_on_device_kind) {
  Request gpu = Allreduce("x", {2});
  gpu.device = 0;
  std::string e = ErrorFor({Allreduce("x", {2}), gpu});
  CHECK_CONTAINS(e, "ranks disagree on the device");
  CHECK_CONTAINS(e, "rank 0 sent host memory; rank 1 sent GPU 0");
}

TEST(coordinator_ranks_on_different_gpus_agree) {
  Request a = Allreduce("x", {2}), b = Allreduce("x", {2});
  a.device = 0;
  b.device = 1;
  CHECK_EQ(ErrorFor({a, b}), "");
}

TEST(coordinator_error_for_allgather_tail_and_alltoall_splits) {
  std::string e = ErrorFor({Allgather("g", {3, 4}), Allgather("g", {5, 2})});
  CHECK_CONTAINS(e, "allgather 'g': ranks disagree on the shape");
  CHECK_CONTAINS(e, "rank 0 sent [4] after the first dimension; rank 1 sent [2] after the first dimension");
  Request a2a = unit::MakeRequest(RequestType::kAlltoall, "t", {4});
  Request bad = a2a;
  bad.splits = {1, 2};
  e = ErrorFor({a2a, bad});
  CHECK_CONTAINS(e, "alltoall 't': rank 1 sent splits [1, 2]");
  CHECK_CONTAINS(e, "summing to its first dimension 4");
}

TEST(coordinator_error_from_a_rank_that_refused) {
  Request refused = Allreduce("x", {4});
  refused.error = "its tensor is not contiguous";
  std::string e = ErrorFor({Allreduce("x", {4}), refused, Allreduce("x", {4})});
  CHECK_EQ(e, "rank 1: its tensor is not contiguous");
}

TEST(coordinator_error_for_adasum_on_three_ranks) {
  Request a = Allreduce("x", {4});
  a.reduce_op = ReduceOp::kAdasum;
  CHECK_CONTAINS(ErrorFor({a, a, a}), "Adasum needs a power-of-2 number of ranks");
  CHECK_EQ(ErrorFor({a, a}), "");
}

TEST(coordinator_error_response_goes_alone_and_name_is_usable_again) {
  Rank0 c(2);
  c.Submit(Allreduce("ok", {4}), {0, 1});
  c.Submit(Allreduce("x", {4}), {0});
  c.Submit(Allreduce("x", {5}), {1});
  c.Submit(Allreduce("ok2", {4}), {0, 1});
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 2u);
  CHECK_EQ(list.responses[0].names, (std::vector<std::string>{"ok", "ok2"}));
  CHECK_EQ(list.responses[0].error, "");
  CHECK_EQ(list.responses[1].names, std::vector<std::string>{"x"});
  CHECK_CONTAINS(list.responses[1].error, "disagree on the shape");
  CHECK_EQ(list.responses[1].cache_ids, std::vector<int32_t>{-1});
  // The failed name negotiates afresh.
  c.Submit(Allreduce("x", {5}), {0, 1});
  list = c.Take();
  REQUIRE_EQ(list.responses.size(), 1u);
  CHECK_EQ(list.responses[0].error, "");
  CHECK_EQ(list.responses[0].sizes, std::vector<int64_t>{5});
}

TEST(coordinator_fuses_allreduces_up_to_the_limit) {
  Rank0 c(2, Limits(3 * 400));  // three float32[100] fit exactly
  for (const char* n : {"a", "b", "c", "d", "e"}) c.Submit(Allreduce(n, {100}), {0, 1});
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 2u);
  CHECK_EQ(list.responses[0].names, (std::vector<std::string>{"a", "b", "c"}));
  CHECK_EQ(list.responses[0].sizes, (std::vector<int64_t>{100, 100, 100}));
  CHECK_EQ(list.responses[1].names, (std::vector<std::string>{"d", "e"}));
}

TEST(coordinator_fusion_follows_config_change) {
  Rank0 c(2, Limits(3 * 400));
  c.config->SetFusion(Limits(400), Limits(400));
  for (const char* n : {"a", "b"}) c.Submit(Allreduce(n, {100}), {0, 1});
  CHECK_EQ(c.Take().responses.size(), 2u);
  c.config->SetFusion(Limits(800), Limits(800));
  for (const char* n : {"a", "b"}) c.Submit(Allreduce(n, {100}), {0, 1});
  CHECK_EQ(c.Take().responses.size(), 1u);
}

TEST(coordinator_does_not_fuse_different_dtype_op_or_scale) {
  Rank0 c(2);
  Request max = Allreduce("max", {8});
  max.reduce_op = ReduceOp::kMax;
  Request scaled = Allreduce("scaled", {8});
  scaled.postscale = 0.5;
  c.Submit(Allreduce("f32.a", {8}), {0, 1});
  c.Submit(Allreduce("f64", {8}, DataType::kFloat64), {0, 1});
  c.Submit(max, {0, 1});
  c.Submit(scaled, {0, 1});
  c.Submit(Allreduce("f32.b", {8}), {0, 1});
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 4u);
  CHECK_EQ(list.responses[0].names, (std::vector<std::string>{"f32.a", "f32.b"}));
  CHECK_EQ(list.responses[1].names, std::vector<std::string>{"f64"});
  CHECK_EQ(list.responses[1].dtype, DataType::kFloat64);
  CHECK_EQ(list.responses[2].names, std::vector<std::string>{"max"});
  CHECK_EQ(list.responses[2].reduce_op, ReduceOp::kMax);
  CHECK_EQ(list.responses[3].names, std::vector<std::string>{"scaled"});
  CHECK_EQ(list.responses[3].postscale, 0.5);
}

TEST(coordinator_fuses_small_allgathers) {
  // Gathered bytes of a [10, 5] float32 allgather on 2 ranks: 20 rows * 5 * 4 = 400.
  Rank0 c(2, Limits(1 << 20, /*allgather_tensor_bytes=*/1000, /*allgather_bytes=*/1200));
  c.Submit(Allgather("g1", {10, 5}), {0, 1});
  c.Submit(Allgather("g2", {10, 5}, DataType::kInt32), {0, 1});
  c.Submit(Allgather("big", {30, 5}), {0, 1});  // 1200 bytes: not small, alone
  c.Submit(Allgather("g3", {10, 5}), {0, 1});
  c.Submit(Allgather("g4", {10, 5}), {0, 1});   // 1600 > 1200: opens the next one
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 3u);
  CHECK_EQ(list.responses[0].names, (std::vector<std::string>{"g1", "g2", "g3"}));
  CHECK_EQ(list.responses[0].sizes, (std::vector<int64_t>{10, 10, 10, 10, 10, 10}));
  CHECK_EQ(list.responses[1].names, std::vector<std::string>{"big"});
  CHECK_EQ(list.responses[2].names, std::vector<std::string>{"g4"});
}

TEST(coordinator_allgather_sizes_are_rows_per_rank) {
  Rank0 c(3);
  c.coordinator.AddRequest(OnRank(Allgather("g", {3, 2}), 0), kT0);
  c.coordinator.AddRequest(OnRank(Allgather("g", {5, 2}), 1), kT0);
  c.coordinator.AddRequest(OnRank(Allgather("g", {0, 2}), 2), kT0);
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 1u);
  CHECK_EQ(list.responses[0].error, "");
  CHECK_EQ(list.responses[0].sizes, (std::vector<int64_t>{3, 5, 0}));
}

TEST(coordinator_join_lets_allreduce_go_with_zeros_and_ends_last) {
  Rank0 c(3);
  Request join = unit::MakeRequest(RequestType::kJoin, "join", {});
  c.Submit(join, {2});
  c.Submit(Allreduce("x", {4}), {0, 1});
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 1u);
  CHECK_EQ(list.responses[0].names, std::vector<std::string>{"x"});
  CHECK_EQ(list.responses[0].joined_ranks, std::vector<int32_t>{2});
  CHECK_EQ(list.responses[0].cache_ids, std::vector<int32_t>{-1});  // not cached while a rank has joined
  // Only allreduce proceeds while a rank has joined.
  c.Submit(Broadcast("b", {2}, 0), {0, 1});
  list = c.Take();
  REQUIRE_EQ(list.responses.size(), 1u);
  CHECK_CONTAINS(list.responses[0].error, "broadcast 'b' cannot run while ranks [2] have joined");
  // Once every rank has joined, the join response comes last, naming the last rank.
  c.Submit(join, {1});
  CHECK(c.Take().responses.empty());
  c.Submit(Allreduce("y", {4}), {0});
  c.Submit(join, {0});
  list = c.Take();
  REQUIRE_EQ(list.responses.size(), 2u);
  CHECK_EQ(list.responses[0].names, std::vector<std::string>{"y"});
  // Ranks 1 and 2 contribute zeros. (Rank 0, which sent y before joining, is listed
  // too: the list is every rank joined when the round is taken; the executor goes by
  // the tensors each rank actually has.)
  const std::vector<int32_t>& joined = list.responses[0].joined_ranks;
  CHECK(std::find(joined.begin(), joined.end(), 1) != joined.end());
  CHECK(std::find(joined.begin(), joined.end(), 2) != joined.end());
  CHECK_EQ(list.responses[1].type, RequestType::kJoin);
  CHECK_EQ(list.responses[1].last_joined, 0);
  // The join is over: every rank must send again.
  c.Submit(Allreduce("z", {4}), {0, 1});
  CHECK(c.Take().responses.empty());
}

TEST(coordinator_grouped_allreduce_held_until_whole) {
  Rank0 c(2);
  Request a = Allreduce("g.a", {4}), b = Allreduce("g.b", {4});
  a.group_id = b.group_id = 7;
  a.group_size = b.group_size = 2;
  c.Submit(a, {0, 1});
  CHECK(c.Take().responses.empty());
  c.Submit(Allreduce("u", {4}, DataType::kInt32), {0, 1});
  CHECK_EQ(Names(c.Take()), std::vector<std::string>{"u"});
  c.Submit(b, {1, 0});
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 1u);
  CHECK_EQ(list.responses[0].names, (std::vector<std::string>{"g.a", "g.b"}));
}

TEST(coordinator_group_member_failure_fails_the_rest) {
  Rank0 c(2);
  Request a = Allreduce("g.a", {4}), b = Allreduce("g.b", {4});
  a.group_id = b.group_id = 3;
  a.group_size = b.group_size = 2;
  Request a3 = a;
  a3.group_size = 3;  // rank 1 thinks the group is larger: g.a goes ahead to fail
  c.Submit(a, {0});
  c.Submit(a3, {1});
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 1u);
  CHECK_EQ(list.responses[0].names, std::vector<std::string>{"g.a"});
  CHECK_CONTAINS(list.responses[0].error, "ranks disagree on the size of the group");
  // Rank 0 sends the other member; rank 1 never does. It fails rather than waiting.
  c.Submit(b, {0});
  list = c.Take();
  REQUIRE_EQ(list.responses.size(), 1u);
  CHECK_EQ(list.responses[0].names, std::vector<std::string>{"g.b"});
  CHECK_CONTAINS(list.responses[0].error, "allreduce 'g.b': not run, another member of its group failed");
}

TEST(coordinator_cache_ids_when_cache_on) {
  Rank0 c(2);
  REQUIRE(c.config->tunables().cache_enabled);
  c.Submit(Allreduce("x", {4}), {0, 1});
  c.Submit(Allreduce("y", {4}), {0, 1});
  c.Submit(Allreduce("allreduce.noname.3", {4}), {0, 1});  // one-off names are not cached
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 1u);
  CHECK_EQ(list.responses[0].cache_ids, (std::vector<int32_t>{0, 1, -1}));
  // Once every rank put x in its cache, x keeps its id; a new name gets the next one.
  c.cache.Put(0, Allreduce("x", {4}));
  c.cache.Put(1, Allreduce("y", {4}));
  c.Submit(Allreduce("x", {4}), {0, 1});
  c.Submit(Allreduce("z", {4}), {0, 1});
  list = c.Take();
  REQUIRE_EQ(list.responses.size(), 1u);
  CHECK_EQ(list.responses[0].cache_ids, (std::vector<int32_t>{0, 2}));
}

TEST(coordinator_no_cache_ids_when_cache_off) {
  Rank0 c(2);
  Tunables t = c.config->tunables();
  t.cache_enabled = 0;
  c.config->Apply(t);
  c.Submit(Allreduce("x", {4}), {0, 1});
  c.Submit(Broadcast("w", {4}, 1), {0, 1});
  ResponseList list = c.Take();
  REQUIRE_EQ(list.responses.size(), 2u);
  CHECK_EQ(list.responses[0].cache_ids, std::vector<int32_t>{-1});
  CHECK_EQ(list.responses[1].cache_ids, std::vector<int32_t>{-1});
}

TEST(coordinator_holds_gpu_tensors_while_device_busy) {
  Rank0 c(2);
  Request gpu = Allreduce("gpu", {4});
  gpu.device = 0;
  c.Submit(gpu, {0, 1});
  c.Submit(Allreduce("host", {4}), {0, 1});
  CHECK_EQ(Names(c.Take(/*hold_device=*/true)), std::vector<std::string>{"host"});
  ResponseList list = c.Take(false);
  REQUIRE_EQ(list.responses.size(), 1u);
  CHECK_EQ(list.responses[0].names, std::vector<std::string>{"gpu"});
  CHECK_EQ(list.responses[0].device, 0);
}

TEST(coordinator_stall_warning_names_missing_ranks) {
  SetLogContext(0, 3);
  Parameters p;
  p.stall_check_seconds = 1.0;
  p.stall_shutdown_seconds = 3.0;
  Rank0 c(4, Limits(1 << 20), p);
  c.Submit(Allreduce("x", {4}), {0, 2}, kT0);
  std::string reason = "unset";
  std::string err = StderrOf([&] { reason = c.coordinator.CheckStalls(kT0 + kSecond / 2); });
  CHECK_EQ(reason, "");
  CHECK_EQ(err, "");  // not yet a stall
  err = StderrOf([&] { reason = c.coordinator.CheckStalls(kT0 + 3 * kSecond / 2); });
  CHECK_EQ(reason, "");
  CHECK_CONTAINS(err, "stall detected: allreduce 'x' has waited 1 s: submitted by ranks [0, 2], missing ranks [1, 3]");
  err = StderrOf([&] { reason = c.coordinator.CheckStalls(kT0 + 16 * kSecond / 10); });
  CHECK_EQ(err, "");  // warned once per check interval
  err = StderrOf([&] { reason = c.coordinator.CheckStalls(kT0 + 7 * kSecond / 2); });
  CHECK_CONTAINS(reason, "hvdlite shut down after a stall of 3 s");
  CHECK_CONTAINS(reason, "missing ranks [1, 3]");
}

TEST(coordinator_stall_names_overdue_ranks_only_past_the_limit) {
  SetLogContext(0, 3);
  Parameters p;
  p.stall_check_seconds = 1.0;
  p.stall_shutdown_seconds = 3.0;
  Rank0 c(4, Limits(1 << 20), p);
  c.Submit(Allreduce("x", {4}), {0, 1, 2}, kT0);
  c.Submit(Allreduce("y", {4}), {0, 2, 3}, kT0 + kSecond);
  std::vector<int> overdue;
  StderrOf([&] { c.coordinator.CheckStalls(kT0 + 2 * kSecond, &overdue); });
  CHECK(overdue.empty());  // warned of, not yet overdue
  StderrOf([&] { c.coordinator.CheckStalls(kT0 + 7 * kSecond / 2, &overdue); });
  CHECK_EQ(overdue, std::vector<int>{3});  // 'y' has waited 2.5 s only
  overdue.clear();
  StderrOf([&] { c.coordinator.CheckStalls(kT0 + 9 * kSecond / 2, &overdue); });
  CHECK_EQ(overdue, (std::vector<int>{1, 3}));
}

TEST(coordinator_stall_check_off) {
  Parameters p;
  p.stall_check_seconds = 0.0;
  p.stall_shutdown_seconds = 1.0;
  Rank0 c(2, Limits(1 << 20), p);
  c.Submit(Allreduce("x", {4}), {0}, kT0);
  std::string reason = "unset";
  std::string err = StderrOf([&] { reason = c.coordinator.CheckStalls(kT0 + 3600 * kSecond); });
  CHECK_EQ(reason, "");
  CHECK_EQ(err, "");
}

TEST(coordinator_stall_of_cached_tensor_and_stale_report) {
  SetLogContext(0, 3);
  Parameters p;
  p.stall_check_seconds = 1.0;
  p.stall_shutdown_seconds = 2.0;
  Rank0 c(3, Limits(1 << 20), p);
  const Request sig = Allreduce("cached", {4});
  // Rank 1 has waited 3 s in cycles for entry 5 after its 10th cycle.
  c.coordinator.ReportCachedWait(1, 5, sig, 3 * kSecond, 10, kT0);
  std::string reason;
  std::string err = StderrOf([&] { reason = c.coordinator.CheckStalls(kT0); });
  CHECK_CONTAINS(err, "allreduce 'cached' has waited 3 s: submitted by ranks [1], missing ranks [0, 2]");
  CHECK_CONTAINS(reason, "stall of 3 s");
  // Every rank ran it after cycle 11: the report is over, and a late one from cycle 10 is stale.
  c.coordinator.CachedRan(5, 11);
  c.coordinator.ReportCachedWait(1, 5, sig, 3 * kSecond, 10, kT0 + kSecond);
  err = StderrOf([&] { reason = c.coordinator.CheckStalls(kT0 + 10 * kSecond); });
  CHECK_EQ(reason, "");
  CHECK_EQ(err, "");
  // The next step: rank 1 waits again after cycle 11, in which the tensor last ran.
  // That is a new wait (a rank stopped between two steps), not a stale report.
  c.coordinator.ReportCachedWait(1, 5, sig, 3 * kSecond, 11, kT0 + 20 * kSecond);
  err = StderrOf([&] { reason = c.coordinator.CheckStalls(kT0 + 20 * kSecond); });
  CHECK_CONTAINS(err, "allreduce 'cached' has waited 3 s: submitted by ranks [1], missing ranks [0, 2]");
  CHECK_CONTAINS(reason, "stall of 3 s");
}
