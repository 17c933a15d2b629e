// A fake NCCL (libnccl.so) over POSIX shared memory, for exercising GPU code paths on a
// CPU-only machine.
//
// Ranks of a communicator (threads or processes on one host) share one shm segment:
//   header | doorbells[nranks] | channel heads/tails[nranks*nranks] | slots[nranks] | rings
// Collectives go chunk by chunk through the per-rank slots, between cross-process
// barriers; every rank reduces all ranks' data itself, in rank order, so all get the same
// bits. ncclSend/ncclRecv go through a byte ring per ordered pair of ranks, each message
// preceded by its size. Waits block on futexes (10 ms timeouts to re-check abort flags and,
// after a second, whether the peers' processes are alive). Operations run on the worker
// thread of the fake CUDA runtime's stream, queued with cudaLaunchHostFunc.
// Names, signatures and enum values are those of NCCL 2.2x. See README.md.
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fake_common.h"

// ---- ABI (nccl.h of NCCL 2.2x) ---------------------------------------------------------------
typedef int ncclResult_t;
typedef int ncclDataType_t;
typedef int ncclRedOp_t;
typedef int ncclScalarResidence_t;
struct ncclComm;
typedef ncclComm* ncclComm_t;
#define NCCL_UNIQUE_ID_BYTES 128
typedef struct {
  char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

namespace {

constexpr ncclResult_t ncclSuccess = 0;
constexpr ncclResult_t ncclUnhandledCudaError = 1;
constexpr ncclResult_t ncclSystemError = 2;
constexpr ncclResult_t ncclInternalError = 3;
constexpr ncclResult_t ncclInvalidArgument = 4;
constexpr ncclResult_t ncclInvalidUsage = 5;
constexpr ncclResult_t ncclRemoteError = 6;
constexpr ncclResult_t ncclInProgress = 7;

enum DataType : int {
  ncclInt8 = 0, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
  ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclNumTypes
};
enum RedOp : int { ncclSum = 0, ncclProd, ncclMax, ncclMin, ncclAvg, ncclNumOps };
constexpr int kPreMulSum = ncclNumOps;  // internal tag for ops made by ncclRedOpCreatePreMulSum
constexpr int ncclScalarDevice = 0;
constexpr int ncclScalarHostImmediate = 1;

constexpr int kVersion = 22303;  // 2.23.3

// ---- Configuration ---------------------------------------------------------------------------
constexpr uint64_t kIdMagic = 0x314c43434e464448ULL;  // "HDFNCCL1" in the first 8 bytes of the id
constexpr uint32_t kShmReady = 0x52454459;           // header fully initialized
constexpr int kMaxRanks = 256;
constexpr auto kPollInterval = std::chrono::milliseconds(10);
constexpr auto kPeerCheckAfter = std::chrono::seconds(1);

using Clock = std::chrono::steady_clock;

size_t elem_size(int dtype) {
  static const size_t sizes[ncclNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  return sizes[dtype];
}

// ---- Process-wide state ---------------------------------------------------------------------

struct Comm;

struct FailSpec {
  std::string call;
  int rank = -1;  // -1: any rank ("*")
  long nth = 0;
};

struct Library {
  fake_common::AppendLog log{"HVDLITE_FAKE_NCCL_LOG"};
  double init_timeout_s = fake_common::env_double("HVDLITE_FAKE_NCCL_INIT_TIMEOUT_S", 60.0);
  bool dead_peer_hang = fake_common::env_string("HVDLITE_FAKE_NCCL_DEAD_PEER") == "hang";
  // HVDLITE_FAKE_NCCL_ASYNC_MODE=stall: an ASYNC_FAIL operation neither finishes nor
  // reports an error; it waits until its communicator is aborted (a peer that stopped).
  bool async_stall = fake_common::env_string("HVDLITE_FAKE_NCCL_ASYNC_MODE") == "stall";
  size_t slot_bytes = static_cast<size_t>(
      std::max(4096L, fake_common::env_long("HVDLITE_FAKE_NCCL_SLOT_BYTES", 1L << 20)));
  std::vector<FailSpec> fail_specs;
  std::vector<FailSpec> async_fail_specs;
  std::atomic<bool> shutdown{false};

  std::mutex mu;  // guards the maps below
  std::unordered_map<const void*, std::shared_ptr<Comm>> live;
  // Destroyed and aborted communicators stay here forever (small): their addresses are
  // never reused, so a stale handle is recognized, and queued work can still reach them.
  std::unordered_map<const void*, std::shared_ptr<Comm>> retired;
  std::map<std::pair<std::string, int>, long> call_counts;  // for error injection
};

std::vector<FailSpec> parse_fail_specs(const char* env_var) {
  std::vector<FailSpec> specs;
  std::string all = fake_common::env_string(env_var);
  size_t pos = 0;
  while (pos < all.size()) {
    size_t end = all.find(',', pos);
    if (end == std::string::npos) end = all.size();
    std::string item = all.substr(pos, end - pos);
    pos = end + 1;
    size_t a = item.find(':');
    size_t b = a == std::string::npos ? a : item.find(':', a + 1);
    if (b == std::string::npos) continue;
    FailSpec spec;
    spec.call = item.substr(0, a);
    std::string rank = item.substr(a + 1, b - a - 1);
    spec.rank = rank == "*" ? -1 : std::atoi(rank.c_str());
    spec.nth = std::atol(item.c_str() + b + 1);
    if (!spec.call.empty() && spec.nth > 0) specs.push_back(spec);
  }
  return specs;
}

Library& lib() {
  static Library* l = [] {
    auto* p = new Library();
    p->fail_specs = parse_fail_specs("HVDLITE_FAKE_NCCL_FAIL");
    p->async_fail_specs = parse_fail_specs("HVDLITE_FAKE_NCCL_ASYNC_FAIL");
    return p;
  }();
  return *l;
}

// At process exit, make every wait give up so the runtime's workers can be joined. This
// library is finalized before the fake libcudart it depends on.
struct Finalizer {
  ~Finalizer() { lib().shutdown.store(true); }
};
Finalizer g_finalizer;

thread_local std::string t_last_error;

ncclResult_t fail(ncclResult_t code, const std::string& text) {
  t_last_error = text;
  return code;
}

// ---- Shared memory layout -----------------------------------------------------------------------

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex words must be plain words");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "ring counters must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t), "futex word size");

struct ShmHeader {
  std::atomic<uint32_t> ready;  // kShmReady once the creator initialized the rest
  int32_t nranks;
  uint64_t total_bytes, slot_bytes, ring_bytes;
  uint64_t off_doorbells, off_rings_ctrl, off_slots, off_rings;
  std::atomic<uint32_t> attached;     // futex word: ranks that joined
  std::atomic<uint32_t> init_failed;  // a rank gave up waiting for the others
  std::atomic<uint32_t> broken;       // nonzero: the communicator failed for everyone
  std::atomic<int32_t> broken_code;   // what ranks report then (ncclResult_t)
  std::atomic<int32_t> broken_rank;   // who broke it
  alignas(64) std::atomic<uint32_t> bar_count;
  alignas(64) std::atomic<uint32_t> bar_gen;  // futex word
  alignas(64) std::atomic<int32_t> pids[kMaxRanks];
};

struct alignas(64) Doorbell {
  std::atomic<uint32_t> word;  // bumped whenever this rank's rings change
};

struct RingCtrl {
  alignas(64) std::atomic<uint64_t> head;  // bytes written by the sender
  alignas(64) std::atomic<uint64_t> tail;  // bytes consumed by the receiver
};

uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1000000000), static_cast<long>(timeout.count() % 1000000000)};
  // Shared (not FUTEX_PRIVATE_FLAG): the word lives in memory mapped by several processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void futex_wake_all(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

