// Rank 0's half of the control plane: counts requests per tensor name, decides when a
// tensor is ready on every rank, validates that the ranks agree, orders and fuses the
// ready tensors, and watches for stalls. It knows nothing about MPI or memory: the
// engine feeds it requests and sends what it returns.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/config.h"
#include "common/message.h"
#include "negotiation/response_cache.h"

namespace hvdlite {

class Timeline;

class Coordinator {
 public:
  // `config`: the engine's (which outlives the coordinator). What may be fused for
  // tensors of each kind of device and whether new tensors get response-cache entries
  // are read from its tunables, as the autotuner sets them.
  Coordinator(int size, const Config* config, ResponseCache* cache, Timeline* timeline);

  // A request this rank or another sent in full.
  void AddRequest(const Request& r, int64_t now_us);

  // Stall reports for tensors that wait in cycles (CacheCycle): cache entry `id` (whose
  // signature is `sig`) has waited `waited_us` on `rank`, which had completed `cycle`
  // cycles. Only the stall inspector reads them; a report made before the entry last
  // ran or was evicted (CachedRan) is stale and dropped.
  void ReportCachedWait(int rank, int32_t id, const Request& sig, int64_t waited_us, int64_t cycle, int64_t now_us);
  // Every rank ran entry `id`, or evicted it, after cycle `cycle`.
  void CachedRan(int32_t id, int64_t cycle);

  // Everything that became ready since the last call, in execution order. With
  // `hold_device`, GPU tensors stay ready for a later call: the engine's GPU work is
  // still running, and what becomes ready meanwhile goes out fused once it finishes
  // (GPU collectives are queued in microseconds, so without this every one would go
  // alone).
  ResponseList TakeReady(bool hold_device = false);

  // Warns about tensors some ranks submitted and others did not; returns a non-empty
  // reason when the stall has lasted past the shutdown limit. `overdue` (if given)
  // receives the ranks that were missing from those stalls, in order.
  std::string CheckStalls(int64_t now_us, std::vector<int>* overdue = nullptr);

 private:
  struct Pending {
    std::vector<Request> requests;  // indexed by rank
    std::vector<char> have;
    std::vector<int64_t> arrival_us;
    int count = 0;
    int64_t first_us = 0;
    int64_t last_warn_us = 0;
    std::string doomed;  // a member of a group that failed: fail it as soon as it arrives
  };

  // Reports of one cache entry waiting in cycles, per rank.
  struct CachedWait {
    RequestType type;
    std::string name;
    std::vector<char> have;
    std::vector<int64_t> since_us, cycle;
    int64_t last_warn_us = 0;
  };

  // A ready tensor as TakeReady handles it.
  struct Item {
    std::string name;
    Pending p;
  };
  struct OpenAllreduce {
    int index;  // in Round::responses
    int64_t bytes;
  };
  struct OpenGather {
    int index;
    int64_t bytes;
  };
  // What one TakeReady builds up.
  struct Round {
    std::vector<int32_t> joined;  // ranks that have joined
    std::vector<Response> responses;
    std::vector<OpenAllreduce> open;
    std::vector<OpenGather> open_gathers;
    bool group_failed = false;
  };
  std::vector<Item> CollectReady(int64_t now, bool hold_device);
  int32_t ReadyDevice(const std::string& name) const;
  Response Negotiate(const Item& item, Round& round);
  void Fuse(Response resp, const Item& item, Round& round);
  void FailGroupsOfFailedMembers();
  ResponseList Order(Round round);

  bool IsReady(const std::string& name) const;
  void MarkReadyIfComplete(const std::string& name);
  bool Complete(const Pending& p) const;
  std::string Validate(const std::string& name, const Pending& p) const;
  Response MakeResponse(const std::string& name, const Pending& p, const std::string& error) const;
  void RecordNegotiation(const std::string& name, RequestType type, const std::vector<char>& have,
                         const std::vector<int64_t>& arrival_us, int64_t first_us, int64_t now_us);
  // Warns of `what` once per check interval, and sets `reason` past the shutdown limit;
  // returns whether it is past that limit.
  bool WarnOfStall(const std::string& what, int64_t waited_us, int64_t* last_warn_us, int64_t now_us,
                   std::string* reason) const;
  void ReportStall(RequestType type, const std::string& name, const std::vector<char>& have, int64_t first_us,
                   int64_t* last_warn_us, int64_t now_us, std::string* reason, std::vector<char>* overdue) const;

  int size_;
  const Config* config_;
  const Parameters& params_;  // config_->job()
  ResponseCache* cache_;
  Timeline* timeline_;
  std::unordered_map<std::string, Pending> table_;
  std::map<int32_t, CachedWait> cached_waits_;  // by cache id
  std::unordered_map<int32_t, int64_t> cached_ran_;  // cache id -> the last cycle it ran in
  std::vector<std::string> ready_;  // in the order they became ready
  // Grouped allreduce: ready members wait here until the whole group is ready.
  std::map<int32_t, std::vector<std::pair<std::string, Pending>>> groups_;
  // Groups with a failed member, as (rank, that rank's group id) -> the failure. Their
  // other members fail too, including ones that reach rank 0 only later.
  std::map<std::pair<int, int32_t>, std::string> failed_groups_;
  const std::string* FailedGroup(const Pending& p) const;
  void Doom(const std::string& name, Pending& p, const std::string& why);
  std::vector<char> joined_;
  int joined_count_ = 0;
  int last_joined_ = -1;
  bool join_complete_ = false;
};

}  // namespace hvdlite
