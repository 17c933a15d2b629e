// Control messages (common/message.h): the byte encoding round-trips every field, and a
// truncated message is an error, not garbage.
#include <stdexcept>
#include <vector>

#include "check.h"
#include "common/message.h"
#include "requests.h"

using namespace hvdlite;

TEST(message_request_list_round_trip) {
  RequestList list;
  Request q = unit::MakeRequest(RequestType::kAlltoall, "layer1/weight:0", {6, 2}, DataType::kBFloat16, 3);
  q.reduce_op = ReduceOp::kMax;
  q.prescale = 0.25;
  q.postscale = 4.0;
  q.root = 1;
  q.splits = {1, 2, 3};
  q.group_id = 9;
  q.group_size = 2;
  q.device = 1;
  q.process_set = 5;
  q.error = "refused";
  list.requests = {q, unit::Allreduce("b", {})};
  list.waiting_ids = {4, 7};
  list.waiting_us = {100, 200};
  list.waiting_cycle = 12;
  list.shutdown = true;
  list.shutdown_ack = true;
  list.cycles_completed = 99;
  list.failure = true;
  list.shutdown_reason = "GPU failed";
  list.timeline = std::string("rec\0ord", 7);
  const std::vector<uint8_t> bytes = Serialize(list);
  RequestList back = DeserializeRequestList(bytes.data(), bytes.size());
  REQUIRE_EQ(back.requests.size(), 2u);
  const Request& r = back.requests[0];
  CHECK_EQ(r.rank, 3);
  CHECK_EQ(r.type, RequestType::kAlltoall);
  CHECK_EQ(r.dtype, DataType::kBFloat16);
  CHECK_EQ(r.name, "layer1/weight:0");
  CHECK_EQ(r.shape, (std::vector<int64_t>{6, 2}));
  CHECK_EQ(r.reduce_op, ReduceOp::kMax);
  CHECK_EQ(r.prescale, 0.25);
  CHECK_EQ(r.postscale, 4.0);
  CHECK_EQ(r.root, 1);
  CHECK_EQ(r.splits, (std::vector<int64_t>{1, 2, 3}));
  CHECK_EQ(r.group_id, 9);
  CHECK_EQ(r.group_size, 2);
  CHECK_EQ(r.device, 1);
  CHECK_EQ(r.process_set, 5);
  CHECK_EQ(r.error, "refused");
  CHECK_EQ(back.requests[1].name, "b");
  CHECK(back.requests[1].shape.empty());
  CHECK_EQ(back.waiting_ids, (std::vector<int32_t>{4, 7}));
  CHECK_EQ(back.waiting_us, (std::vector<int64_t>{100, 200}));
  CHECK_EQ(back.waiting_cycle, 12);
  CHECK(back.shutdown);
  CHECK(back.shutdown_ack);
  CHECK_EQ(back.cycles_completed, 99);
  CHECK(back.failure);
  CHECK_EQ(back.shutdown_reason, "GPU failed");
  CHECK_EQ(back.timeline, std::string("rec\0ord", 7));
}

TEST(message_response_list_round_trip) {
  ResponseList list;
  Response r;
  r.type = RequestType::kAllgather;
  r.names = {"a", "b"};
  r.dtype = DataType::kInt64;
  r.reduce_op = ReduceOp::kProduct;
  r.prescale = 2.0;
  r.postscale = 0.5;
  r.root = 2;
  r.device = 0;
  r.process_set = 1;
  r.sizes = {1, 2, 3, 4};
  r.cache_ids = {5, -1};
  r.joined_ranks = {1};
  r.last_joined = 1;
  Response failed;
  failed.error = "ranks disagree";
  failed.names = {"c"};
  list.responses = {r, failed};
  list.after_cycle = 42;
  list.shutdown = true;
  list.shutdown_reason = "stall";
  list.failure = false;
  list.shutdown_cycles = 41;
  list.has_tunables = true;
  list.tunables.fusion_threshold_bytes = 1 << 22;
  list.tunables.cycle_time_ms = 0.2;
  list.tunables.cache_enabled = 0;
  list.tunables.hierarchical = 1;
  const std::vector<uint8_t> bytes = Serialize(list);
  ResponseList back = DeserializeResponseList(bytes.data(), bytes.size());
  REQUIRE_EQ(back.responses.size(), 2u);
  const Response& b = back.responses[0];
  CHECK_EQ(b.type, RequestType::kAllgather);
  CHECK_EQ(b.error, "");
  CHECK_EQ(b.names, (std::vector<std::string>{"a", "b"}));
  CHECK_EQ(b.dtype, DataType::kInt64);
  CHECK_EQ(b.reduce_op, ReduceOp::kProduct);
  CHECK_EQ(b.prescale, 2.0);
  CHECK_EQ(b.postscale, 0.5);
  CHECK_EQ(b.root, 2);
  CHECK_EQ(b.device, 0);
  CHECK_EQ(b.process_set, 1);
  CHECK_EQ(b.sizes, (std::vector<int64_t>{1, 2, 3, 4}));
  CHECK_EQ(b.cache_ids, (std::vector<int32_t>{5, -1}));
  CHECK_EQ(b.joined_ranks, std::vector<int32_t>{1});
  CHECK_EQ(b.last_joined, 1);
  CHECK_EQ(back.responses[1].error, "ranks disagree");
  CHECK_EQ(back.after_cycle, 42);
  CHECK(back.shutdown);
  CHECK_EQ(back.shutdown_reason, "stall");
  CHECK(!back.failure);
  CHECK_EQ(back.shutdown_cycles, 41);
  CHECK(back.has_tunables);
  CHECK(back.tunables == list.tunables);
}

TEST(message_truncated_is_an_error) {
  RequestList list;
  list.requests = {unit::Allreduce("x", {3, 4})};
  std::vector<uint8_t> bytes = Serialize(list);
  int thrown = 0;
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      DeserializeRequestList(bytes.data(), n);
    } catch (const std::runtime_error& e) {
      ++thrown;
      if (std::string(e.what()).find("truncated control message") == std::string::npos) CHECK(false);
    }
  }
  CHECK_EQ(thrown, static_cast<int>(bytes.size()));
  ResponseList rl;
  rl.responses.resize(1);
  bytes = Serialize(rl);
  CHECK_THROWS(DeserializeResponseList(bytes.data(), bytes.size() - 1), std::runtime_error, "truncated");
}

TEST(message_response_to_and_gathered_bytes) {
  Request q = unit::Allgather("g", {4, 3, 2}, DataType::kFloat64);
  q.device = 2;
  q.root = 1;
  q.prescale = 3.0;
  Response r = ResponseTo(q);
  CHECK_EQ(r.type, RequestType::kAllgather);
  CHECK_EQ(r.dtype, DataType::kFloat64);
  CHECK_EQ(r.device, 2);
  CHECK_EQ(r.root, 1);
  CHECK_EQ(r.prescale, 3.0);
  CHECK(r.names.empty());
  // Rows of 3 * 2 float64 elements (48 bytes), 4 + 1 + 0 rows gathered.
  CHECK_EQ(GatheredBytes(q, {4, 1, 0}), 5 * 48);
}