// A file descriptor that closes itself.
class Fd {
 public:
  explicit Fd(int fd = -1) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  void reset(int fd) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_;
};

// ---- Communicators -------------------------------------------------------------------------------

struct PreMulSumOp {
  int dtype = 0;
  int residence = ncclScalarHostImmediate;
  uint64_t value = 0;             // the scalar's bytes (HostImmediate)
  const void* pointer = nullptr;  // read when the operation runs (Device)
};

// A reduction as a queued operation sees it.
struct Reduction {
  int op = ncclSum;  // ncclSum..ncclAvg, or kPreMulSum
  PreMulSumOp scalar;
};

struct Comm {
  int rank = 0;
  int nranks = 0;
  int device = 0;

  // The mapping; released once the communicator is destroyed or aborted and idle.
  char* base = nullptr;
  size_t map_bytes = 0;
  ShmHeader* hdr = nullptr;

  std::mutex mu;  // guards everything below
  std::condition_variable cv;
  bool mapped = false;
  bool destroyed = false;
  uint64_t next_ticket = 0;  // issue order of queued operations
  uint64_t exec_ticket = 0;  // the operation allowed to run next
  uint64_t outstanding = 0;  // queued or running operations
  ncclResult_t async_error = ncclSuccess;
  std::string async_text;  // set once, with async_error
  std::map<int, PreMulSumOp> redops;
  int next_redop = ncclNumOps;

  std::atomic<bool> aborted{false};

  Doorbell& doorbell(int r) { return reinterpret_cast<Doorbell*>(base + hdr->off_doorbells)[r]; }
  RingCtrl& ring_ctrl(int from, int to) {
    return reinterpret_cast<RingCtrl*>(base + hdr->off_rings_ctrl)[from * nranks + to];
  }
  char* ring(int from, int to) { return base + hdr->off_rings + (from * nranks + to) * hdr->ring_bytes; }
  char* slot(int r) { return base + hdr->off_slots + r * hdr->slot_bytes; }

  // First error wins. Caller holds `mu`.
  void set_async_error_locked(ncclResult_t code, const std::string& text) {
    if (async_error != ncclSuccess) return;
    async_error = code;
    async_text = text;
  }
  void set_async_error(ncclResult_t code, const std::string& text) {
    std::lock_guard<std::mutex> lock(mu);
    set_async_error_locked(code, text);
  }

  // Caller holds `mu`; only when no operation runs.
  void unmap_locked() {
    if (!mapped) return;
    ::munmap(base, map_bytes);
    mapped = false;
    base = nullptr;
    hdr = nullptr;
  }
};

// Marks the communicator failed for all ranks (first reason wins) and wakes the waiters.
void break_shared(Comm& c, ncclResult_t code) {
  ShmHeader* h = c.hdr;
  int32_t none = 0;
  if (h->broken_code.compare_exchange_strong(none, code)) h->broken_rank.store(c.rank);
  h->broken.store(1);
  futex_wake_all(&h->bar_gen);
  for (int r = 0; r < c.nranks; ++r) futex_wake_all(&c.doorbell(r).word);
}

// Whether a process is gone: no such pid, or a zombie its parent has not reaped yet.
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  Fd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) return false;
  char buf[512];
  ssize_t n = ::read(fd.get(), buf, sizeof(buf) - 1);
  if (n <= 0) return false;
  buf[n] = '\0';
  const char* paren = std::strrchr(buf, ')');  // "pid (comm) STATE ..."; comm may hold spaces
  return paren != nullptr && paren[1] == ' ' && (paren[2] == 'Z' || paren[2] == 'X');
}

// The first rank whose process is gone, or -1.
int find_dead_peer(Comm& c) {
  pid_t self = ::getpid();
  for (int r = 0; r < c.nranks; ++r) {
    pid_t pid = c.hdr->pids[r].load();
    if (pid > 0 && pid != self && process_gone(pid)) return r;
  }
  return -1;
}

std::string text_printf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string text_printf(const char* fmt, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

// Blocks until `word` no longer holds `expected`. Fails when the communicator is aborted
// here, broken by another rank, or (after a second, unless HVDLITE_FAKE_NCCL_DEAD_PEER=hang)
// a peer's process is gone; sets the async error accordingly.
ncclResult_t wait_change(Comm& c, std::atomic<uint32_t>& word, uint32_t expected) {
  Library& l = lib();
  auto next_check = Clock::now() + kPeerCheckAfter;
  for (;;) {
    if (word.load() != expected) return ncclSuccess;
    if (c.aborted.load() || l.shutdown.load()) return ncclInvalidUsage;  // error set by the abort
    if (c.hdr->broken.load()) {
      ncclResult_t code = c.hdr->broken_code.load();
      c.set_async_error(code, text_printf("communicator failed on rank %d (%s)", c.hdr->broken_rank.load(),
                                          code == ncclRemoteError ? "aborted or dead peer" : "invalid usage"));
      return code;
    }
    if (!l.dead_peer_hang && Clock::now() >= next_check) {
      int dead = find_dead_peer(c);
      if (dead >= 0) {
        c.set_async_error(ncclRemoteError, text_printf("peer rank %d (pid %d) exited", dead,
                                                       static_cast<int>(c.hdr->pids[dead].load())));
        break_shared(c, ncclRemoteError);
        return ncclRemoteError;
      }
      next_check = Clock::now() + kPeerCheckAfter;
    }
    futex_wait(&word, expected, kPollInterval);
  }
}

// A sense-reversing barrier of all ranks in shared memory.
ncclResult_t barrier(Comm& c) {
  ShmHeader* h = c.hdr;
  uint32_t gen = h->bar_gen.load();
  if (h->bar_count.fetch_add(1) + 1 == static_cast<uint32_t>(c.nranks)) {
    h->bar_count.store(0);
    h->bar_gen.fetch_add(1);
    futex_wake_all(&h->bar_gen);
    return ncclSuccess;
  }
  return wait_change(c, h->bar_gen, gen);
}

// ---- Reductions ------------------------------------------------------------------------------------

float half_to_float(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    float v = std::ldexp(static_cast<float>(man), -24);  // zero or subnormal, exact
    return sign ? -v : v;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest, ties to even.
uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t a = x & 0x7fffffff;
  if (a >= 0x7f800000) return static_cast<uint16_t>(sign | 0x7c00 | (a > 0x7f800000 ? 0x200 | ((a >> 13) & 0x3ff) : 0));
  if (a >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // >= 65520: overflows to inf
  uint32_t r;
  if (a < 0x38800000) {                             // below 2^-14: subnormal half or zero
    if (a < 0x33000000) return static_cast<uint16_t>(sign);  // at most 2^-25: rounds to zero
    uint32_t man = (a & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - (a >> 23);  // 14..24
    r = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1))) ++r;
  } else {
    r = (a - 0x38000000) >> 13;
    uint32_t rem = a & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  }
  return static_cast<uint16_t>(sign | r);
}

