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
#pragma once

#include <mpi.h>

#include <cstdint>
#include <list>
#include <vector>

namespace hvdlite {

class BitAllreduce {
 public:
  // Collective over `base`, which it duplicates.
  BitAllreduce(MPI_Comm base, int words);
  ~BitAllreduce();
  BitAllreduce(const BitAllreduce&) = delete;
  BitAllreduce& operator=(const BitAllreduce&) = delete;

  int words() const { return words_; }
  bool Active() const { return active_; }
  // Starts combining `mine` (words() words) with every other rank's.
  void Start(const uint64_t* mine);
  // Moves the round on without blocking; true once the result is in (then not Active).
  bool Progress();
  const std::vector<uint64_t>& Result() const { return acc_; }
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

  MPI_Comm comm_ = MPI_COMM_NULL;
  int words_;
  std::vector<Step> plan_;
  size_t step_ = 0;
  bool step_started_ = false;
  bool active_ = false;
  std::vector<uint64_t> acc_, incoming_;
  MPI_Request recv_ = MPI_REQUEST_NULL;
  struct PendingSend {
    MPI_Request request;
    std::vector<uint64_t> data;
  };
  std::list<PendingSend> sends_;
};

}  // namespace hvdlite
