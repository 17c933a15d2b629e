// ResponseCache (negotiation/response_cache.h): ids, signatures, capacity, eviction.
#include <string>
#include <vector>

#include "check.h"
#include "negotiation/response_cache.h"
#include "requests.h"

using namespace hvdlite;
using unit::Allgather;
using unit::Allreduce;
using unit::Broadcast;

TEST(response_cache_put_lookup_get) {
  ResponseCache cache(8);
  CHECK(cache.Enabled());
  CHECK(cache.Empty());
  const Request x = Allreduce("x", {4, 2});
  CHECK_EQ(cache.Lookup(x), -1);
  CHECK_EQ(cache.IdOf("x"), -1);
  cache.Put(3, x);
  CHECK(!cache.Empty());
  CHECK(cache.Has(3));
  CHECK(!cache.Has(2));
  CHECK_EQ(cache.Lookup(x), 3);
  CHECK_EQ(cache.IdOf("x"), 3);
  CHECK_EQ(cache.Get(3).name, "x");
  CHECK_EQ(cache.Get(3).shape, (std::vector<int64_t>{4, 2}));
  // Another rank's request for the same tensor hits too: the rank is not part of the signature.
  CHECK_EQ(cache.Lookup(unit::OnRank(x, 5)), 3);
}

TEST(response_cache_other_signature_is_not_a_hit) {
  ResponseCache cache(8);
  cache.Put(0, Allreduce("x", {4, 2}));
  CHECK_EQ(cache.Lookup(Allreduce("x", {4, 3})), -1);                     // shape
  CHECK_EQ(cache.Lookup(Allreduce("x", {4, 2}, DataType::kFloat64)), -1);  // dtype
  Request max = Allreduce("x", {4, 2});
  max.reduce_op = ReduceOp::kMax;
  CHECK_EQ(cache.Lookup(max), -1);
  Request scaled = Allreduce("x", {4, 2});
  scaled.postscale = 2.0;
  CHECK_EQ(cache.Lookup(scaled), -1);
  Request gpu = Allreduce("x", {4, 2});
  gpu.device = 0;
  CHECK_EQ(cache.Lookup(gpu), -1);
  CHECK_EQ(cache.Lookup(Allreduce("y", {4, 2})), -1);  // name
  // The name still knows its id, whatever the signature: a rank asks for its eviction.
  CHECK_EQ(cache.IdOf("x"), 0);
  CHECK_EQ(cache.Lookup(Allreduce("x", {4, 2})), 0);
}

TEST(response_cache_assign_ids_up_to_capacity) {
  ResponseCache cache(2);
  CHECK_EQ(cache.AssignId("a"), 0);
  CHECK_EQ(cache.AssignId("b"), 1);
  CHECK_EQ(cache.AssignId("c"), -1);  // full: c takes the full path
  cache.Put(0, Allreduce("a", {1}));
  cache.Put(1, Allreduce("b", {1}));
  CHECK_EQ(cache.AssignId("a"), 0);   // a name keeps its id
  CHECK_EQ(cache.AssignId("c"), -1);
  // An evicted id is given out again.
  cache.Erase(0);
  CHECK(!cache.Has(0));
  CHECK_EQ(cache.Lookup(Allreduce("a", {1})), -1);
  CHECK_EQ(cache.IdOf("a"), -1);
  CHECK_EQ(cache.AssignId("c"), 0);
  CHECK_EQ(cache.Lookup(Allreduce("b", {1})), 1);
}

TEST(response_cache_erase_unknown_id_is_harmless) {
  ResponseCache cache(8);
  cache.Put(0, Allreduce("a", {1}));
  cache.Erase(5);  // never given out: not freed either
  CHECK(cache.Has(0));
  CHECK_EQ(cache.AssignId("b"), 1);
}

TEST(response_cache_put_replaces_name_of_reused_id) {
  ResponseCache cache(4);
  cache.Put(2, Allreduce("old", {1}));
  cache.Put(2, Allreduce("new", {3}));
  CHECK_EQ(cache.IdOf("old"), -1);
  CHECK_EQ(cache.IdOf("new"), 2);
  CHECK_EQ(cache.Lookup(Allreduce("new", {3})), 2);
  // Ids below the highest put are not handed out again while taken.
  CHECK_EQ(cache.AssignId("other"), 3);
}

TEST(response_cache_clear) {
  ResponseCache cache(3);
  for (int i = 0; i < 3; ++i) cache.Put(cache.AssignId("t" + std::to_string(i)), Allreduce("t" + std::to_string(i), {1}));
  CHECK_EQ(cache.AssignId("full"), -1);
  cache.Clear();
  CHECK(cache.Empty());
  for (int i = 0; i < 3; ++i) {
    CHECK(!cache.Has(i));
    CHECK_EQ(cache.Lookup(Allreduce("t" + std::to_string(i), {1})), -1);
  }
  // Every id is free again.
  std::vector<int32_t> ids;
  for (const char* n : {"p", "q", "r"}) ids.push_back(cache.AssignId(n));
  std::sort(ids.begin(), ids.end());
  CHECK_EQ(ids, (std::vector<int32_t>{0, 1, 2}));
}

TEST(response_cache_disabled_at_capacity_zero) {
  ResponseCache cache(0);
  CHECK(!cache.Enabled());
  CHECK_EQ(cache.AssignId("x"), -1);
  CHECK_EQ(cache.Lookup(Allreduce("x", {1})), -1);
  // Nothing hits in a disabled cache, whatever it holds.
  cache.Put(0, Allreduce("x", {1}));
  CHECK_EQ(cache.Lookup(Allreduce("x", {1})), -1);
  CHECK_EQ(cache.AssignId("x"), -1);
}

TEST(response_cache_sizes_kept_per_entry) {
  ResponseCache cache(4);
  cache.Put(1, Allgather("g", {3, 2}), {3, 5, 1});
  CHECK_EQ(cache.Sizes(1), (std::vector<int64_t>{3, 5, 1}));
}

TEST(response_cache_what_is_cacheable) {
  CHECK(ResponseCache::Cacheable(Allreduce("x", {1})));
  CHECK(ResponseCache::Cacheable(Broadcast("w", {1}, 0)));
  CHECK(ResponseCache::Cacheable(Allgather("g", {1})));
  CHECK(!ResponseCache::Cacheable(Allreduce("allreduce.noname.12", {1})));
  Request refused = Allreduce("x", {1});
  refused.error = "bad";
  CHECK(!ResponseCache::Cacheable(refused));
  Request grouped = Allreduce("x", {1});
  grouped.group_id = 4;
  CHECK(ResponseCache::Cacheable(grouped));
  Request grouped_bcast = Broadcast("w", {1}, 0);
  grouped_bcast.group_id = 4;
  CHECK(!ResponseCache::Cacheable(grouped_bcast));
  CHECK(!ResponseCache::Cacheable(unit::MakeRequest(RequestType::kBarrier, "b", {})));
  CHECK(!ResponseCache::Cacheable(unit::MakeRequest(RequestType::kJoin, "j", {})));
  // Lookup never hits for what cannot be cached.
  ResponseCache cache(4);
  cache.Put(0, refused);
  CHECK_EQ(cache.Lookup(refused), -1);
}