float bf16_to_float(uint16_t b) {
  uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet NaN
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

template <typename T>
T load_at(const char* p, size_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}

template <typename T>
void store_at(char* p, size_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

// Floating types: each value is loaded into Acc (float for the 16-bit types), reduced in
// rank order, and stored once (rounded to nearest even for the 16-bit types).
template <typename S, typename Acc, typename Load, typename Store>
void reduce_float(char* out, const char* const* in, int nin, size_t n, int op, Acc scalar, Load load, Store store) {
  for (size_t i = 0; i < n; ++i) {
    Acc acc = load(load_at<S>(in[0], i));
    if (op == kPreMulSum) acc *= scalar;
    for (int r = 1; r < nin; ++r) {
      Acc x = load(load_at<S>(in[r], i));
      switch (op) {
        case ncclSum: case ncclAvg: acc += x; break;
        case ncclProd: acc *= x; break;
        case ncclMax: acc = x > acc ? x : acc; break;
        case ncclMin: acc = x < acc ? x : acc; break;
        default: acc += x * scalar; break;  // kPreMulSum
      }
    }
    if (op == ncclAvg) acc /= static_cast<Acc>(nin);
    store_at<S>(out, i, store(acc));
  }
}

// Integer types: sums and products wrap (computed unsigned, at least `unsigned` wide so
// narrow types don't promote to a signed int); Avg is the wrapped sum divided by the rank
// count, truncating toward zero.
template <typename T>
void reduce_int(char* out, const char* const* in, int nin, size_t n, int op, T scalar) {
  using W = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
  for (size_t i = 0; i < n; ++i) {
    T acc = load_at<T>(in[0], i);
    if (op == kPreMulSum) acc = static_cast<T>(static_cast<W>(acc) * static_cast<W>(scalar));
    for (int r = 1; r < nin; ++r) {
      T x = load_at<T>(in[r], i);
      switch (op) {
        case ncclSum: case ncclAvg: acc = static_cast<T>(static_cast<W>(acc) + static_cast<W>(x)); break;
        case ncclProd: acc = static_cast<T>(static_cast<W>(acc) * static_cast<W>(x)); break;
        case ncclMax: acc = x > acc ? x : acc; break;
        case ncclMin: acc = x < acc ? x : acc; break;
        default:  // kPreMulSum
          acc = static_cast<T>(static_cast<W>(acc) + static_cast<W>(x) * static_cast<W>(scalar));
          break;
      }
    }
    if (op == ncclAvg) acc = static_cast<T>(acc / static_cast<T>(nin));
    store_at<T>(out, i, acc);
  }
}

template <typename T>
T scalar_as(uint64_t bits) {
  T v;
  std::memcpy(&v, &bits, sizeof(T));
  return v;
}

// out[i] = reduction over r of in[r][i], for n elements.
void reduce(char* out, const char* const* in, int nin, size_t n, int dtype, int op, uint64_t scalar) {
  auto ident_f = [](float v) { return v; };
  auto ident_d = [](double v) { return v; };
  switch (dtype) {
    case ncclInt8: reduce_int<int8_t>(out, in, nin, n, op, scalar_as<int8_t>(scalar)); break;
    case ncclUint8: reduce_int<uint8_t>(out, in, nin, n, op, scalar_as<uint8_t>(scalar)); break;
    case ncclInt32: reduce_int<int32_t>(out, in, nin, n, op, scalar_as<int32_t>(scalar)); break;
    case ncclUint32: reduce_int<uint32_t>(out, in, nin, n, op, scalar_as<uint32_t>(scalar)); break;
    case ncclInt64: reduce_int<int64_t>(out, in, nin, n, op, scalar_as<int64_t>(scalar)); break;
    case ncclUint64: reduce_int<uint64_t>(out, in, nin, n, op, scalar_as<uint64_t>(scalar)); break;
    case ncclFloat16:
      reduce_float<uint16_t, float>(out, in, nin, n, op, half_to_float(scalar_as<uint16_t>(scalar)), half_to_float,
                                    float_to_half);
      break;
    case ncclBfloat16:
      reduce_float<uint16_t, float>(out, in, nin, n, op, bf16_to_float(scalar_as<uint16_t>(scalar)), bf16_to_float,
                                    float_to_bf16);
      break;
    case ncclFloat32:
      reduce_float<float, float>(out, in, nin, n, op, scalar_as<float>(scalar), ident_f, ident_f);
      break;
    default: reduce_float<double, double>(out, in, nin, n, op, scalar_as<double>(scalar), ident_d, ident_d); break;
  }
}

// ---- Operations --------------------------------------------------------------------------------------

struct P2POp {
  bool is_send = false;
  int peer = 0;
  char* buf = nullptr;  // const for sends
  size_t bytes = 0;
};

enum class Kind { AllReduce, Broadcast, ReduceScatter, AllGather, P2P };

struct Task {
  std::shared_ptr<Comm> comm;
  uint64_t ticket = 0;
  Kind kind = Kind::AllReduce;
  const char* send = nullptr;
  char* recv = nullptr;
  size_t count = 0;
  int dtype = 0;
  int root = 0;
  Reduction red;
  std::vector<P2POp> p2p;
  bool inject_async_failure = false;
};

ncclResult_t run_allreduce(Comm& c, const Task& t, uint64_t scalar) {
  const size_t es = elem_size(t.dtype), chunk = c.hdr->slot_bytes / es;
  std::vector<const char*> in(c.nranks);
  for (int r = 0; r < c.nranks; ++r) in[r] = c.slot(r);
  for (size_t off = 0; off < t.count; off += chunk) {
    size_t n = std::min(chunk, t.count - off);
    std::memcpy(c.slot(c.rank), t.send + off * es, n * es);
    if (ncclResult_t e = barrier(c)) return e;
    reduce(t.recv + off * es, in.data(), c.nranks, n, t.dtype, t.red.op, scalar);
    if (ncclResult_t e = barrier(c)) return e;
  }
  return ncclSuccess;
}

ncclResult_t run_broadcast(Comm& c, const Task& t) {
  const size_t es = elem_size(t.dtype), chunk = c.hdr->slot_bytes / es;
  for (size_t off = 0; off < t.count; off += chunk) {
    size_t n = std::min(chunk, t.count - off);
    if (c.rank == t.root) std::memcpy(c.slot(t.root), t.send + off * es, n * es);
    if (ncclResult_t e = barrier(c)) return e;
    if (c.rank != t.root || t.send != t.recv) std::memcpy(t.recv + off * es, c.slot(t.root), n * es);
    if (ncclResult_t e = barrier(c)) return e;
  }
  return ncclSuccess;
}

// Input: nranks blocks of `count`; rank r gets the reduction of block r. Each round stages
// a piece of every block, so a slot holds nranks pieces.
ncclResult_t run_reducescatter(Comm& c, const Task& t, uint64_t scalar) {
  const size_t es = elem_size(t.dtype), chunk = c.hdr->slot_bytes / es / c.nranks;
  std::vector<const char*> in(c.nranks);
  for (size_t off = 0; off < t.count; off += chunk) {
    size_t n = std::min(chunk, t.count - off);
    for (int b = 0; b < c.nranks; ++b)
      std::memcpy(c.slot(c.rank) + b * n * es, t.send + (b * t.count + off) * es, n * es);
    if (ncclResult_t e = barrier(c)) return e;
    for (int r = 0; r < c.nranks; ++r) in[r] = c.slot(r) + c.rank * n * es;
    reduce(t.recv + off * es, in.data(), c.nranks, n, t.dtype, t.red.op, scalar);
    if (ncclResult_t e = barrier(c)) return e;
  }
  return ncclSuccess;
}

ncclResult_t run_allgather(Comm& c, const Task& t) {
  const size_t es = elem_size(t.dtype), chunk = c.hdr->slot_bytes / es;
  for (size_t off = 0; off < t.count; off += chunk) {
    size_t n = std::min(chunk, t.count - off);
    std::memcpy(c.slot(c.rank), t.send + off * es, n * es);
    if (ncclResult_t e = barrier(c)) return e;
    for (int r = 0; r < c.nranks; ++r) std::memcpy(t.recv + (r * t.count + off) * es, c.slot(r), n * es);
    if (ncclResult_t e = barrier(c)) return e;
  }
  return ncclSuccess;
}

// Progress of the operations between this rank and one peer, in one direction. On the wire
// each message is an 8-byte size followed by its payload.
struct PeerQueue {
  std::vector<const P2POp*> ops;
  size_t index = 0;  // current operation
  size_t done = 0;   // bytes of it (size prefix included) moved so far
  uint64_t size_prefix = 0;
};

// Copies bytes [off, off+n) of the message (prefix + payload) into the ring at `pos`.
void ring_put(char* ring, uint64_t cap, uint64_t pos, const uint64_t& prefix, const char* payload, size_t off,
              size_t n) {
  while (n > 0) {
    size_t ring_off = pos % cap, piece = std::min<size_t>(n, cap - ring_off);
    const char* src;
    if (off < 8) {
      piece = std::min<size_t>(piece, 8 - off);
      src = reinterpret_cast<const char*>(&prefix) + off;
    } else {
      src = payload + (off - 8);
    }
    std::memcpy(ring + ring_off, src, piece);
    pos += piece, off += piece, n -= piece;
  }
}

// Copies n bytes from the ring at `pos` into bytes [off, off+n) of the message.
void ring_get(const char* ring, uint64_t cap, uint64_t pos, uint64_t& prefix, char* payload, size_t off, size_t n) {
  while (n > 0) {
    size_t ring_off = pos % cap, piece = std::min<size_t>(n, cap - ring_off);
    char* dst;
    if (off < 8) {
      piece = std::min<size_t>(piece, 8 - off);
      dst = reinterpret_cast<char*>(&prefix) + off;
    } else {
      dst = payload + (off - 8);
    }
    std::memcpy(dst, ring + ring_off, piece);
    pos += piece, off += piece, n -= piece;
  }
}

// Pushes as much of the pending sends to `peer` as its ring takes. True if anything moved.
bool push_sends(Comm& c, int peer, PeerQueue& s) {
  RingCtrl& ctrl = c.ring_ctrl(c.rank, peer);
  const uint64_t cap = c.hdr->ring_bytes;
  bool moved = false;
  while (s.index < s.ops.size()) {
    const P2POp& op = *s.ops[s.index];
    uint64_t head = ctrl.head.load(std::memory_order_relaxed), tail = ctrl.tail.load(std::memory_order_acquire);
    uint64_t space = cap - (head - tail), total = 8 + op.bytes;
    if (space == 0) break;
    size_t n = static_cast<size_t>(std::min<uint64_t>(space, total - s.done));
    uint64_t prefix = op.bytes;
    ring_put(c.ring(c.rank, peer), cap, head, prefix, op.buf, s.done, n);
    ctrl.head.store(head + n, std::memory_order_release);
    c.doorbell(peer).word.fetch_add(1);
    futex_wake_all(&c.doorbell(peer).word);
    moved = true;
    s.done += n;
    if (s.done == total) ++s.index, s.done = 0;
  }
  return moved;
}

// Pulls what `peer` sent so far into the pending receives. Sets *mismatch (and stops) when
// a message's size differs from the receive's.
bool pull_recvs(Comm& c, int peer, PeerQueue& s, bool* mismatch) {
  RingCtrl& ctrl = c.ring_ctrl(peer, c.rank);
  const uint64_t cap = c.hdr->ring_bytes;
  bool moved = false;
  while (s.index < s.ops.size()) {
    const P2POp& op = *s.ops[s.index];
    uint64_t head = ctrl.head.load(std::memory_order_acquire), tail = ctrl.tail.load(std::memory_order_relaxed);
    uint64_t avail = head - tail;
    if (avail == 0) break;
    // Read the size prefix alone first, to check it before touching the receive buffer.
    uint64_t want = s.done < 8 ? 8 - s.done : 8 + op.bytes - s.done;
    size_t n = static_cast<size_t>(std::min(avail, want));
    ring_get(c.ring(peer, c.rank), cap, tail, s.size_prefix, op.buf, s.done, n);
    ctrl.tail.store(tail + n, std::memory_order_release);
    c.doorbell(peer).word.fetch_add(1);
    futex_wake_all(&c.doorbell(peer).word);
    moved = true;
    s.done += n;
    if (s.done == 8 && s.size_prefix != op.bytes) {
      *mismatch = true;
      return moved;
    }
    if (s.done == 8 + op.bytes) ++s.index, s.done = 0;
  }
  return moved;
}

// All sends and receives of a group at once: progress whatever can move, sleep on this
// rank's doorbell when nothing can.
ncclResult_t run_p2p(Comm& c, const Task& t) {
  std::vector<PeerQueue> sends(c.nranks), recvs(c.nranks);
  for (const P2POp& op : t.p2p) (op.is_send ? sends : recvs)[op.peer].ops.push_back(&op);
  std::atomic<uint32_t>& bell = c.doorbell(c.rank).word;
  for (;;) {
    uint32_t seen = bell.load();
    bool moved = false, finished = true;
    for (int p = 0; p < c.nranks; ++p) {
      if (sends[p].index < sends[p].ops.size()) moved |= push_sends(c, p, sends[p]);
      if (sends[p].index < sends[p].ops.size()) finished = false;
    }
    for (int p = 0; p < c.nranks; ++p) {
      if (recvs[p].index >= recvs[p].ops.size()) continue;
      bool mismatch = false;
      moved |= pull_recvs(c, p, recvs[p], &mismatch);
      if (mismatch) {
        c.set_async_error(ncclInvalidUsage,
                          text_printf("ncclSend/ncclRecv size mismatch: rank %d sent %llu bytes, rank %d expected %zu",
                                      p, static_cast<unsigned long long>(recvs[p].size_prefix), c.rank,
                                      recvs[p].ops[recvs[p].index]->bytes));
        break_shared(c, ncclInvalidUsage);
        return ncclInvalidUsage;
      }
      if (recvs[p].index < recvs[p].ops.size()) finished = false;
    }
    if (finished) return ncclSuccess;
    if (!moved) {
      if (ncclResult_t e = wait_change(c, bell, seen)) return e;
    }
  }
}

ncclResult_t execute(Comm& c, const Task& t) {
  uint64_t scalar = t.red.scalar.value;
  if (t.red.op == kPreMulSum && t.red.scalar.residence == ncclScalarDevice)
    std::memcpy(&scalar, t.red.scalar.pointer, elem_size(t.dtype));  // read now, as on a GPU
  switch (t.kind) {
    case Kind::AllReduce: return run_allreduce(c, t, scalar);
    case Kind::Broadcast: return run_broadcast(c, t);
    case Kind::ReduceScatter: return run_reducescatter(c, t, scalar);
    case Kind::AllGather: return run_allgather(c, t);
    default: return run_p2p(c, t);
  }
}

// Runs on the stream's worker thread. Operations of one communicator run in issue order
// (whatever their streams), one at a time, as all ranks must see the same sequence.
void run_task(void* arg) {
  std::unique_ptr<Task> t(static_cast<Task*>(arg));
  Comm& c = *t->comm;
  Library& l = lib();
  bool skip;
  {
    std::unique_lock<std::mutex> lock(c.mu);
    while (c.exec_ticket != t->ticket && !l.shutdown.load()) c.cv.wait_for(lock, kPollInterval);
    if (l.shutdown.load()) return;  // process exit: leave everything as it is
    skip = c.aborted.load() || c.async_error != ncclSuccess;
    if (!skip && c.hdr->broken.load()) {
      c.set_async_error_locked(c.hdr->broken_code.load(),
                               text_printf("communicator failed on rank %d", c.hdr->broken_rank.load()));
      skip = true;
    }
    if (!skip && t->inject_async_failure && l.async_stall) {
      while (!c.aborted.load() && !c.hdr->broken.load() && !l.shutdown.load()) c.cv.wait_for(lock, kPollInterval);
      skip = true;  // stalled until aborted: the peers wait too
    } else if (!skip && t->inject_async_failure) {
      c.set_async_error_locked(ncclInternalError, "injected asynchronous failure");
      skip = true;  // the peers' side of this operation waits for this rank forever
    }
  }
  if (!skip) {
    ncclResult_t e = execute(c, *t);
    if (e != ncclSuccess) c.set_async_error(e, "operation failed");  // no-op if already set
  }
  {
    std::lock_guard<std::mutex> lock(c.mu);
    ++c.exec_ticket;
    if (--c.outstanding == 0 && c.aborted.load()) c.unmap_locked();
  }
  c.cv.notify_all();
}

// ---- API helpers ------------------------------------------------------------------------------------

// How an API call found its communicator.
struct CommRef {
  std::shared_ptr<Comm> comm;
  ncclResult_t status = ncclSuccess;
};

// Looks a handle up. Queries and ncclCommAbort (`allow_dead`) also accept communicators
// that were aborted or destroyed; everything else gets ncclInvalidUsage for those.
CommRef lookup(ncclComm_t handle, bool allow_dead = false) {
  CommRef ref;
  if (handle == nullptr) {
    ref.status = fail(ncclInvalidArgument, "comm is NULL");
    return ref;
  }
  Library& l = lib();
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.live.find(handle);
  bool found = it != l.live.end();
  if (!found) {
    it = l.retired.find(handle);
    if (it == l.retired.end()) {
      ref.status = fail(ncclInvalidArgument, "invalid communicator");
      return ref;
    }
  }
  if (!allow_dead && (!found || it->second->aborted.load())) {
    ref.status = fail(ncclInvalidUsage, "communicator was aborted or destroyed");
    return ref;
  }
  ref.comm = it->second;
  return ref;
}

// The rank of a handle for logging and error injection; -1 if it isn't a live communicator.
int rank_of(ncclComm_t handle) {
  if (handle == nullptr) return -1;
  Library& l = lib();
  std::lock_guard<std::mutex> lock(l.mu);
  auto it = l.live.find(handle);
  if (it == l.live.end()) it = l.retired.find(handle);
  return it == l.retired.end() ? -1 : it->second->rank;
}

// Counts a call of `name` on `rank`; returns whether a FAIL spec (sync) or an ASYNC_FAIL
// spec (async) matches this call.
void count_call(const char* name, int rank, bool* sync_fail, bool* async_fail) {
  Library& l = lib();
  *sync_fail = *async_fail = false;
  if (l.fail_specs.empty() && l.async_fail_specs.empty()) return;
  std::lock_guard<std::mutex> lock(l.mu);
  long n = ++l.call_counts[{name, rank}];
  for (const FailSpec& s : l.fail_specs)
    if (s.call == name && (s.rank == -1 || s.rank == rank) && s.nth == n) *sync_fail = true;
  for (const FailSpec& s : l.async_fail_specs)
    if (s.call == name && (s.rank == -1 || s.rank == rank) && s.nth == n) *async_fail = true;
}

// Logs the call, then applies error injection. Returns ncclInternalError for an injected
// synchronous failure; *async_fail tells the caller to poison what it enqueues.
ncclResult_t enter(const char* name, int rank, const std::string& details, bool* async_fail = nullptr) {
  lib().log.line("%s rank=%d pid=%d%s", name, rank, static_cast<int>(::getpid()), details.c_str());
  bool sync_fail = false, async = false;
  count_call(name, rank, &sync_fail, &async);
  if (async_fail != nullptr) *async_fail = async;
  if (sync_fail) return fail(ncclInternalError, "injected failure");
  return ncclSuccess;
}

bool valid_dtype(int dtype) { return dtype >= 0 && dtype < ncclNumTypes; }

// Resolves a reduction for `dtype` on `c`; false (error text set) if invalid.
bool resolve_op(Comm& c, int op, int dtype, Reduction* red) {
  if (op >= 0 && op < ncclNumOps) {
    red->op = op;
    return true;
  }
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.redops.find(op);
  if (it == c.redops.end()) {
    t_last_error = text_printf("invalid reduction operation %d", op);
    return false;
  }
  if (it->second.dtype != dtype) {
    t_last_error = text_printf("reduction operation %d was created for another data type", op);
    return false;
  }
  red->op = kPreMulSum;
  red->scalar = it->second;
  return true;
}

// Operations of the calling thread's open group (ncclGroupStart .. ncclGroupEnd).
struct GroupState {
  int depth = 0;
  std::vector<std::unique_ptr<Task>> collectives;
  std::unique_ptr<Task> p2p;  // all sends and receives, as one exchange
  std::shared_ptr<Comm> comm;
  cudaStream_t stream = nullptr;
  bool mixed = false;  // operations on more than one communicator or stream
  void clear() {
    collectives.clear();
    p2p.reset();
    comm.reset();
    stream = nullptr;
    mixed = false;
  }
};
thread_local GroupState t_group;

// Queues `tasks` on `stream`, in order.
ncclResult_t submit(Comm& c, cudaStream_t stream, std::vector<std::unique_ptr<Task>>& tasks) {
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.aborted.load() || c.destroyed) return fail(ncclInvalidUsage, "communicator was aborted or destroyed");
  for (auto& t : tasks) {
    t->ticket = c.next_ticket;
    cudaError_t err = cudaLaunchHostFunc(stream, run_task, t.get());
    if (err != 0) return fail(ncclUnhandledCudaError, std::string("cudaLaunchHostFunc: ") + cudaGetErrorString(err));
    t.release();  // run_task owns it now
    ++c.next_ticket;
    ++c.outstanding;
  }
  return ncclSuccess;
}

// Adds an operation to the open group, or runs it as a group of one.
ncclResult_t add_task(const std::shared_ptr<Comm>& comm, cudaStream_t stream, std::unique_ptr<Task> task) {
  GroupState& g = t_group;
  bool own_group = g.depth == 0;
  if (own_group) ++g.depth;
  if (!g.comm) {
    g.comm = comm;
    g.stream = stream;
  } else if (g.comm != comm || g.stream != stream) {
    g.mixed = true;
  }
  if (task->kind != Kind::P2P) {
    g.collectives.push_back(std::move(task));
  } else if (!g.p2p) {
    g.p2p = std::move(task);
  } else {
    g.p2p->p2p.push_back(task->p2p.front());
    g.p2p->inject_async_failure |= task->inject_async_failure;
  }
  if (!own_group) return ncclSuccess;
  --g.depth;
  // Flush the group of one.
  std::vector<std::unique_ptr<Task>> tasks = std::move(g.collectives);
  if (g.p2p) tasks.push_back(std::move(g.p2p));
  g.clear();
  return submit(*comm, stream, tasks);
}

std::unique_ptr<Task> new_task(const std::shared_ptr<Comm>& comm, Kind kind, bool async_fail) {
  auto t = std::make_unique<Task>();
  t->comm = comm;
  t->kind = kind;
  t->inject_async_failure = async_fail;
  return t;
}

std::string details(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string details(const char* fmt, ...) {
  char buf[256];
  buf[0] = ' ';
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf + 1, sizeof(buf) - 1, fmt, ap);
  va_end(ap);
  return buf;
}

// Shared validation of the collectives: comm, dtype, buffers.
ncclResult_t check_collective(const CommRef& ref, int dtype, size_t count, const void* send, const void* recv) {
  if (ref.status != ncclSuccess) return ref.status;
  if (!valid_dtype(dtype)) return fail(ncclInvalidArgument, text_printf("invalid data type %d", dtype));
  if (count > 0 && (send == nullptr || recv == nullptr)) return fail(ncclInvalidArgument, "buffer is NULL");
  return ncclSuccess;
}

// ---- Initialization ---------------------------------------------------------------------------------

// Creates the segment as its first rank, sized and laid out for nranks.
ncclResult_t create_segment(int fd, int nranks, char** base, size_t* bytes) {
  Library& l = lib();
  uint64_t slot = align_up(std::max<uint64_t>(l.slot_bytes, 64ull * nranks), 64);
  uint64_t ring = std::max<uint64_t>(1024, (slot / nranks) / 64 * 64);
  uint64_t off_doorbells = align_up(sizeof(ShmHeader), 64);
  uint64_t off_rings_ctrl = off_doorbells + sizeof(Doorbell) * nranks;
  uint64_t off_slots = align_up(off_rings_ctrl + sizeof(RingCtrl) * nranks * nranks, 4096);
  uint64_t off_rings = off_slots + slot * nranks;
  uint64_t total = off_rings + ring * nranks * nranks;
  if (::ftruncate(fd, static_cast<off_t>(total)) != 0)
    return fail(ncclSystemError, text_printf("ftruncate of the shared memory segment: %s", std::strerror(errno)));
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail(ncclSystemError, text_printf("mmap: %s", std::strerror(errno)));
  // ftruncate zero-fills: all counters, flags and pids start at 0.
  auto* h = static_cast<ShmHeader*>(p);
  h->nranks = nranks;
  h->total_bytes = total;
  h->slot_bytes = slot;
  h->ring_bytes = ring;
  h->off_doorbells = off_doorbells;
  h->off_rings_ctrl = off_rings_ctrl;
  h->off_slots = off_slots;
  h->off_rings = off_rings;
  h->ready.store(kShmReady);
  *base = static_cast<char*>(p);
  *bytes = total;
  return ncclSuccess;
}

// Maps a segment another rank created, once it is initialized.
ncclResult_t attach_segment(int fd, Clock::time_point deadline, char** base, size_t* bytes) {
  struct stat st {};
  for (;;) {  // the creator may not have sized it yet
    if (::fstat(fd, &st) != 0) return fail(ncclSystemError, text_printf("fstat: %s", std::strerror(errno)));
    if (st.st_size > 0) break;
    if (Clock::now() > deadline) return fail(ncclSystemError, "timed out waiting for the other ranks");
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  size_t total = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return fail(ncclSystemError, text_printf("mmap: %s", std::strerror(errno)));
  auto* h = static_cast<ShmHeader*>(p);
  while (h->ready.load() != kShmReady) {
    if (Clock::now() > deadline) {
      ::munmap(p, total);
      return fail(ncclSystemError, "timed out waiting for the other ranks");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  *base = static_cast<char*>(p);
  *bytes = total;
  return ncclSuccess;
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& id, int rank) {
  uint64_t magic;
  std::memcpy(&magic, id.internal, 8);
  const char* name = id.internal + 8;
  if (magic != kIdMagic || name[0] != '/' || ::memchr(name, '\0', NCCL_UNIQUE_ID_BYTES - 8) == nullptr)
    return fail(ncclInvalidArgument, "invalid ncclUniqueId (not from this library's ncclGetUniqueId)");
  Library& l = lib();
  auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(std::max(0.0, l.init_timeout_s)));

  // The first rank to come creates the segment; the others open it.
  Fd fd;
  char* base = nullptr;
  size_t bytes = 0;
  for (;;) {
    fd.reset(::shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600));
    if (fd.get() >= 0) {
      if (ncclResult_t e = create_segment(fd.get(), nranks, &base, &bytes)) {
        ::shm_unlink(name);
        return e;
      }
      break;
    }
    if (errno != EEXIST) return fail(ncclSystemError, text_printf("shm_open(%s): %s", name, std::strerror(errno)));
    fd.reset(::shm_open(name, O_RDWR, 0600));
    if (fd.get() >= 0) {
      if (ncclResult_t e = attach_segment(fd.get(), deadline, &base, &bytes)) {
        ::shm_unlink(name);
        return e;
      }
      break;
    }
    if (errno != ENOENT) return fail(ncclSystemError, text_printf("shm_open(%s): %s", name, std::strerror(errno)));
    // Unlinked between our two calls; try again.
  }

  auto comm = std::make_shared<Comm>();
  comm->rank = rank;
  comm->nranks = nranks;
  cudaGetDevice(&comm->device);
  comm->base = base;
  comm->map_bytes = bytes;
  comm->hdr = reinterpret_cast<ShmHeader*>(base);
  comm->mapped = true;
  ShmHeader* h = comm->hdr;
  auto give_up = [&](ncclResult_t code, const std::string& text) {
    h->init_failed.store(1);
    futex_wake_all(&h->attached);
    ::shm_unlink(name);  // every rank that gives up unlinks: nothing is left in /dev/shm
    std::lock_guard<std::mutex> lock(comm->mu);
    comm->unmap_locked();
    return fail(code, text);
  };
  if (h->nranks != nranks)
    return give_up(ncclInvalidArgument, text_printf("nranks %d differs from another rank's %d", nranks, h->nranks));
  int32_t none = 0;
  if (!h->pids[rank].compare_exchange_strong(none, static_cast<int32_t>(::getpid())))
    return give_up(ncclInvalidArgument, text_printf("rank %d joined twice", rank));
  if (h->attached.fetch_add(1) + 1 == static_cast<uint32_t>(nranks)) {
    ::shm_unlink(name);  // all ranks have it mapped
    futex_wake_all(&h->attached);
  }
  for (;;) {
    uint32_t seen = h->attached.load();
    if (seen == static_cast<uint32_t>(nranks)) break;
    if (h->init_failed.load()) return give_up(ncclSystemError, "another rank failed to initialize");
    if (l.shutdown.load()) return give_up(ncclSystemError, "process is exiting");
    if (Clock::now() > deadline)
      return give_up(ncclSystemError, text_printf("timed out after %.1f s waiting for %d of %d ranks",
                                                  l.init_timeout_s, nranks - static_cast<int>(seen), nranks));
    futex_wait(&h->attached, seen, kPollInterval);
  }

  std::lock_guard<std::mutex> lock(l.mu);
  l.live[comm.get()] = comm;
  *out = reinterpret_cast<ncclComm_t>(comm.get());
  return ncclSuccess;
}

// Moves a communicator from the live map to the retired one.
void retire(const std::shared_ptr<Comm>& c) {
  Library& l = lib();
  std::lock_guard<std::mutex> lock(l.mu);
  l.live.erase(c.get());
  l.retired[c.get()] = c;
}

}  // namespace

// ---- Exported API ---------------------------------------------------------------------------------------

FAKE_EXPORT ncclResult_t ncclGetVersion(int* version) {
  if (ncclResult_t e = enter("ncclGetVersion", -1, "")) return e;
  if (version == nullptr) return fail(ncclInvalidArgument, "version is NULL");
  *version = kVersion;
  return ncclSuccess;
}

FAKE_EXPORT const char* ncclGetErrorString(ncclResult_t result) {
  lib().log.line("ncclGetErrorString rank=-1 pid=%d", static_cast<int>(::getpid()));
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

FAKE_EXPORT const char* ncclGetLastError(ncclComm_t comm) {
  lib().log.line("ncclGetLastError rank=%d pid=%d", rank_of(comm), static_cast<int>(::getpid()));
  if (!t_last_error.empty() || comm == nullptr) return t_last_error.c_str();
  CommRef ref = lookup(comm, true);
  t_last_error.clear();  // lookup must not leave its own text behind
  if (!ref.comm) return "";
  std::lock_guard<std::mutex> lock(ref.comm->mu);
  if (ref.comm->async_error == ncclSuccess) return "";
  return ref.comm->async_text.c_str();  // written once with the error, never changed afterwards
}

FAKE_EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (ncclResult_t e = enter("ncclGetUniqueId", -1, "")) return e;
  if (id == nullptr) return fail(ncclInvalidArgument, "uniqueId is NULL");
  unsigned char rnd[12];
  if (::getrandom(rnd, sizeof(rnd), 0) != static_cast<ssize_t>(sizeof(rnd)))
    return fail(ncclSystemError, "getrandom failed");
  std::memset(id->internal, 0, sizeof(id->internal));
  std::memcpy(id->internal, &kIdMagic, 8);
  std::string name = text_printf("/hvdlite_fake_nccl_%d_", static_cast<int>(::getpid()));
  for (unsigned char b : rnd) name += text_printf("%02x", b);
  std::memcpy(id->internal + 8, name.c_str(), name.size() + 1);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  if (ncclResult_t e = enter("ncclCommInitRank", rank, details("nranks=%d", nranks))) return e;
  if (comm == nullptr) return fail(ncclInvalidArgument, "comm is NULL");
  if (nranks < 1 || nranks > kMaxRanks)
    return fail(ncclInvalidArgument, text_printf("invalid nranks %d (1..%d)", nranks, kMaxRanks));
  if (rank < 0 || rank >= nranks) return fail(ncclInvalidArgument, text_printf("invalid rank %d", rank));
  return init_rank(comm, nranks, id, rank);
}

FAKE_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (ncclResult_t e = enter("ncclCommDestroy", rank_of(comm), "")) return e;
  CommRef ref = lookup(comm);
  if (!ref.comm) return ref.status;
  Comm& c = *ref.comm;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    c.destroyed = true;  // no new operations
  }
  retire(ref.comm);
  std::unique_lock<std::mutex> lock(c.mu);
  while (c.outstanding > 0 && !lib().shutdown.load()) c.cv.wait_for(lock, kPollInterval);
  if (c.outstanding == 0) c.unmap_locked();
  return ncclSuccess;
}

