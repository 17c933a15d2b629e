// The cycles' agreement (BitAgreement, control_transport.h) over MPI point-to-point, on
// a communicator of its own, by recursive doubling: log2(P) exchanges between pairs of
// ranks; ranks beyond the largest power of two first hand their vector to a partner
// below it and are sent the result at the end.
//
// It is nonblocking and driven by polling: Start() posts the first exchange and
// Progress() moves on as messages arrive, so the engine keeps serving everything else
// meanwhile. Unlike MPI_Iallreduce, a round that a peer never joins can be cancelled
// at shutdown (its receive is cancelled; the eager sends need nothing). With two ranks
// it is one exchange: half the latency of a round trip to a coordinator.
//
// A payload's key: where two partial results carry different keys the sum is dropped
// and the key becomes 0, which then spreads to every rank. Sums are taken pairwise in
// the same tree on every rank, so the bits agree everywhere.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <list>
#include <vector>

#include "common/common.h"
#include "transport/control_transport.h"

namespace hvdlite {

class BitAllreduce : public BitAgreement {
 public:
  // Collective over `base`, which it duplicates. `max_payload_bytes`: the largest
  // payload a round may carry. Messages go in pieces of at most `piece_words` (and at
  // least the bit vector and its two header words).
  BitAllreduce(MPI_Comm base, int words, int64_t max_payload_bytes = 0, int piece_words = 1 << 20);
  ~BitAllreduce() override;
  BitAllreduce(const BitAllreduce&) = delete;
  BitAllreduce& operator=(const BitAllreduce&) = delete;

  int words() const override { return words_; }
  void Revoke() override;
  bool Active() const override { return active_; }
  // The payload: at most max_payload_bytes.
  void Start(const uint64_t* mine, uint64_t key, const void* payload, int64_t count, DataType dtype) override;
  bool Progress() override;
  const uint64_t* Result() const override { return acc_.data(); }
  uint64_t ResultKey() const override { return acc_[words_]; }
  const void* ResultPayload() const override { return acc_.data() + words_ + 2; }
  // Afterwards the object only reaps sends.
  void Cancel() override;

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
