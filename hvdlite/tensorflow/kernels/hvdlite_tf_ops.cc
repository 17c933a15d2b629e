// hvdlite's TensorFlow ops: collectives inside graphs (tf.function, Keras fit, and
// TensorFlow 1 graphs run by a tf.compat.v1.Session) that never block a thread.
//
// Built on first use against the installed TensorFlow (hvdlite/tensorflow/_kernels.py,
// g++ with tf.sysconfig's flags), cached, and loaded with tf.load_op_library; the
// install of hvdlite itself compiles nothing against TensorFlow. This library does
// not link against hvdlite's core either: it calls the engine through the table of
// C functions of ../../csrc/c_api.h, whose address Python passes to
// hvdlite_tf_set_core_api() once the library is loaded.
//
// Ops:
//   HvdliteCollectives  a batch of requests (allreduce, grouped allreduce, allgather,
//                       broadcast, alltoall, reducescatter, barrier, join) submitted
//                       together, completing when all of them have finished.
//   HvdliteSubmit       submits a bucket of gradient requests and returns a ticket
//                       at once (hvdlite.tensorflow.overlap orders these ops);
//   HvdliteWait         completes when the tickets' requests have finished and
//                       outputs their results.
// The asynchronous ones register a callback for every handle and return; the last
// callback (on the engine's thread) finishes the op: there, when the results are
// already in the op's outputs (allreduce, broadcast), else on a completion thread of
// this library, which copies the engine's outputs into TensorFlow tensors first. So
// TensorFlow's executor never waits in an hvdlite op: collectives
// that TensorFlow runs in different orders on different ranks are all in flight at
// once, and the engine matches them by name.
//
// Errors carry TensorFlow's codes as Horovod's ops do: a collective that failed because
// the ranks disagreed (or another rank refused its input) is FAILED_PRECONDITION; input
// this rank refused has the code Python chose for it (INVALID_ARGUMENT for a bad value,
// UNIMPLEMENTED, ...), a stopped engine UNKNOWN.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "c_api.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"

namespace hvdlite_tf {

namespace tf = ::tensorflow;

std::atomic<const HvdliteCoreApi*> g_core{nullptr};

// ---- the completion thread ----------------------------------------------------------

// Runs the tail of asynchronous ops (copies of engine outputs, the done callback) off
// the engine's thread, in the order the ops completed.
class CompletionThread {
 public:
  // Lives as long as the process: TensorFlow never unloads an op library, and joining
  // the thread while the interpreter exits could wait for work TensorFlow abandoned.
  static CompletionThread& Get() {
    static CompletionThread* thread = new CompletionThread();
    return *thread;
  }

  void Post(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_one();
  }

  ~CompletionThread() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  CompletionThread() : thread_([this] { Run(); }) {}

  void Run() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [this] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopped, nothing left
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lk.unlock();
      task();
      lk.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

// ---- describing requests ------------------------------------------------------------

// The attributes that describe a batch of requests, as hvdlite/tensorflow/mpi_ops.py
// writes them: one entry per request.
struct BatchSpec {
  std::vector<int64_t> kinds, reduce_ops, roots, groups, dtype_codes, problem_codes;
  std::vector<int64_t> input_index, splits_index;  // into the op's inputs; -1: none
  std::vector<int64_t> scale_bits;                 // prescale, postscale per request (float64 bits)
  std::vector<std::string> names, problems;        // problems: found when traced ("" none)
  int64_t process_set = 0;                         // Horovod's process set id (0: global)