// Marks the communicator aborted here and in shared memory: queued operations are skipped,
// blocked ones stop waiting (within ~10 ms), and the peers' operations fail with
// ncclRemoteError. Returns without waiting; the mapping goes when the last operation ends.
FAKE_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (ncclResult_t e = enter("ncclCommAbort", rank_of(comm), "")) return e;
  CommRef ref = lookup(comm, true);
  if (!ref.comm) return ref.status;
  Comm& c = *ref.comm;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.aborted.exchange(true)) return ncclSuccess;
    c.set_async_error_locked(ncclInvalidUsage, "communicator aborted by ncclCommAbort");
    if (c.mapped) {
      break_shared(c, ncclRemoteError);
      if (c.outstanding == 0) c.unmap_locked();
    }
  }
  c.cv.notify_all();
  retire(ref.comm);
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (ncclResult_t e = enter("ncclCommGetAsyncError", rank_of(comm), "")) return e;
  if (async_error == nullptr) return fail(ncclInvalidArgument, "asyncError is NULL");
  CommRef ref = lookup(comm, true);
  if (!ref.comm) return ref.status;
  Comm* c = ref.comm.get();
  std::lock_guard<std::mutex> lock(c->mu);
  // A peer's abort, a dead peer seen by another rank, or a mismatch shows up here even
  // while this rank has nothing queued.
  if (c->async_error == ncclSuccess && c->mapped && c->hdr->broken.load())
    c->set_async_error_locked(c->hdr->broken_code.load(),
                              text_printf("communicator failed on rank %d", c->hdr->broken_rank.load()));
  *async_error = c->async_error;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommCount(ncclComm_t comm, int* count) {
  if (ncclResult_t e = enter("ncclCommCount", rank_of(comm), "")) return e;
  CommRef ref = lookup(comm, true);
  if (!ref.comm) return ref.status;
  if (count == nullptr) return fail(ncclInvalidArgument, "count is NULL");
  *count = ref.comm->nranks;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommUserRank(ncclComm_t comm, int* rank) {
  if (ncclResult_t e = enter("ncclCommUserRank", rank_of(comm), "")) return e;
  CommRef ref = lookup(comm, true);
  if (!ref.comm) return ref.status;
  if (rank == nullptr) return fail(ncclInvalidArgument, "rank is NULL");
  *rank = ref.comm->rank;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclCommCuDevice(ncclComm_t comm, int* device) {
  if (ncclResult_t e = enter("ncclCommCuDevice", rank_of(comm), "")) return e;
  CommRef ref = lookup(comm, true);
  if (!ref.comm) return ref.status;
  if (device == nullptr) return fail(ncclInvalidArgument, "device is NULL");
  *device = ref.comm->device;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                  ncclScalarResidence_t residence, ncclComm_t comm) {
  if (ncclResult_t e = enter("ncclRedOpCreatePreMulSum", rank_of(comm), details("dtype=%d", datatype))) return e;
  CommRef ref = lookup(comm);
  if (!ref.comm) return ref.status;
  if (op == nullptr || scalar == nullptr) return fail(ncclInvalidArgument, "op or scalar is NULL");
  if (!valid_dtype(datatype)) return fail(ncclInvalidArgument, text_printf("invalid data type %d", datatype));
  if (residence != ncclScalarDevice && residence != ncclScalarHostImmediate)
    return fail(ncclInvalidArgument, text_printf("invalid scalar residence %d", residence));
  PreMulSumOp p;
  p.dtype = datatype;
  p.residence = residence;
  if (residence == ncclScalarHostImmediate)
    std::memcpy(&p.value, scalar, elem_size(datatype));
  else
    p.pointer = scalar;
  Comm& c = *ref.comm;
  std::lock_guard<std::mutex> lock(c.mu);
  *op = c.next_redop++;
  c.redops[*op] = p;
  return ncclSuccess;
}

FAKE_EXPORT ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (ncclResult_t e = enter("ncclRedOpDestroy", rank_of(comm), details("op=%d", op))) return e;
  CommRef ref = lookup(comm);
  if (!ref.comm) return ref.status;
  std::lock_guard<std::mutex> lock(ref.comm->mu);
  if (ref.comm->redops.erase(op) == 0)
    return fail(ncclInvalidArgument, text_printf("invalid reduction operation %d", op));
  return ncclSuccess;  // operations already queued keep their copy
}

FAKE_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  bool async_fail = false;
  if (ncclResult_t e = enter("ncclAllReduce", rank_of(comm),
                             details("count=%zu dtype=%d op=%d", count, datatype, op), &async_fail))
    return e;
  CommRef ref = lookup(comm);
  if (ncclResult_t e = check_collective(ref, datatype, count, sendbuff, recvbuff)) return e;
  auto t = new_task(ref.comm, Kind::AllReduce, async_fail);
  if (!resolve_op(*ref.comm, op, datatype, &t->red)) return ncclInvalidArgument;
  t->send = static_cast<const char*>(sendbuff);
  t->recv = static_cast<char*>(recvbuff);
  t->count = count;
  t->dtype = datatype;
  return add_task(ref.comm, stream, std::move(t));
}

