// What ranks tell the coordinator (Request) and what it answers (Response), and
// their byte encoding for the control channel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/common.h"
#include "common/tunables.h"

namespace hvdlite {

// One rank's wish to run one collective on one named tensor.
struct Request {
  int32_t rank = 0;
  RequestType type = RequestType::kAllreduce;
  DataType dtype = DataType::kFloat32;
  std::string name;
  std::vector<int64_t> shape;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = -1;
  std::vector<int64_t> splits;  // alltoall: rows sent to each rank
  int32_t group_id = -1;        // grouped allreduce: members share an id
  int32_t group_size = 0;
  // Where this rank's tensor lives: kCpuDevice (host memory) or a CUDA device index.
  // Ranks must agree on the kind of device, not on the index (each drives its own GPU).
  int32_t device = kCpuDevice;
  // The process set the collective runs in (0: all ranks). Only the global set exists
  // so far; the field keeps the wire format ready for more.
  int32_t process_set = 0;
  // Non-empty: this rank cannot take part (bad input it found itself). The request
  // still goes to the coordinator, which fails the collective on every rank with this
  // message, so the ranks that did submit it are not left waiting.
  std::string error;
};

// Everything a rank says in one message to the coordinator.
struct RequestList {
  std::vector<Request> requests;
  // This rank's cached tensors that have waited in cycles for long (stall reports):
  // cache ids, how long each has waited, and the number of cycles this rank had
  // completed when it looked (a later run of the tensor makes the report stale).
  std::vector<int32_t> waiting_ids;
  std::vector<int64_t> waiting_us;
  int64_t waiting_cycle = 0;
  bool shutdown = false;            // this rank asks the job to shut down
  bool shutdown_ack = false;        // this rank saw the shutdown and will send no more
  // With `shutdown`: the cycles this rank had completed when it asked (-1: unknown).
  int64_t cycles_completed = -1;
  // With `shutdown`: a failure on this rank (a GPU collective failed), and why. The
  // other ranks abort their device work instead of waiting for this rank's part.
  bool failure = false;
  std::string shutdown_reason;
  // Timeline records of this rank's process sets that the world's rank 0 is not in,
  // for rank 0 to write (TimelineWriter's encoding; global engine only).
  std::string timeline;
};

// The coordinator's instruction, identical on every rank: run this collective on
// these tensors (several names = one fused collective), or fail them with `error`.
struct Response {
  RequestType type = RequestType::kAllreduce;
  std::string error;                  // non-empty: fail every listed tensor with it
  std::vector<std::string> names;
  DataType dtype = DataType::kFloat32;
  ReduceOp reduce_op = ReduceOp::kSum;
  double prescale = 1.0;
  double postscale = 1.0;
  int32_t root = -1;
  int32_t device = kCpuDevice;  // rank 0's device; its kind is every rank's kind
  int32_t process_set = 0;
  // allreduce: element count per name; allgather: first dimension per rank, for each
  // name in turn (names.size() * world size entries); alltoall: the splits matrix,
  // row r = rows rank r sends to each rank.
  std::vector<int64_t> sizes;
  std::vector<int32_t> cache_ids;     // per name: id assigned in the response cache, or -1
  std::vector<int32_t> joined_ranks;  // ranks that joined and contribute zeros
  int32_t last_joined = -1;           // join: the last rank that joined
};

struct ResponseList {
  std::vector<Response> responses;  // in execution order
  // Runs after this many cycles (CacheCycle) have run, and before the next one's
  // tensors: the cycle rank 0 had in flight when it sent the list, or else the last
  // one it completed.
  int64_t after_cycle = 0;
  bool shutdown = false;
  std::string shutdown_reason;
  bool failure = false;  // the shutdown is a failure: abort device work in flight
  // With a clean shutdown: the cycles rank 0 completed. A rank with fewer sees the one
  // in flight through before it stops (every rank started it), -1: stop at once.
  int64_t shutdown_cycles = -1;
  // The autotuner's new settings, applied by every rank when it runs this list.
  bool has_tunables = false;
  Tunables tunables;
};

// A response carrying `q`'s kind, dtype, reduce op, scale factors, root and device,
// with no tensors listed yet.
Response ResponseTo(const Request& q);

// Bytes an allgather of `q`'s kind of rows gathers from all ranks (`rows`: per rank).
int64_t GatheredBytes(const Request& q, const std::vector<int64_t>& rows);

std::vector<uint8_t> Serialize(const RequestList& list);
RequestList DeserializeRequestList(const uint8_t* data, size_t size);
std::vector<uint8_t> Serialize(const ResponseList& list);
ResponseList DeserializeResponseList(const uint8_t* data, size_t size);

}  // namespace hvdlite