  absl::Status Read(tf::OpKernelConstruction* c, bool with_indices) {
    TF_RETURN_IF_ERROR(c->GetAttr("kinds", &kinds));
    TF_RETURN_IF_ERROR(c->GetAttr("names", &names));
    TF_RETURN_IF_ERROR(c->GetAttr("reduce_ops", &reduce_ops));
    TF_RETURN_IF_ERROR(c->GetAttr("scale_bits", &scale_bits));
    TF_RETURN_IF_ERROR(c->GetAttr("roots", &roots));
    TF_RETURN_IF_ERROR(c->GetAttr("groups", &groups));
    TF_RETURN_IF_ERROR(c->GetAttr("dtype_codes", &dtype_codes));
    TF_RETURN_IF_ERROR(c->GetAttr("problems", &problems));
    TF_RETURN_IF_ERROR(c->GetAttr("problem_codes", &problem_codes));
    TF_RETURN_IF_ERROR(c->GetAttr("process_set", &process_set));
    const size_t n = kinds.size();
    if (with_indices) {
      TF_RETURN_IF_ERROR(c->GetAttr("input_index", &input_index));
      TF_RETURN_IF_ERROR(c->GetAttr("splits_index", &splits_index));
    } else {  // one input per request, in order
      for (size_t i = 0; i < n; ++i) input_index.push_back(static_cast<int64_t>(i));
      splits_index.assign(n, -1);
    }
    if (names.size() != n || reduce_ops.size() != n || scale_bits.size() != 2 * n || roots.size() != n ||
        groups.size() != n || dtype_codes.size() != n || problems.size() != n || problem_codes.size() != n ||
        input_index.size() != n || splits_index.size() != n)
      return absl::InvalidArgumentError("hvdlite: the attributes of an hvdlite op disagree on the number of requests");
    return absl::OkStatus();
  }