FAKE_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                       int root, ncclComm_t comm, cudaStream_t stream) {
  bool async_fail = false;
  if (ncclResult_t e = enter("ncclBroadcast", rank_of(comm),
                             details("count=%zu dtype=%d root=%d", count, datatype, root), &async_fail))
    return e;
  CommRef ref = lookup(comm);
  if (ref.status != ncclSuccess) return ref.status;
  if (root < 0 || root >= ref.comm->nranks) return fail(ncclInvalidArgument, text_printf("invalid root %d", root));
  // Only the root reads sendbuff.
  const void* send_check = ref.comm->rank == root ? sendbuff : recvbuff;
  if (ncclResult_t e = check_collective(ref, datatype, count, send_check, recvbuff)) return e;
  auto t = new_task(ref.comm, Kind::Broadcast, async_fail);
  t->send = static_cast<const char*>(sendbuff);
  t->recv = static_cast<char*>(recvbuff);
  t->count = count;
  t->dtype = datatype;
  t->root = root;
  return add_task(ref.comm, stream, std::move(t));
}

FAKE_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                           cudaStream_t stream) {
  bool async_fail = false;
  if (ncclResult_t e = enter("ncclReduceScatter", rank_of(comm),
                             details("count=%zu dtype=%d op=%d", recvcount, datatype, op), &async_fail))
    return e;
  CommRef ref = lookup(comm);
  if (ncclResult_t e = check_collective(ref, datatype, recvcount, sendbuff, recvbuff)) return e;
  auto t = new_task(ref.comm, Kind::ReduceScatter, async_fail);
  if (!resolve_op(*ref.comm, op, datatype, &t->red)) return ncclInvalidArgument;
  t->send = static_cast<const char*>(sendbuff);
  t->recv = static_cast<char*>(recvbuff);
  t->count = recvcount;
  t->dtype = datatype;
  return add_task(ref.comm, stream, std::move(t));
}

