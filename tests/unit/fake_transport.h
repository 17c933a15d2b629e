// An in-process ControlTransport for N simulated ranks, for unit tests of negotiation
// code (transport/control_transport.h is the contract it follows). One FakeWorld holds
// a transport per rank; the test plays every rank in turn on one thread.
//
// BitAgreement: the k-th NewBitAgreement call of each rank joins the k-th channel of the
// world (every rank must ask for the same words and payload size). A round completes
// once every rank has Started it: the result is the AND of every rank's words; the
// payload is summed where every rank gave the same non-zero key, the same count and
// data type and the payload fits, otherwise the key is 0 on every rank (as the MPI
// implementation, transport/mpi/bit_allreduce.h, drops it).
//
// Messages: SendToCoordinator / SendToWorkers queue bytes that ReceiveRequest /
// ReceiveResponse hand out in order. The collective setup calls (Share, GatherNotes)
// would need the ranks to run at once; the fake throws std::logic_error for them.
#pragma once

#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "common/common.h"
#include "transport/control_transport.h"

namespace unit {

class FakeWorld;

// The state one agreement channel shares between the simulated ranks.
struct FakeChannel {
  int size = 0;
  int words = 0;
  int64_t max_payload_bytes = 0;
  struct Contribution {
    std::vector<uint64_t> words;
    uint64_t key = 0;
    std::vector<uint8_t> payload;
    int64_t count = 0;
    hvdlite::DataType dtype = hvdlite::DataType::kFloat32;
  };
  struct Round {
    std::map<int, Contribution> by_rank;
    std::vector<uint64_t> result;
    uint64_t key = 0;
    std::vector<uint8_t> payload;
  };
  std::map<int64_t, Round> rounds;  // by round number, from 0
  bool revoked = false;

  void Combine(Round& r) const {
    r.result.assign(words, ~uint64_t{0});
    for (const auto& [rank, c] : r.by_rank)
      for (int w = 0; w < words; ++w) r.result[w] &= c.words[w];
    const Contribution& first = r.by_rank.begin()->second;
    bool same = first.key != 0;
    for (const auto& [rank, c] : r.by_rank)
      same = same && c.key == first.key && c.count == first.count && c.dtype == first.dtype;
    if (same && first.count * hvdlite::DataTypeSize(first.dtype) > max_payload_bytes) same = false;
    r.key = same ? first.key : 0;
    r.payload.clear();
    if (!same) return;
    r.payload.assign(first.payload.size(), 0);
    for (const auto& [rank, c] : r.by_rank) Add(r.payload.data(), c.payload.data(), c.count, c.dtype);
  }

  // acc += in, element-wise in `dt` (the data types a carried tensor takes in the tests).
  static void Add(uint8_t* acc, const uint8_t* in, int64_t n, hvdlite::DataType dt) {
    switch (dt) {
      case hvdlite::DataType::kFloat32: return AddT<float>(acc, in, n);
      case hvdlite::DataType::kFloat64: return AddT<double>(acc, in, n);
      case hvdlite::DataType::kInt32: return AddT<int32_t>(acc, in, n);
      case hvdlite::DataType::kInt64: return AddT<int64_t>(acc, in, n);
      default:
        throw std::logic_error(std::string("FakeChannel: no sum of ") + hvdlite::DataTypeName(dt));
    }
  }
  template <typename T>
  static void AddT(uint8_t* acc, const uint8_t* in, int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      T a, b;
      std::memcpy(&a, acc + i * sizeof(T), sizeof(T));
      std::memcpy(&b, in + i * sizeof(T), sizeof(T));
      a = static_cast<T>(a + b);
      std::memcpy(acc + i * sizeof(T), &a, sizeof(T));
    }
  }
};

class FakeBitAgreement : public hvdlite::BitAgreement {
 public:
  FakeBitAgreement(std::shared_ptr<FakeChannel> channel, int rank) : ch_(std::move(channel)), rank_(rank) {}

  int words() const override { return ch_->words; }
  bool Active() const override { return active_; }

  void Start(const uint64_t* mine, uint64_t key, const void* payload, int64_t count,
             hvdlite::DataType dtype) override {
    CheckUsable();
    if (active_) throw std::logic_error("FakeBitAgreement: Start while a round is in flight");
    FakeChannel::Contribution c;
    c.words.assign(mine, mine + ch_->words);
    c.key = key;
    c.count = key ? count : 0;
    c.dtype = dtype;
    if (key) {
      const auto* p = static_cast<const uint8_t*>(payload);
      c.payload.assign(p, p + count * hvdlite::DataTypeSize(dtype));
    }
    FakeChannel::Round& r = ch_->rounds[round_];
    r.by_rank[rank_] = std::move(c);
    if (static_cast<int>(r.by_rank.size()) == ch_->size) ch_->Combine(r);
    active_ = true;
  }

  bool Progress() override {
    CheckUsable();
    if (!active_) return false;
    FakeChannel::Round& r = ch_->rounds[round_];
    if (static_cast<int>(r.by_rank.size()) < ch_->size) return false;
    result_ = r.result;
    key_ = r.key;
    payload_ = r.payload;
    ++round_;
    active_ = false;
    return true;
  }