  double Scale(size_t i, int which) const {
    double v;
    const int64_t bits = scale_bits[2 * i + which];
    static_assert(sizeof(v) == sizeof(bits), "float64 bits");
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }
};

const char* KindName(int64_t kind) {
  switch (kind) {
    case HVDLITE_ALLREDUCE: return "allreduce";
    case HVDLITE_ALLGATHER: return "allgather";
    case HVDLITE_BROADCAST: return "broadcast";
    case HVDLITE_ALLTOALL: return "alltoall";
    case HVDLITE_REDUCESCATTER: return "reducescatter";
    case HVDLITE_BARRIER: return "barrier";
    case HVDLITE_JOIN: return "join";
  }
  return "unknown";
}

// Group ids for grouped allreduces submitted here. Python numbers its own groups from
// 0 (hvdlite.common.naming); these start far above, so the two never meet on a rank.
// A group is keyed by rank 0's id (coordinator.cc), so ranks need not agree on them,
// and cannot: TensorFlow may run a graph's groups in a different order on each rank.
int32_t NewGroupId() {
  static std::atomic<int32_t> next{1 << 30};
  return next.fetch_add(1);
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// One request of a running op.
struct Item {
  int64_t kind = HVDLITE_ALLREDUCE;
  int64_t handle = 0;          // 0: never submitted (see `error`)
  int refused_code = 0;        // != 0: this rank refused it; the code its failure gets
  absl::Status error;            // a failure before anything was submitted
  tf::Tensor input;            // what the engine reads (kept alive until it is done)
  tf::Tensor output;           // allreduce/broadcast: what the engine writes
  bool as_bytes = false;       // moved as rows of bytes (a type the engine does not reduce)
  std::vector<int64_t> splits; // alltoall
};

// Checks and submits request `i` of `spec` (or refuses it, with `problem`). `out` is the
// tensor an allreduce or broadcast writes (allocated by the caller).
void SubmitItem(const HvdliteCoreApi* core, const BatchSpec& spec, size_t i, const std::string& problem,
                int problem_code, int32_t group_id, int32_t group_size, Item* item) {
  char error[1024] = {0};
  const std::string& name = spec.names[i];
  if (!problem.empty()) {
    item->refused_code = problem_code;
    item->handle = core->refuse(static_cast<int32_t>(item->kind), name.c_str(), problem.c_str(), group_id,
                                group_size, static_cast<int32_t>(spec.process_set), error, sizeof(error));
  } else {
    HvdliteRequest q{};
    q.type = static_cast<int32_t>(item->kind);
    q.name = name.c_str();
    q.reduce_op = static_cast<int32_t>(spec.reduce_ops[i]);
    q.prescale = spec.Scale(i, 0);
    q.postscale = spec.Scale(i, 1);
    q.root = static_cast<int32_t>(spec.roots[i]);
    q.group_id = group_id;
    q.group_size = group_size;
    q.process_set = static_cast<int32_t>(spec.process_set);
    std::vector<int64_t> shape;
    if (item->kind == HVDLITE_BARRIER || item->kind == HVDLITE_JOIN) {
      shape = {0};
      q.dtype = HVDLITE_UINT8;
    } else {
      const tf::Tensor& t = item->input;
      for (int d = 0; d < t.dims(); ++d) shape.push_back(t.dim_size(d));
      if (item->as_bytes) {  // rows of bytes, or all of it for a broadcast
        const int64_t bytes = static_cast<int64_t>(t.tensor_data().size());
        if (item->kind == HVDLITE_BROADCAST) {
          shape = {bytes};
        } else {
          // A row's bytes from the shape, not from the data: a rank with no rows still
          // sends rows as wide as the others'.
          int64_t width = shape.empty() ? bytes : static_cast<int64_t>(tf::DataTypeSize(t.dtype()));
          for (size_t d = 1; d < shape.size(); ++d) width *= shape[d];
          shape = {shape.empty() ? 1 : shape[0], width};
        }
        q.dtype = HVDLITE_UINT8;
      } else {
        q.dtype = static_cast<int32_t>(spec.dtype_codes[i]);
      }
      q.input = t.tensor_data().data();
      if (item->kind == HVDLITE_ALLREDUCE) q.output = const_cast<char*>(item->output.tensor_data().data());
      if (item->kind == HVDLITE_BROADCAST) q.input = item->output.tensor_data().data();
    }
    q.shape = shape.data();
    q.ndim = static_cast<int32_t>(shape.size());
    if (!item->splits.empty()) {
      q.splits = item->splits.data();
      q.nsplits = static_cast<int32_t>(item->splits.size());
    }
    item->handle = core->enqueue(&q, error, sizeof(error));
  }
  if (item->handle == 0) item->error = absl::FailedPreconditionError(error[0] ? error : "hvdlite: submit failed");
}

// A problem this rank sees at run time in request `i` (its tensor's rank, alltoall's
// splits), with its code; "" when none. The engine checks the same at rank 0, but a
// rank that finds a problem with its own input refuses it, so that it gets the code
// Horovod gives (INVALID_ARGUMENT for splits that do not fit).
std::string RuntimeProblem(const Item& item, int world, int* code) {
  *code = static_cast<int>(absl::StatusCode::kFailedPrecondition);
  const int64_t k = item.kind;
  if (k != HVDLITE_ALLGATHER && k != HVDLITE_ALLTOALL && k != HVDLITE_REDUCESCATTER) return "";
  if (item.input.dims() == 0) return "needs a tensor of rank >= 1";
  if (k != HVDLITE_ALLTOALL) return "";
  *code = static_cast<int>(absl::StatusCode::kInvalidArgument);
  const int64_t rows = item.input.dim_size(0);
  if (item.splits.empty()) {
    if (world > 0 && rows % world != 0)
      return "first dimension " + std::to_string(rows) + " does not divide evenly among " + std::to_string(world) +
             " ranks; pass splits";
    return "";
  }
  int64_t sum = 0;
  bool negative = false;
  for (int64_t s : item.splits) {
    sum += s;
    negative = negative || s < 0;
  }
  if (static_cast<int>(item.splits.size()) != world || negative || sum != rows)
    return "splits " + ShapeText(item.splits) + " must be " + std::to_string(world) +
           " non-negative counts summing to the first dimension " + std::to_string(rows);
  return "";
}

// The failure of a finished request, as a TensorFlow status.
absl::Status FailureOf(const Item& item, const HvdliteResult& r) {
  absl::StatusCode code = absl::StatusCode::kFailedPrecondition;  // ranks disagreed, another refused
  if (r.engine_stopped) code = absl::StatusCode::kUnknown;        // Horovod's code for a stopped job
  else if (item.refused_code != 0) code = static_cast<absl::StatusCode>(item.refused_code);
  return absl::Status(code, r.error && *r.error ? r.error : "hvdlite: collective failed");
}

// Writes the result of a finished, successful request into outputs starting at `out`.
// `outputs_allocated`: allreduce and broadcast wrote into the op's output already
// (else into a temporary, which becomes the output).
absl::Status OutputResult(tf::OpKernelContext* ctx, const Item& item, const HvdliteResult& r, int out,
                          bool outputs_allocated) {
  switch (item.kind) {
    case HVDLITE_ALLREDUCE:
    case HVDLITE_BROADCAST:
      if (!outputs_allocated) ctx->set_output(out, item.output);
      return absl::OkStatus();
    case HVDLITE_BARRIER:
    case HVDLITE_JOIN: {
      tf::Tensor* t = nullptr;
      TF_RETURN_IF_ERROR(ctx->allocate_output(out, tf::TensorShape({}), &t));
      const int32_t v = item.kind == HVDLITE_JOIN ? (r.naux > 0 ? static_cast<int32_t>(r.aux[0]) : -1) : 0;
      std::memcpy(const_cast<char*>(t->tensor_data().data()), &v, sizeof(v));
      return absl::OkStatus();
    }
    default:
      break;
  }
  // Engine-allocated: allgather, alltoall, reducescatter. Rows come from the engine,
  // the rest of the shape from the input.
  tf::TensorShape shape;
  const int64_t rows = r.ndim > 0 ? r.shape[0] : 0;
  TF_RETURN_IF_ERROR(shape.AddDimWithStatus(rows));
  for (int d = 1; d < item.input.dims(); ++d) TF_RETURN_IF_ERROR(shape.AddDimWithStatus(item.input.dim_size(d)));
  tf::Tensor* t = nullptr;
  TF_RETURN_IF_ERROR(ctx->allocate_output(out, shape, &t));
  const size_t want = t->tensor_data().size();
  if (static_cast<size_t>(r.bytes) != want)
    return absl::InternalError("hvdlite: " + std::string(KindName(item.kind)) + " result of " +
                               std::to_string(r.bytes) + " bytes, expected " + std::to_string(want));
  if (want > 0) std::memcpy(const_cast<char*>(t->tensor_data().data()), r.data, want);
  if (item.kind == HVDLITE_ALLTOALL) {
    tf::Tensor* received = nullptr;
    TF_RETURN_IF_ERROR(ctx->allocate_output(out + 1, tf::TensorShape({r.naux}), &received));
    auto* p = reinterpret_cast<int32_t*>(const_cast<char*>(received->tensor_data().data()));
    for (int32_t j = 0; j < r.naux; ++j) p[j] = static_cast<int32_t>(r.aux[j]);
  }
  return absl::OkStatus();
}

int OutputsOf(int64_t kind) { return kind == HVDLITE_ALLTOALL ? 2 : 1; }

// Whether finishing `items` copies an engine-allocated output (allgather, alltoall,
// reducescatter). If not (allreduce, broadcast, barrier, join), the op is finished on
// the thread that completed its last request, the engine's, without a hand-off to the
// completion thread: only a few small tensors are written and TensorFlow's done
// callback queues what follows on its own threads. Copies go to the completion
// thread, so that the engine does not wait for them.
bool CopiesOutputs(const std::vector<Item>& items) {
  for (const Item& item : items)
    if (item.handle != 0 && (item.kind == HVDLITE_ALLGATHER || item.kind == HVDLITE_ALLTOALL ||
                             item.kind == HVDLITE_REDUCESCATTER))
      return true;
  return false;
}

// Runs `finish` now, or on the completion thread when `items` need copies.
void FinishOp(const std::vector<Item>& items, std::function<void()> finish) {
  if (CopiesOutputs(items)) CompletionThread::Get().Post(std::move(finish));
  else finish();
}

const HvdliteCoreApi* CoreOrFail(tf::OpKernelContext* ctx) {
  const HvdliteCoreApi* core = g_core.load();
  if (!core)
    ctx->SetStatus(absl::FailedPreconditionError(
        "hvdlite's TensorFlow kernels were loaded without hvdlite's engine; build graphs with "
        "hvdlite.tensorflow's functions"));
  return core;
}

// Prepares the requests of `spec` from the op's inputs, checks them, refuses whole
// groups with a refused member, and submits them all. Allreduce and broadcast
// outputs are made by `make_output(i, input, &tensor)`.
absl::Status SubmitBatch(tf::OpKernelContext* ctx, const HvdliteCoreApi* core, const BatchSpec& spec,
                       const std::function<absl::Status(size_t, const tf::Tensor&, tf::Tensor*)>& make_output,
                       std::vector<Item>* items) {
  const size_t n = spec.kinds.size();
  const int world = core->set_size(static_cast<int32_t>(spec.process_set));  // -1: submitting says why
  items->resize(n);
  std::vector<std::string> problems(n);
  std::vector<int> codes(n, 0);
  const auto writes_output = [](int64_t kind) { return kind == HVDLITE_ALLREDUCE || kind == HVDLITE_BROADCAST; };
  for (size_t i = 0; i < n; ++i) {
    Item& item = (*items)[i];
    item.kind = spec.kinds[i];
    // Allreduce and broadcast keep the input only once their output exists: a reference
    // held now would stop TensorFlow from handing the input's buffer to the output.
    if (spec.input_index[i] >= 0 && !writes_output(item.kind))
      item.input = ctx->input(static_cast<int>(spec.input_index[i]));
    if (spec.splits_index[i] >= 0) {
      const tf::Tensor& s = ctx->input(static_cast<int>(spec.splits_index[i]));
      const auto* p = reinterpret_cast<const int32_t*>(s.tensor_data().data());
      for (int64_t j = 0; j < s.NumElements(); ++j) item.splits.push_back(p[j]);
    }
    item.as_bytes = spec.dtype_codes[i] < 0;
    if (!spec.problems[i].empty()) {
      problems[i] = spec.problems[i];
      codes[i] = static_cast<int>(spec.problem_codes[i]);
    } else if (world > 0) {
      problems[i] = RuntimeProblem(item, world, &codes[i]);
    }
  }
  // A refused member refuses its whole group: the other ranks wait for all of it.
  std::unordered_map<int64_t, int32_t> group_size, group_id;
  std::unordered_map<int64_t, std::pair<std::string, int>> failed;
  std::vector<int> position(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const int64_t g = spec.groups[i];
    if (g < 0) continue;
    position[i] = group_size[g]++;
    if (!problems[i].empty() && !failed.count(g))
      failed[g] = {"member " + std::to_string(position[i]) + " of its group: " + problems[i], codes[i]};
  }
  for (const auto& [g, size] : group_size) group_id[g] = NewGroupId();
  for (size_t i = 0; i < n; ++i) {
    Item& item = (*items)[i];
    const int64_t g = spec.groups[i];
    std::string problem = problems[i];
    int code = codes[i];
    if (problem.empty() && g >= 0 && failed.count(g)) std::tie(problem, code) = failed[g];
    if (writes_output(item.kind)) {
      const tf::Tensor& in = ctx->input(static_cast<int>(spec.input_index[i]));
      if (problem.empty()) {
        absl::Status made = make_output(i, in, &item.output);
        if (!made.ok()) {
          problem = std::string(made.message());
          code = static_cast<int>(made.code());
        } else if (item.kind == HVDLITE_BROADCAST && item.output.tensor_data().data() != in.tensor_data().data()) {
          std::memcpy(const_cast<char*>(item.output.tensor_data().data()), in.tensor_data().data(),
                      in.tensor_data().size());
        }
      }
      item.input = in;  // what the engine reads: the output's own buffer when forwarded
    }
    SubmitItem(core, spec, i, problem, code, g >= 0 ? group_id[g] : -1, g >= 0 ? group_size[g] : 0, &item);
  }
  return absl::OkStatus();
}

// Calls `then` once every submitted handle of `items` is done (on the thread that
// finished the last one; at once if none is pending).
class Countdown {
 public:
  static void Start(const HvdliteCoreApi* core, const std::vector<Item>& items, std::function<void()> then) {
    auto* c = new Countdown(std::move(then));
    for (const Item& item : items)
      if (item.handle != 0) {
        c->remaining_.fetch_add(1);
        core->when_done(item.handle, &Countdown::OneDone, c);
      }
    OneDone(c);  // the count started at one, so that nothing fires before this
  }

 private:
  explicit Countdown(std::function<void()> then) : then_(std::move(then)) {}
  static void OneDone(void* arg) {
    auto* c = static_cast<Countdown*>(arg);
    if (c->remaining_.fetch_sub(1) == 1) {
      std::function<void()> then = std::move(c->then_);
      delete c;
      then();
    }
  }
  std::atomic<int> remaining_{1};
  std::function<void()> then_;
};

// Takes every item's result, writes outputs in order from `first_output` (see
// OutputResult for `outputs_allocated`), and returns the first failure.
absl::Status Collect(tf::OpKernelContext* ctx, const HvdliteCoreApi* core, std::vector<Item>& items,
                     int first_output, bool outputs_allocated) {
  absl::Status first = absl::OkStatus();
  int out = first_output;
  for (Item& item : items) {
    const int outs = OutputsOf(item.kind);
    if (item.handle == 0) {
      if (first.ok()) first = item.error;
      out += outs;
      continue;
    }
    HvdliteResult r{};
    core->take_result(item.handle, &r);
    item.handle = 0;
    absl::Status s = r.ok ? (first.ok() ? OutputResult(ctx, item, r, out, outputs_allocated) : absl::OkStatus()) : FailureOf(item, r);
    core->free_result(&r);
    if (!s.ok() && first.ok()) first = s;
    out += outs;
  }
  return first;
}

// ---- HvdliteCollectives ---------------------------------------------------------------

class CollectivesOp : public tf::AsyncOpKernel {
 public:
  explicit CollectivesOp(tf::OpKernelConstruction* c) : tf::AsyncOpKernel(c) {
    OP_REQUIRES_OK(c, spec_.Read(c, /*with_indices=*/true));
  }

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const HvdliteCoreApi* core = CoreOrFail(ctx);
    if (!core) return done();
    auto items = std::make_shared<std::vector<Item>>();
    std::vector<int> first_output;  // of each request
    int out = 0;
    for (int64_t k : spec_.kinds) {
      first_output.push_back(out);
      out += OutputsOf(k);
    }
    auto make_output = [&](size_t i, const tf::Tensor& in, tf::Tensor* result) -> absl::Status {
      tf::Tensor* t = nullptr;
      // An input nothing else reads is reduced in place.
      TF_RETURN_IF_ERROR(ctx->forward_input_or_allocate_output({static_cast<int>(spec_.input_index[i])},
                                                               first_output[i], in.shape(), &t));
      *result = *t;
      return absl::OkStatus();
    };
    absl::Status s = SubmitBatch(ctx, core, spec_, make_output, items.get());
    if (!s.ok()) {
      ctx->SetStatus(s);
      return done();
    }
    Countdown::Start(core, *items, [ctx, core, items, done = std::move(done)]() mutable {
      FinishOp(*items, [ctx, core, items, done = std::move(done)]() {
        absl::Status s = Collect(ctx, core, *items, 0, /*outputs_allocated=*/true);
        items->clear();  // the engine is done with every tensor
        if (!s.ok()) ctx->SetStatus(s);
        done();
      });
    });
  }

 private:
  BatchSpec spec_;
};

// ---- HvdliteSubmit / HvdliteWait ------------------------------------------------------

// The requests one submit op made, until a wait op takes them.
class Ticket {
 public:
  std::vector<Item> items;
  std::string key;  // the first request's name: a later submit of it abandons this one