FAKE_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                       ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  bool async_fail = false;
  if (ncclResult_t e = enter("ncclAllGather", rank_of(comm), details("count=%zu dtype=%d", sendcount, datatype),
                             &async_fail))
    return e;
  CommRef ref = lookup(comm);
  if (ncclResult_t e = check_collective(ref, datatype, sendcount, sendbuff, recvbuff)) return e;
  auto t = new_task(ref.comm, Kind::AllGather, async_fail);
  t->send = static_cast<const char*>(sendbuff);
  t->recv = static_cast<char*>(recvbuff);
  t->count = sendcount;
  t->dtype = datatype;
  return add_task(ref.comm, stream, std::move(t));
}

namespace {
ncclResult_t point_to_point(const char* name, bool is_send, void* buf, size_t count, int datatype, int peer,
                            ncclComm_t comm, cudaStream_t stream) {
  bool async_fail = false;
  if (ncclResult_t e = enter(name, rank_of(comm), details("count=%zu dtype=%d peer=%d", count, datatype, peer),
                             &async_fail))
    return e;
  CommRef ref = lookup(comm);
  if (ref.status != ncclSuccess) return ref.status;
  if (!valid_dtype(datatype)) return fail(ncclInvalidArgument, text_printf("invalid data type %d", datatype));
  if (peer < 0 || peer >= ref.comm->nranks) return fail(ncclInvalidArgument, text_printf("invalid peer %d", peer));
  if (count > 0 && buf == nullptr) return fail(ncclInvalidArgument, "buffer is NULL");
  auto t = new_task(ref.comm, Kind::P2P, async_fail);
  P2POp op;
  op.is_send = is_send;
  op.peer = peer;
  op.buf = static_cast<char*>(buf);
  op.bytes = count * elem_size(datatype);
  t->p2p.push_back(op);
  return add_task(ref.comm, stream, std::move(t));
}
}  // namespace

