// The steady state's one small collective: every rank's vector of 64-bit words,
// combined with AND, delivered to every rank. It runs over MPI point-to-point on a
// communicator of its own, by recursive doubling: log2(P) exchanges between pairs of
// ranks; ranks beyond the largest power of two first hand their vector to a partner
// below it and are sent the result at the end.
//
// It is nonblocking and driven by polling: Start() posts the first exchange and
// Progress() moves on as messages arrive, so the engine keeps serving everything else
// meanwhile. Unlike MPI_Iallreduce, a round that a peer never joins can be cancelled
// at shutdown (its receive is cancelled; the eager sends need nothing). With two ranks
// it is one exchange: half the latency of a round trip to a coordinator.
//
// A round may also carry one small tensor, summed along the way (a *payload*): each
// rank says which with a key (0: none). Where two partial results carry different keys
// the sum is dropped and the key becomes 0, which then spreads to every rank, so every
// rank ends with the same key: the tensor's sum over all ranks, or 0 and nothing. Sums
// are taken pairwise in the same tree on every rank, so the bits agree everywhere.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <list>
#include <vector>

#include "common.h"

namespace hvdlite {

class BitAllreduce {
 public:
  // Collective over `base`, which it duplicates. `max_payload_bytes`: the largest
  // payload a round may carry. Messages go in pieces of at most `piece_words` (and at
  // least the bit vector and its two header words).
  BitAllreduce(MPI_Comm base, int words, int64_t max_payload_bytes = 0, int piece_words = 1 << 20);
  ~BitAllreduce();
  BitAllreduce(const BitAllreduce&) = delete;
  BitAllreduce& operator=(const BitAllreduce&) = delete;

  int words() const { return words_; }
  void Revoke();  // after a peer failed: every call on its communicator fails everywhere
  bool Active() const { return active_; }
  // Starts combining `mine` (words() words) with every other rank's; with `key` != 0,
  // also summing `count` elements of `dtype` (at most max_payload_bytes) at `payload`.
  void Start(const uint64_t* mine, uint64_t key = 0, const void* payload = nullptr, int64_t count = 0,
             DataType dtype = DataType::kFloat32);
  // Moves the round on without blocking; true once the result is in (then not Active).
  bool Progress();
  const uint64_t* Result() const { return acc_.data(); }  // words() words
  // After a round: the payload's key (the same on every rank; 0 if the ranks' keys
  // differed) and, if not 0, the sum.
  uint64_t ResultKey() const { return acc_[words_]; }
  const void* ResultPayload() const { return acc_.data() + words_ + 2; }
  // Abandons a round in progress (shutdown). Afterwards the object only reaps sends.
  void Cancel();

 private:
  // One step of the schedule: send the running result to one rank and/or receive one
  // rank's, which is ANDed in (or, for a rank handed the final result, replaces it).
  struct Step {
    int send_to = -1, send_tag = 0;
    int recv_from = -1, recv_tag = 0;
    bool replace = false;
  };
  void ReapSends();

  // Combines a received partial result (`in_words` words) into acc_.
  void Combine(int in_words, bool replace);
  // Sends acc_ (in pieces) to rank `to`.
  void Send(int to, int tag);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int words_;
  int piece_words_;
  // A message: the words, the payload's key, the message's length in words, the payload.
  int max_words_;  // words + 2 + the largest payload
  int acc_words_ = 0;  // what acc_ holds now (and what a send carries)
  int64_t count_ = 0;
  DataType dtype_ = DataType::kFloat32;
  std::vector<Step> plan_;
  size_t step_ = 0;
  bool step_started_ = false;
  bool active_ = false;
  std::vector<uint64_t> acc_, incoming_;
  MPI_Request recv_ = MPI_REQUEST_NULL;  // a message's first piece
  std::vector<MPI_Request> more_;        // its other pieces, once the first told how many
  int in_words_ = 0;
  struct PendingSend {
    std::vector<MPI_Request> requests;
    std::vector<uint64_t> data;
  };
  std::list<PendingSend> sends_;
  std::vector<std::vector<uint64_t>> spare_;  // buffers of completed sends, for reuse
};

}  // namespace hvdlite