  // Calls `then` once every request is done (at once if they are).
  void Then(std::function<void()> then) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (!done_) {
        then_ = std::move(then);
        return;
      }
    }
    then();
  }

  void MarkDone() {
    std::function<void()> then;
    {
      std::lock_guard<std::mutex> lk(mu_);
      done_ = true;
      then.swap(then_);
    }
    if (then) then();
  }

 private:
  std::mutex mu_;
  bool done_ = false;
  std::function<void()> then_;
};

class TicketTable {
 public:
  static TicketTable& Get() {
    static TicketTable* table = new TicketTable();  // process lifetime, like the ops
    return *table;
  }

  // Registers `t`, returns its number. A ticket of the same key that no wait op took
  // (its step failed before the wait) is dropped once its requests are done.
  int64_t Add(std::shared_ptr<Ticket> t, const HvdliteCoreApi* core) {
    std::shared_ptr<Ticket> abandoned;
    int64_t id;
    {
      std::lock_guard<std::mutex> lk(mu_);
      id = next_++;
      auto k = by_key_.find(t->key);
      if (k != by_key_.end()) {
        auto it = tickets_.find(k->second);
        if (it != tickets_.end()) {
          abandoned = std::move(it->second);
          tickets_.erase(it);
        }
      }
      by_key_[t->key] = id;
      tickets_[id] = std::move(t);
    }
    if (abandoned) abandoned->Then([abandoned, core] { Discard(core, abandoned->items); });
    return id;
  }