FAKE_EXPORT ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                  ncclComm_t comm, cudaStream_t stream) {
  return point_to_point("ncclSend", true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream);
}

FAKE_EXPORT ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                  cudaStream_t stream) {
  return point_to_point("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream);
}

FAKE_EXPORT ncclResult_t ncclGroupStart() {
  if (ncclResult_t e = enter("ncclGroupStart", -1, "")) return e;
  ++t_group.depth;
  return ncclSuccess;
}

// The outermost GroupEnd queues the group: its collectives in issue order, then all its
// sends and receives as one exchange.
FAKE_EXPORT ncclResult_t ncclGroupEnd() {
  GroupState& g = t_group;
  int rank = g.depth == 1 && g.comm ? g.comm->rank : -1;
  bool async_fail = false;
  ncclResult_t injected = enter("ncclGroupEnd", rank, "", &async_fail);
  if (g.depth == 0) return fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--g.depth > 0) return injected;
  std::vector<std::unique_ptr<Task>> tasks = std::move(g.collectives);
  if (g.p2p) tasks.push_back(std::move(g.p2p));
  std::shared_ptr<Comm> comm = g.comm;
  cudaStream_t stream = g.stream;
  bool mixed = g.mixed;
  g.clear();
  if (injected != ncclSuccess) return injected;  // the group is dropped
  if (tasks.empty()) return ncclSuccess;
  if (mixed) return fail(ncclInvalidUsage, "a group may use only one communicator and one stream (fake NCCL)");
  for (auto& t : tasks) t->inject_async_failure |= async_fail;
  return submit(*comm, stream, tasks);
}