  const uint64_t* Result() const override { return result_.data(); }
  uint64_t ResultKey() const override { return key_; }
  const void* ResultPayload() const override { return key_ ? payload_.data() : nullptr; }
  void Cancel() override { active_ = false; }
  void Revoke() override { ch_->revoked = true; }

  int64_t rounds_completed() const { return round_; }

 private:
  void CheckUsable() const {
    if (ch_->revoked) throw std::runtime_error("FakeBitAgreement: revoked");
  }

  std::shared_ptr<FakeChannel> ch_;
  int rank_;
  int64_t round_ = 0;
  bool active_ = false;
  std::vector<uint64_t> result_;
  uint64_t key_ = 0;
  std::vector<uint8_t> payload_;
};

class FakeTransport : public hvdlite::ControlTransport {
 public:
  FakeTransport(FakeWorld* world, int rank) : world_(world), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override;
  void SendToCoordinator(Bytes bytes) override;
  void SendToWorkers(Bytes bytes) override;
  bool ReceiveRequest(std::vector<uint8_t>* out, int* from) override {
    CheckUsable();
    if (requests_.empty()) return false;
    *from = requests_.front().first;
    *out = *requests_.front().second;
    requests_.pop_front();
    return true;
  }
  bool ReceiveResponse(std::vector<uint8_t>* out) override {
    CheckUsable();
    if (responses_.empty()) return false;
    *out = *responses_.front();
    responses_.pop_front();
    return true;
  }
  void Reap(bool) override {}
  void Share(void*, int, int) override {
    throw std::logic_error("FakeTransport: Share needs the ranks to run at once");
  }
  std::vector<std::string> GatherNotes(const std::string&) override {
    throw std::logic_error("FakeTransport: GatherNotes needs the ranks to run at once");
  }
  std::unique_ptr<hvdlite::BitAgreement> NewBitAgreement(int words, int64_t max_payload_bytes) override;
  void Revoke() override { revoked_ = true; }
  int64_t bytes_sent() const override { return sent_; }
  int64_t bytes_received() const override { return received_; }

 private:
  friend class FakeWorld;
  void CheckUsable() const {
    if (revoked_) throw std::runtime_error("FakeTransport: revoked");
  }
  FakeWorld* world_;
  int rank_;
  int channels_ = 0;  // NewBitAgreement calls so far
  bool revoked_ = false;
  int64_t sent_ = 0, received_ = 0;
  std::deque<std::pair<int, Bytes>> requests_;  // rank 0: (from, message)
  std::deque<Bytes> responses_;                 // others: rank 0's messages
};

class FakeWorld {
 public:
  explicit FakeWorld(int size) {
    for (int r = 0; r < size; ++r) ranks_.push_back(std::make_unique<FakeTransport>(this, r));
  }
  int size() const { return static_cast<int>(ranks_.size()); }
  FakeTransport* rank(int r) { return ranks_.at(r).get(); }

  std::shared_ptr<FakeChannel> Channel(int index, int words, int64_t max_payload_bytes) {
    if (index == static_cast<int>(channels_.size())) {
      auto ch = std::make_shared<FakeChannel>();
      ch->size = size();
      ch->words = words;
      ch->max_payload_bytes = max_payload_bytes;
      channels_.push_back(ch);
    }
    const auto& ch = channels_.at(index);
    if (ch->words != words || ch->max_payload_bytes != max_payload_bytes)
      throw std::logic_error("FakeWorld: ranks asked for different agreement channels (" +
                             std::to_string(ch->words) + " vs " + std::to_string(words) + " words)");
    return ch;
  }

 private:
  friend class FakeTransport;
  std::vector<std::unique_ptr<FakeTransport>> ranks_;
  std::vector<std::shared_ptr<FakeChannel>> channels_;
};

inline int FakeTransport::size() const { return world_->size(); }

inline void FakeTransport::SendToCoordinator(Bytes bytes) {
  CheckUsable();
  if (rank_ == 0) throw std::logic_error("FakeTransport: rank 0 sends to itself");
  sent_ += static_cast<int64_t>(bytes->size());
  FakeTransport* coordinator = world_->rank(0);
  coordinator->received_ += static_cast<int64_t>(bytes->size());
  coordinator->requests_.emplace_back(rank_, std::move(bytes));
}

inline void FakeTransport::SendToWorkers(Bytes bytes) {
  CheckUsable();
  if (rank_ != 0) throw std::logic_error("FakeTransport: only rank 0 sends to the workers");
  for (int r = 1; r < world_->size(); ++r) {
    sent_ += static_cast<int64_t>(bytes->size());
    world_->rank(r)->received_ += static_cast<int64_t>(bytes->size());
    world_->rank(r)->responses_.push_back(bytes);
  }
}

inline std::unique_ptr<hvdlite::BitAgreement> FakeTransport::NewBitAgreement(int words, int64_t max_payload_bytes) {
  return std::make_unique<FakeBitAgreement>(world_->Channel(channels_++, words, max_payload_bytes), rank_);
}

}  // namespace unit