  std::shared_ptr<Ticket> Take(int64_t id) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = tickets_.find(id);
    if (it == tickets_.end()) return nullptr;
    std::shared_ptr<Ticket> t = std::move(it->second);
    tickets_.erase(it);
    auto k = by_key_.find(t->key);
    if (k != by_key_.end() && k->second == id) by_key_.erase(k);
    return t;
  }

  // Forgets the results of finished requests nobody will collect.
  static void Discard(const HvdliteCoreApi* core, std::vector<Item>& items) {
    for (Item& item : items) {
      if (item.handle == 0) continue;
      HvdliteResult r{};
      core->take_result(item.handle, &r);
      core->free_result(&r);
      item.handle = 0;
    }
  }

 private:
  std::mutex mu_;
  int64_t next_ = 1;
  std::unordered_map<int64_t, std::shared_ptr<Ticket>> tickets_;
  std::unordered_map<std::string, int64_t> by_key_;
};

// Optional record of when each submit op ran (for hvdlite's tests): CLOCK_MONOTONIC
// nanoseconds, the time base of Python's time.monotonic_ns().
std::atomic<bool> g_trace_submits{false};
std::mutex g_trace_mu;
std::string g_trace;

class SubmitOp : public tf::OpKernel {
 public:
  explicit SubmitOp(tf::OpKernelConstruction* c) : tf::OpKernel(c) {
    OP_REQUIRES_OK(c, spec_.Read(c, /*with_indices=*/false));
    for (int64_t k : spec_.kinds)
      OP_REQUIRES(c, k == HVDLITE_ALLREDUCE || k == HVDLITE_ALLGATHER,
                  absl::InvalidArgumentError("hvdlite: HvdliteSubmit takes allreduce and allgather requests"));
  }

