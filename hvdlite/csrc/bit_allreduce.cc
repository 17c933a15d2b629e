#include "bit_allreduce.h"

#include <cstring>

#include "backends/mpi/reduce_ops.h"

namespace hvdlite {
namespace {

constexpr int kTagFoldIn = 1;    // a rank beyond the power of two hands its vector down
constexpr int kTagResult = 2;    // ... and is sent the result at the end
constexpr int kTagExchange = 8;  // + the exchange's index

}  // namespace

BitAllreduce::BitAllreduce(MPI_Comm base, int words, int64_t max_payload_bytes)
    : words_(words),
      max_words_(words + 1 + static_cast<int>((max_payload_bytes + 7) / 8)),
      acc_(max_words_),
      incoming_(max_words_) {
  MPI_Comm_dup(base, &comm_);
  int rank = 0, size = 1;
  MPI_Comm_rank(comm_, &rank);
  MPI_Comm_size(comm_, &size);
  int pow2 = 1;
  while (pow2 * 2 <= size) pow2 *= 2;
  const int extra = size - pow2;
  if (rank >= pow2) {
    plan_.push_back(Step{rank - pow2, kTagFoldIn, rank - pow2, kTagResult, /*replace=*/true});
    return;
  }
  if (rank < extra) plan_.push_back(Step{-1, 0, rank + pow2, kTagFoldIn, false});
  for (int mask = 1, i = 0; mask < pow2; mask <<= 1, ++i)
    plan_.push_back(Step{rank ^ mask, kTagExchange + i, rank ^ mask, kTagExchange + i, false});
  if (rank < extra) plan_.push_back(Step{rank + pow2, kTagResult, -1, 0, false});
}

BitAllreduce::~BitAllreduce() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  Cancel();
  for (PendingSend& s : sends_) MPI_Request_free(&s.request);  // small: they leave on their own
  sends_.clear();
  if (comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void BitAllreduce::Start(const uint64_t* mine, uint64_t key, const void* payload, int64_t count, DataType dtype) {
  std::memcpy(acc_.data(), mine, static_cast<size_t>(words_) * 8);
  const int64_t bytes = key ? count * DataTypeSize(dtype) : 0;
  if (words_ + 1 + (bytes + 7) / 8 > max_words_) key = 0;  // too large to carry
  acc_[words_] = key;
  acc_words_ = words_ + 1;
  if (key) {
    std::memcpy(acc_.data() + acc_words_, payload, static_cast<size_t>(bytes));
    acc_words_ += static_cast<int>((bytes + 7) / 8);
  }
  count_ = count;
  dtype_ = dtype;
  step_ = 0;
  step_started_ = false;
  active_ = true;
}

bool BitAllreduce::Progress() {
  ReapSends();
  if (!active_) return false;
  while (step_ < plan_.size()) {
    const Step& s = plan_[step_];
    if (!step_started_) {
      if (s.send_to >= 0) {
        sends_.push_back(PendingSend{MPI_REQUEST_NULL, std::vector<uint64_t>(acc_.begin(), acc_.begin() + acc_words_)});
        PendingSend& p = sends_.back();
        MPI_Isend(p.data.data(), acc_words_, MPI_UINT64_T, s.send_to, s.send_tag, comm_, &p.request);
      }
      if (s.recv_from >= 0)
        MPI_Irecv(incoming_.data(), max_words_, MPI_UINT64_T, s.recv_from, s.recv_tag, comm_, &recv_);
      step_started_ = true;
    }
    if (s.recv_from >= 0) {
      int done = 0;
      MPI_Status status;
      MPI_Test(&recv_, &done, &status);
      if (!done) return false;
      int in_words = 0;
      MPI_Get_count(&status, MPI_UINT64_T, &in_words);
      Combine(in_words, s.replace);
    }
    ++step_;
    step_started_ = false;
  }
  active_ = false;
  return true;
}

void BitAllreduce::Combine(int in_words, bool replace) {
  if (replace) {
    acc_.swap(incoming_);
    acc_words_ = in_words;
    return;
  }
  for (int i = 0; i < words_; ++i) acc_[i] &= incoming_[i];
  const uint64_t key = acc_[words_];
  if (key != 0 && incoming_[words_] == key && in_words == acc_words_) {
    void* mine = acc_.data() + words_ + 1;
    ReduceScaled(mine, mine, incoming_.data() + words_ + 1, count_, dtype_, ReduceOp::kSum, 1.0);
  } else {
    acc_[words_] = 0;
    acc_words_ = words_ + 1;
  }
}

void BitAllreduce::Cancel() {
  if (recv_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&recv_);
    MPI_Wait(&recv_, MPI_STATUS_IGNORE);
  }
  active_ = false;
}

void BitAllreduce::ReapSends() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    int done = 0;
    MPI_Test(&it->request, &done, MPI_STATUS_IGNORE);
    it = done ? sends_.erase(it) : std::next(it);
  }
}

}  // namespace hvdlite
