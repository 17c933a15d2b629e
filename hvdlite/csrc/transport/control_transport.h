// The control plane's transport, as the engine and the backends see it. The control
// plane moves small messages only: every rank other than 0 sends its requests to rank
// 0 (the coordinator) and receives rank 0's response lists; every rank takes part in
// the cache cycles' agreement (BitAgreement); and backends make a few collective setup
// calls (an NCCL unique id from rank 0, whether every rank could load a library).
//
// MPI is its one implementation today (transport/mpi/), on private duplicates of
// hvdlite's communicator, so neither the data plane nor a user's own MPI traffic ever
// crosses it. Negotiation code is written against these interfaces only, which is what
// lets the unit tests run it without MPI.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/common.h"

namespace hvdlite {

// The steady state's one small collective: every rank's vector of 64-bit words,
// combined with AND, delivered to every rank. Nonblocking and driven by polling.
//
// A round may also carry one small tensor, summed along the way (a *payload*): each
// rank says which with a key (0: none). Where two ranks' keys differ the sum is dropped
// and the key becomes 0 on every rank, so every rank ends with the same key: the
// tensor's sum over all ranks, or 0 and nothing. Every rank gets the same bits.
class BitAgreement {
 public:
  virtual ~BitAgreement() = default;
  virtual int words() const = 0;
  virtual bool Active() const = 0;
  // Starts combining `mine` (words() words) with every other rank's; with `key` != 0,
  // also summing `count` elements of `dtype` at `payload`. Both are copied before it
  // returns: the caller's memory is free again.
  virtual void Start(const uint64_t* mine, uint64_t key, const void* payload, int64_t count, DataType dtype) = 0;
  // Moves the round on without blocking; true once the result is in (then not Active).
  virtual bool Progress() = 0;
  virtual const uint64_t* Result() const = 0;  // words() words
  // After a round: the payload's key (0 if the ranks' keys differed) and, if not 0,
  // the sum.
  virtual uint64_t ResultKey() const = 0;
  virtual const void* ResultPayload() const = 0;
  // Abandons a round in progress (shutdown).
  virtual void Cancel() = 0;
  // After a peer failed: every call fails from now on, on every rank.
  virtual void Revoke() = 0;
};

class ControlTransport {
 public:
  using Bytes = std::shared_ptr<const std::vector<uint8_t>>;

  virtual ~ControlTransport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // A worker's message to the coordinator. Never blocks.
  virtual void SendToCoordinator(Bytes bytes) = 0;
  // The coordinator's message to every other rank. Never blocks.
  virtual void SendToWorkers(Bytes bytes) = 0;
  // Coordinator: the next message from any rank, if one has arrived.
  virtual bool ReceiveRequest(std::vector<uint8_t>* out, int* from) = 0;
  // Worker: the next message from the coordinator, if one has arrived.
  virtual bool ReceiveResponse(std::vector<uint8_t>* out) = 0;
  // Forgets sends that have left; with `wait_all`, first waits for every one.
  virtual void Reap(bool wait_all) = 0;

  // Collective setup calls (every rank, same order).
  // `bytes` from rank `root` to every rank.
  virtual void Share(void* bytes, int count, int root) = 0;
  // Every rank's `note` (empty: all is well), indexed by rank.
  virtual std::vector<std::string> GatherNotes(const std::string& note) = 0;

  // Collective: a channel for the cycles' agreement of `words` words per round,
  // carrying payloads of up to `max_payload_bytes`.
  virtual std::unique_ptr<BitAgreement> NewBitAgreement(int words, int64_t max_payload_bytes) = 0;

  // After a peer failed: every call fails from now on, on every rank.
  virtual void Revoke() = 0;

  virtual int64_t bytes_sent() const = 0;
  virtual int64_t bytes_received() const = 0;
};

}  // namespace hvdlite