  void Compute(tf::OpKernelContext* ctx) override {
    const HvdliteCoreApi* core = CoreOrFail(ctx);
    if (!core) return;
    if (g_trace_submits.load()) {
      const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::steady_clock::now().time_since_epoch()).count();
      std::string names;
      for (const std::string& n : spec_.names) names += (names.empty() ? "" : ",") + n;
      std::lock_guard<std::mutex> lk(g_trace_mu);
      g_trace += std::to_string(ns) + " " + names + "\n";
    }
    auto ticket = std::make_shared<Ticket>();
    ticket->key = spec_.names.empty() ? std::string() : spec_.names[0];
    // Results outlive this op, so allreduces write into temporaries the wait op outputs.
    auto make_output = [ctx](size_t, const tf::Tensor& in, tf::Tensor* result) -> absl::Status {
      return ctx->allocate_temp(in.dtype(), in.shape(), result);
    };
    OP_REQUIRES_OK(ctx, SubmitBatch(ctx, core, spec_, make_output, &ticket->items));
    Countdown::Start(core, ticket->items, [ticket] { ticket->MarkDone(); });
    tf::Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, tf::TensorShape({}), &out));
    const int64_t id = TicketTable::Get().Add(ticket, core);
    std::memcpy(const_cast<char*>(out->tensor_data().data()), &id, sizeof(id));
  }

 private:
  BatchSpec spec_;
};

