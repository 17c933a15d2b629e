#include "backends/mpi/adasum.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "backends/mpi/exchange.h"
#include "common/half.h"
#include "mpi/errors.h"

namespace hvdlite {
namespace {

// Element access in a wider type: float16 is stored as its bits.
template <typename T>
struct Elem {
  static double Load(T v) { return static_cast<double>(v); }
  static T Store(double v) { return static_cast<T>(v); }
};
template <>
struct Elem<uint16_t> {
  static double Load(uint16_t v) { return HalfToFloat(v); }
  static uint16_t Store(double v) { return FloatToHalf(static_cast<float>(v)); }
};

int Log2(int n) {
  int k = 0;
  while ((1 << k) < n) ++k;
  return k;
}

}  // namespace

AdasumAllreduce::AdasumAllreduce(MPI_Comm comm) : comm_(comm) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

AdasumAllreduce::~AdasumAllreduce() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  for (MPI_Comm& c : levels_) FreeCommunicator(&c);
}

MPI_Comm AdasumAllreduce::LevelComm(int level) {
  if (levels_.size() <= static_cast<size_t>(level)) levels_.resize(level + 1, MPI_COMM_NULL);
  if (levels_[level] == MPI_COMM_NULL) {
    CheckMpi(MPI_Comm_split(comm_, rank_ >> (level + 1), rank_, &levels_[level]), "MPI_Comm_split (Adasum)");
    MPI_Comm_set_errhandler(levels_[level], MPI_ERRORS_RETURN);
  }
  return levels_[level];
}

void AdasumAllreduce::Run(void* data, int64_t count, DataType dt) {
  if ((size_ & (size_ - 1)) != 0)
    throw std::invalid_argument("Adasum needs a power-of-2 number of ranks, not " + std::to_string(size_));
  if (size_ == 1 || count == 0) return;
  switch (dt) {
    case DataType::kFloat16: return RunTyped(static_cast<uint16_t*>(data), count);
    case DataType::kFloat32: return RunTyped(static_cast<float*>(data), count);
    case DataType::kFloat64: return RunTyped(static_cast<double*>(data), count);
    default: throw std::invalid_argument(std::string("Adasum takes float16, float32 or float64, not ") + DataTypeName(dt));
  }
}

template <typename T>
void AdasumAllreduce::RunTyped(T* data, int64_t count) {
  using E = Elem<T>;
  const int levels = Log2(size_);
  scratch_.resize(static_cast<size_t>((count / 2 + 1) * sizeof(T)));
  T* theirs = reinterpret_cast<T*>(scratch_.data());
  const MPI_Datatype bytes = MPI_BYTE;
  // The piece this rank holds at each level: [offset, offset + length).
  std::vector<int64_t> offsets(levels + 1), lengths(levels + 1);
  offsets[0] = 0;
  lengths[0] = count;
  for (int k = 0; k < levels; ++k) {
    const int partner = rank_ ^ (1 << k);
    const bool lower = (rank_ & (1 << k)) == 0;
    const int64_t first = lengths[k] / 2, second = lengths[k] - first;
    const int64_t keep_off = lower ? offsets[k] : offsets[k] + first;
    const int64_t keep_len = lower ? first : second;
    const int64_t give_off = lower ? offsets[k] + first : offsets[k];
    const int64_t give_len = lower ? second : first;
    Exchange(data + give_off, static_cast<int>(give_len * sizeof(T)), partner, theirs,
             static_cast<int>(keep_len * sizeof(T)), partner, bytes, 0, comm_, "MPI exchange (Adasum)");
    // a: the lower block's vector, b: the upper block's, as every rank of the level sees them.
    T* mine = data + keep_off;
    const T* a = lower ? mine : theirs;
    const T* b = lower ? theirs : mine;
    double dots[3] = {0, 0, 0};  // a.b, |a|^2, |b|^2 over this rank's part
    for (int64_t i = 0; i < keep_len; ++i) {
      const double x = E::Load(a[i]), y = E::Load(b[i]);
      dots[0] += x * y;
      dots[1] += x * x;
      dots[2] += y * y;
    }
    CheckMpi(MPI_Allreduce(MPI_IN_PLACE, dots, 3, MPI_DOUBLE, MPI_SUM, LevelComm(k)), "MPI_Allreduce (Adasum dots)");
    // A zero vector (a rank that joined, say) leaves the other as it is.
    const double ca = dots[1] > 0 ? 1.0 - dots[0] / (2.0 * dots[1]) : 1.0;
    const double cb = dots[2] > 0 ? 1.0 - dots[0] / (2.0 * dots[2]) : 1.0;
    for (int64_t i = 0; i < keep_len; ++i) mine[i] = E::Store(ca * E::Load(a[i]) + cb * E::Load(b[i]));
    offsets[k + 1] = keep_off;
    lengths[k + 1] = keep_len;
  }
  // Back up the levels: each rank sends its piece to its partner and receives the other
  // half of the piece they shared.
  for (int k = levels - 1; k >= 0; --k) {
    const int partner = rank_ ^ (1 << k);
    const bool lower = (rank_ & (1 << k)) == 0;
    const int64_t first = lengths[k] / 2, second = lengths[k] - first;
    const int64_t recv_off = lower ? offsets[k] + first : offsets[k];
    const int64_t recv_len = lower ? second : first;
    Exchange(data + offsets[k + 1], static_cast<int>(lengths[k + 1] * sizeof(T)), partner, data + recv_off,
             static_cast<int>(recv_len * sizeof(T)), partner, bytes, 1, comm_, "MPI exchange (Adasum)");
  }
}

}  // namespace hvdlite
