#include "transport/mpi/bit_allreduce.h"

#include <algorithm>
#include <cstring>

#include "kernels/reduce.h"
#include "mpi/errors.h"

namespace hvdlite {
namespace {

constexpr int kTagFoldIn = 1;    // a rank beyond the power of two hands its vector down
constexpr int kTagResult = 2;    // ... and is sent the result at the end
constexpr int kTagExchange = 8;  // + the exchange's index
constexpr int kTagMorePieces = 1 << 12;  // a message's pieces after the first

// Whether every request is done; a request that failed throws (PeerFailure where a
// peer died). Each is tested alone, so that its own error code is seen.
bool TestAll(std::vector<MPI_Request>& requests) {
  bool all = true;
  for (MPI_Request& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    int done = 0;
    CheckMpi(MPI_Test(&r, &done, MPI_STATUS_IGNORE), "MPI_Test (cycle)");
    all = all && done;
  }
  return all;
}

}  // namespace

BitAllreduce::BitAllreduce(MPI_Comm base, int words, int64_t max_payload_bytes, int piece_words)
    : words_(words),
      piece_words_(std::max(piece_words, words + 2)),
      max_words_(words + 2 + static_cast<int>((max_payload_bytes + 7) / 8)),
      acc_(max_words_),
      incoming_(max_words_) {
  piece_words_ = std::min(piece_words_, max_words_);
  CheckMpi(MPI_Comm_dup(base, &comm_), "MPI_Comm_dup (cycles)");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
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
  for (PendingSend& s : sends_)
    for (MPI_Request& r : s.requests)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);  // small: they leave on their own
  sends_.clear();
  FreeCommunicator(&comm_);
}

void BitAllreduce::Start(const uint64_t* mine, uint64_t key, const void* payload, int64_t count, DataType dtype) {
  std::memcpy(acc_.data(), mine, static_cast<size_t>(words_) * 8);
  const int64_t bytes = key ? count * DataTypeSize(dtype) : 0;
  if (words_ + 2 + (bytes + 7) / 8 > max_words_) key = 0;  // too large to carry
  acc_[words_] = key;
  acc_words_ = words_ + 2;
  if (key) {
    std::memcpy(acc_.data() + acc_words_, payload, static_cast<size_t>(bytes));
    acc_words_ += static_cast<int>((bytes + 7) / 8);
  }
  acc_[words_ + 1] = static_cast<uint64_t>(acc_words_);
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
      if (s.send_to >= 0) Send(s.send_to, s.send_tag);
      if (s.recv_from >= 0)
        CheckMpi(MPI_Irecv(incoming_.data(), piece_words_, MPI_UINT64_T, s.recv_from, s.recv_tag, comm_, &recv_),
                 "MPI_Irecv (cycle)");
      more_.clear();
      step_started_ = true;
    }
    if (s.recv_from >= 0) {
      int done = 0;
      if (more_.empty()) {
        MPI_Status status;
        CheckMpi(MPI_Test(&recv_, &done, &status), "MPI_Test (cycle)");
        if (!done) return false;
        int first = 0;
        MPI_Get_count(&status, MPI_UINT64_T, &first);
        in_words_ = first > words_ + 1 ? static_cast<int>(incoming_[words_ + 1]) : first;
        if (in_words_ < first || in_words_ > max_words_) in_words_ = first;  // not ours: ignore the rest
        for (int at = piece_words_; at < in_words_; at += piece_words_) {
          more_.push_back(MPI_REQUEST_NULL);
          CheckMpi(MPI_Irecv(incoming_.data() + at, std::min(piece_words_, in_words_ - at), MPI_UINT64_T, s.recv_from,
                             s.recv_tag + kTagMorePieces, comm_, &more_.back()),
                   "MPI_Irecv (cycle)");
        }
        if (more_.empty()) more_.push_back(MPI_REQUEST_NULL);  // nothing more: done at once
      }
      if (!TestAll(more_)) return false;
      Combine(in_words_, s.replace);
    }
    ++step_;
    step_started_ = false;
  }
  active_ = false;
  return true;
}

void BitAllreduce::Send(int to, int tag) {
  std::vector<uint64_t> data;
  if (!spare_.empty()) {
    data.swap(spare_.back());
    spare_.pop_back();
  }
  data.assign(acc_.begin(), acc_.begin() + acc_words_);
  sends_.push_back(PendingSend{{}, std::move(data)});
  PendingSend& p = sends_.back();
  p.requests.resize(static_cast<size_t>((acc_words_ + piece_words_ - 1) / piece_words_));
  for (int i = 0, at = 0; at < acc_words_; ++i, at += piece_words_)
    CheckMpi(MPI_Isend(p.data.data() + at, std::min(piece_words_, acc_words_ - at), MPI_UINT64_T, to,
                       i == 0 ? tag : tag + kTagMorePieces, comm_, &p.requests[static_cast<size_t>(i)]),
             "MPI_Isend (cycle)");
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
    void* mine = acc_.data() + words_ + 2;
    ReduceScaled(mine, mine, incoming_.data() + words_ + 2, count_, dtype_, ReduceOp::kSum, 1.0);
  } else {
    acc_[words_] = 0;
    acc_words_ = words_ + 2;
    acc_[words_ + 1] = static_cast<uint64_t>(acc_words_);
  }
}

void BitAllreduce::Revoke() { hvdlite::Revoke(comm_); }

void BitAllreduce::Cancel() {
  if (recv_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&recv_);
    MPI_Wait(&recv_, MPI_STATUS_IGNORE);
  }
  for (MPI_Request& r : more_) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Wait(&r, MPI_STATUS_IGNORE);
  }
  more_.clear();
  active_ = false;
}

void BitAllreduce::ReapSends() {
  for (auto it = sends_.begin(); it != sends_.end();) {
    if (!TestAll(it->requests)) {
      ++it;
      continue;
    }
    if (spare_.size() < 4) spare_.push_back(std::move(it->data));
    it = sends_.erase(it);
  }
}

}  // namespace hvdlite