class WaitOp : public tf::AsyncOpKernel {
 public:
  explicit WaitOp(tf::OpKernelConstruction* c) : tf::AsyncOpKernel(c) {}

  void ComputeAsync(tf::OpKernelContext* ctx, DoneCallback done) override {
    const HvdliteCoreApi* core = CoreOrFail(ctx);
    if (!core) return done();
    auto tickets = std::make_shared<std::vector<std::shared_ptr<Ticket>>>();
    bool lost = false;
    for (int i = 0; i < ctx->num_inputs(); ++i) {
      int64_t id = 0;
      std::memcpy(&id, ctx->input(i).tensor_data().data(), sizeof(id));
      std::shared_ptr<Ticket> t = TicketTable::Get().Take(id);
      if (t) tickets->push_back(std::move(t));
      else lost = true;
    }
    if (lost) {
      for (auto& t : *tickets) t->Then([t, core] { TicketTable::Discard(core, t->items); });
      ctx->SetStatus(absl::FailedPreconditionError("hvdlite: a collective's results were lost (step aborted?)"));
      return done();
    }
    // Collect once the last ticket is done, on the completion thread.
    auto remaining = std::make_shared<std::atomic<int>>(static_cast<int>(tickets->size()) + 1);
    auto finish = [ctx, core, tickets, remaining, done = std::move(done)]() {
      if (remaining->fetch_sub(1) != 1) return;
      std::vector<Item> all;  // what finishing needs to know: kinds and handles
      for (auto& t : *tickets)
        for (const Item& item : t->items) {
          all.emplace_back();
          all.back().kind = item.kind;
          all.back().handle = item.handle;
        }
      FinishOp(all, [ctx, core, tickets, done]() {
        absl::Status first = absl::OkStatus();
        int out = 0;
        for (auto& t : *tickets) {
          absl::Status s = Collect(ctx, core, t->items, out, /*outputs_allocated=*/false);
          if (!s.ok() && first.ok()) first = s;
          for (const Item& item : t->items) out += OutputsOf(item.kind);
        }
        tickets->clear();
        if (!first.ok()) ctx->SetStatus(first);
        done();
      });
    };
    for (auto& t : *tickets) t->Then(finish);
    finish();
  }
};

}  // namespace hvdlite_tf

// ---- registration -----------------------------------------------------------------------

#define HVDLITE_BATCH_ATTRS                 \
  Attr("kinds: list(int) >= 0")             \
      .Attr("names: list(string) >= 0")     \
      .Attr("reduce_ops: list(int) >= 0")   \
      .Attr("scale_bits: list(int) >= 0")   \
      .Attr("roots: list(int) >= 0")        \
      .Attr("groups: list(int) >= 0")       \
      .Attr("dtype_codes: list(int) >= 0")  \
      .Attr("problems: list(string) >= 0")  \
      .Attr("problem_codes: list(int) >= 0") \
      .Attr("process_set: int = 0")

// Stateful: TensorFlow must neither fold nor deduplicate a collective, and keeps
// program order among stateful ops inside a tf.function.
REGISTER_OP("HvdliteCollectives")
    .Input("tensors: Tin")
    .Output("outputs: Tout")
    .Attr("Tin: list(type) >= 0")
    .Attr("Tout: list(type) >= 0")
    .HVDLITE_BATCH_ATTRS
    .Attr("input_index: list(int) >= 0")
    .Attr("splits_index: list(int) >= 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnknownShape);

REGISTER_OP("HvdliteSubmit")
    .Input("tensors: Tin")
    .Output("ticket: int64")
    .Attr("Tin: list(type) >= 0")
    .HVDLITE_BATCH_ATTRS
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::ScalarShape);

REGISTER_OP("HvdliteWait")
    .Input("tickets: N * int64")
    .Output("outputs: Tout")
    .Attr("N: int >= 0")
    .Attr("Tout: list(type) >= 0")
    .SetIsStateful()
    .SetShapeFn(::tensorflow::shape_inference::UnknownShape);

REGISTER_KERNEL_BUILDER(Name("HvdliteCollectives").Device(::tensorflow::DEVICE_CPU), hvdlite_tf::CollectivesOp);
REGISTER_KERNEL_BUILDER(Name("HvdliteSubmit").Device(::tensorflow::DEVICE_CPU), hvdlite_tf::SubmitOp);
REGISTER_KERNEL_BUILDER(Name("HvdliteWait").Device(::tensorflow::DEVICE_CPU), hvdlite_tf::WaitOp);

// ---- the C entry points Python calls (ctypes) -----------------------------------------------

extern "C" {

// Hands the engine's table (hvdlite._core.c_api_address()) to the ops. Returns 1, or 0
// when the table is of another version than this library was built for.
__attribute__((visibility("default"))) int hvdlite_tf_set_core_api(const void* table) {
  const auto* api = static_cast<const HvdliteCoreApi*>(table);
  if (!api || api->version != HVDLITE_C_API_VERSION ||
      api->struct_size < static_cast<int32_t>(sizeof(HvdliteCoreApi)))
    return 0;
  hvdlite_tf::g_core.store(api);
  return 1;
}

__attribute__((visibility("default"))) int hvdlite_tf_c_api_version() { return HVDLITE_C_API_VERSION; }

// Tests: record when each submit op runs (on), and take the record (one line per op:
// CLOCK_MONOTONIC nanoseconds, then its request names). Copies at most `size` - 1
// bytes; returns the record's full length.
__attribute__((visibility("default"))) void hvdlite_tf_trace_submits(int on) {
  hvdlite_tf::g_trace_submits.store(on != 0);
}

__attribute__((visibility("default"))) int64_t hvdlite_tf_take_submit_trace(char* buf, int64_t size) {
  std::lock_guard<std::mutex> lk(hvdlite_tf::g_trace_mu);
  const int64_t n = static_cast<int64_t>(hvdlite_tf::g_trace.size());
  if (buf && size > 0) {
    const int64_t k = n < size - 1 ? n : size - 1;
    std::memcpy(buf, hvdlite_tf::g_trace.data(), static_cast<size_t>(k));
    buf[k] = '\0';
    if (k == n) hvdlite_tf::g_trace.clear();
  }
  return n;
}

}  // extern "C"
