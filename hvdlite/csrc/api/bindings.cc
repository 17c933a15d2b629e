// The thin Python surface of the engine (module hvdlite._core): init and shutdown,
// process info, enqueue / poll / wait / take_output / release, and the timeline.
// Tensors arrive as raw pointers with dtype and shape; no framework header is used.
#include <pthread.h>
#include <pybind11/pybind11.h>
#include <unistd.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <list>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "api/core_api.h"
#include "api/dlpack_export.h"
#include "backends/nccl/nccl_library.h"
#include "common/handle_table.h"
#include "common/logging.h"
#include "common/parameters.h"
#include "engine/engine.h"
#include "gpu/cuda_runtime.h"
#include "gpu/library_loader.h"
#include "world/membership.h"
#include "world/world.h"

namespace py = pybind11;
using namespace hvdlite;

namespace {

// The process's one world (world/world.h). Its lifecycle calls come with the GIL held,
// which is the world's caller lock: it lets go of it while it blocks in MPI.
World& TheWorld() {
  static World* world = new World([] { return std::shared_ptr<void>(std::make_shared<py::gil_scoped_release>()); });
  return *world;  // never destroyed: engine threads may outlive the interpreter's exit
}
HandleTable& Handles() { return TheWorld().handles(); }
Engine& Running() { return TheWorld().Running(); }
Engine& RunningSet(int32_t id) { return TheWorld().RunningSet(id); }
Engine& Known() { return TheWorld().Known(); }
bool ForkedCopy() { return TheWorld().ForkedCopy(); }
void RaiseIfForkedCopy() { TheWorld().RaiseIfForkedCopy(); }

void SetHvdliteError(const std::string& message, const char* cls = "HvdliteError");
[[noreturn]] void RaiseHvdliteError(const std::string& message, const char* cls = "HvdliteError");

// The request type code from Python, checked.
RequestType CheckedType(int type) {
  if (type < 0 || type > static_cast<int>(RequestType::kJoin))
    throw std::invalid_argument("hvdlite: unknown request type " + std::to_string(type));
  return static_cast<RequestType>(type);
}

// A buffer-protocol view held for the length of one blocking call; it also keeps the
// exporting object alive.
class HeldBuffer {
 public:
  HeldBuffer() = default;
  HeldBuffer(const HeldBuffer&) = delete;
  HeldBuffer& operator=(const HeldBuffer&) = delete;
  HeldBuffer(HeldBuffer&& other) noexcept : view_(other.view_), held_(other.held_) { other.held_ = false; }
  ~HeldBuffer() {
    if (held_) PyBuffer_Release(&view_);
  }
  // False (with no Python error set) if `obj` is not a C-contiguous buffer, or not a
  // writable one when `writable` is asked for.
  bool Get(py::handle obj, bool writable) {
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj.ptr(), &view_, flags) != 0) {
      PyErr_Clear();
      return false;
    }
    held_ = true;
    return true;
  }
  const Py_buffer& view() const { return view_; }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// Blocking collectives whose wait a signal handler's exception interrupted: the engine
// may still read and write the caller's arrays, so their buffers stay held until the
// request is done. Reaped (with the GIL, which also guards the list) by later calls.
struct InterruptedRun {
  int64_t handle;
  HeldBuffer in, out;
};
std::list<InterruptedRun> g_interrupted_runs;

void ReapInterruptedRuns() {
  for (auto it = g_interrupted_runs.begin(); it != g_interrupted_runs.end();) {
    if (!Handles().Poll(it->handle)) {
      ++it;
      continue;
    }
    Handles().Release(it->handle);
    it = g_interrupted_runs.erase(it);  // releases the buffers
  }
}

void Shutdown() {
  if (!TheWorld().Shutdown()) return;
  // The engine is gone: nothing writes into interrupted calls' arrays any more.
  for (InterruptedRun& run : g_interrupted_runs) Handles().Release(run.handle);
  g_interrupted_runs.clear();
}

void Finalize() {
  Shutdown();
  TheWorld().Finalize();
}

int64_t Enqueue(int type, std::string name, uintptr_t in_ptr, uintptr_t out_ptr, int dtype,
                std::vector<int64_t> shape, int device, int reduce_op, double prescale, double postscale,
                int root, const std::vector<int64_t>& splits, int group_id, int group_size, bool caller_waits,
                std::optional<uintptr_t> stream = std::nullopt, int32_t process_set = 0) {
  Engine& e = RunningSet(process_set);
  if (!ValidDataType(dtype)) throw std::invalid_argument("hvdlite: unknown dtype code " + std::to_string(dtype));
  const RequestType kind = CheckedType(type);
  for (int64_t d : shape)
    if (d < 0) throw std::invalid_argument("hvdlite: negative dimension in shape of '" + name + "'");
  Request r;
  r.type = kind;
  r.name = std::move(name);
  r.dtype = static_cast<DataType>(dtype);
  r.shape = std::move(shape);
  r.device = device;
  r.reduce_op = static_cast<ReduceOp>(reduce_op);
  r.prescale = prescale;
  r.postscale = postscale;
  r.root = root;
  r.splits = splits;
  r.group_id = group_id;
  r.group_size = group_size;
  try {
    return e.Enqueue(std::move(r), reinterpret_cast<const void*>(in_ptr), reinterpret_cast<void*>(out_ptr),
                     caller_waits, stream, /*advance=*/true);
  } catch (const DuplicateName& ex) {
    RaiseHvdliteError(ex.what(), "HvdliteValueError");
  }
}

// A collective this rank cannot take part in: its own check of the caller's input
// failed with `message`. The other ranks may have submitted the same collective, so
// instead of failing only here the request goes to the coordinator marked as refused,
// and the collective fails on every rank with a message naming this rank.
// `group_id`/`group_size`: the grouped allreduce the request belongs to, so that rank 0
// can fail its other members too (-1/0: none).
int64_t Refuse(int type, const std::string& name, const std::string& message, int group_id, int group_size,
               int32_t process_set = 0) {
  Request r;
  r.type = CheckedType(type);
  r.name = name;
  r.error = message.empty() ? std::string("invalid input") : message;
  r.group_id = group_id;
  r.group_size = group_size;
  return RunningSet(process_set).Enqueue(std::move(r), nullptr, nullptr, /*caller_waits=*/true);
}

// Waits for `h` (GIL released); with `release`, also forgets it (for results with no
// engine output). Returns whether it succeeded, with the reason in `error` if not.
// With `consumers` (cudaStream_t handles), a collective queued on a GPU is ordered
// before the work queued on those streams from now on; the host does not wait for it.
// With `sync_host`, the host waits for the device work (for data whose owner named no
// stream to order).
// How long a blocked caller waits between looks at Python's pending signals.
constexpr int64_t kSignalCheckMicros = 100000;

bool WaitFor(int64_t h, bool release, std::string* error, const std::vector<uintptr_t>& consumers = {},
             bool sync_host = false) {
  if (ForkedCopy()) {  // the request was the parent's; nothing here completes it
    *error = TheWorld().ForkedMessage();
    return false;
  }
  bool ok;
  std::shared_ptr<Engine> engine = TheWorld().OwnerEngine(h);
  py::gil_scoped_release nogil;
  std::shared_ptr<ReadyEvent> ready;
  // The engine may run itself on this thread while it waits (Engine::Wait). The wait
  // goes in slices with Python's signal handlers run between them, so that Ctrl-C, a
  // SIGALRM or a SIGTERM handler ends a collective that never completes (a peer gone
  // silent) with their exception; the request stays in the engine.
  for (;;) {
    bool pending = false;
    ok = engine ? engine->Wait(h, error, release, &ready, kSignalCheckMicros, &pending)
                : Handles().Wait(h, error, release, &ready, kSignalCheckMicros, &pending);
    if (!pending) break;
    py::gil_scoped_acquire gil;
    if (PyErr_CheckSignals() != 0) {
      engine.reset();
      throw py::error_already_set();
    }
  }
  engine.reset();  // the last owner, if another thread shut down meanwhile
  if (ok && ready && (!consumers.empty() || sync_host)) {
    try {
      cuda::DeviceGuard guard(cuda::Runtime::Get(), ready->device());
      for (uintptr_t s : consumers) ready->OrderBefore(s);
      if (sync_host) ready->Synchronize();
    } catch (const std::exception& ex) {
      *error = std::string("ordering the consumer after the collective: ") + ex.what();
      ok = false;
    }
  }
  return ok;
}

// Sets the Python error `cls`, a class of hvdlite.common.exceptions (HvdliteError or
// one of its subclasses), with `message`. Looked up on the error path only.
void SetHvdliteError(const std::string& message, const char* cls) {
  py::object type = py::module_::import("hvdlite.common.exceptions").attr(cls);
  PyErr_SetString(type.ptr(), message.c_str());
}

// Raises it.
[[noreturn]] void RaiseHvdliteError(const std::string& message, const char* cls) {
  SetHvdliteError(message, cls);
  throw py::error_already_set();
}

// A blocking collective on arrays the caller owns (allreduce into `out`, or in place
// when `out` is `in`; broadcast in place on `in`; barrier with `in` None): enqueue,
// wait and release in one call. `dtype` is the engine's code for the arrays' element
// type. This is the NumPy front end's path for blocking calls. Compared with
// enqueue + wait it saves the Python handle object and several crossings into the
// extension; right after a large collective has flushed the caches, that Python work
// costs more than the engine's own.
//
// With `decline`, a call the engine cannot take as it stands (the engine not running,
// an array that is not a C-contiguous buffer, or not writable where written) returns
// false having done nothing, so that the caller's full path can deal with it (copy a
// strided input, or raise the error that explains it). Without, such input fails the
// collective on every rank (see Refuse) and raises here. True once the collective ran.
bool RunCollective(int type, std::string name, py::handle in, py::handle out, int dtype, int reduce_op,
                   double prescale, double postscale, int root, bool decline, int32_t process_set = 0) {
  if (decline && (ForkedCopy() || !TheWorld().current() || !TheWorld().current()->Running())) return false;
  if (!g_interrupted_runs.empty()) ReapInterruptedRuns();
  const auto kind = static_cast<RequestType>(type);
  if (kind != RequestType::kAllreduce && kind != RequestType::kBroadcast && kind != RequestType::kBarrier)
    throw std::invalid_argument("hvdlite: run() takes allreduce, broadcast and barrier requests only");
  if (!ValidDataType(dtype)) throw std::invalid_argument("hvdlite: unknown dtype code " + std::to_string(dtype));
  // Bad input fails the collective on every rank (see Refuse), then raises here.
  auto refuse = [&](const std::string& problem) {
    std::string error;
    WaitFor(Refuse(type, name, RequestLabel(kind, name) + problem, -1, 0, process_set), /*release=*/true, &error);
    RaiseHvdliteError(error);
  };
  const bool in_place = kind == RequestType::kBroadcast || out.is(in) || out.is_none();
  HeldBuffer a, b;
  std::vector<int64_t> shape{0};
  uintptr_t in_ptr = 0, out_ptr = 0;
  if (kind != RequestType::kBarrier) {
    if (!a.Get(in, in_place)) {
      if (decline) return false;
      refuse(in_place ? ": the in-place form needs a writable C-contiguous array (use the "
                        "out-of-place form, or make it contiguous first)"
                      : ": the input must be a C-contiguous array");
    }
    const Py_buffer& v = a.view();
    if (v.itemsize != DataTypeSize(static_cast<DataType>(dtype)))
      refuse(": the array's item size does not match its dtype");
    shape.assign(v.shape, v.shape + v.ndim);
    in_ptr = out_ptr = reinterpret_cast<uintptr_t>(v.buf);
    if (!in_place) {
      if (!b.Get(out, true) || b.view().len != v.len) {
        if (decline) return false;
        refuse(": the output must be a writable C-contiguous array of the input's size");
      }
      out_ptr = reinterpret_cast<uintptr_t>(b.view().buf);
    }
  }
  const int64_t h = Enqueue(type, std::move(name), in_ptr, kind == RequestType::kBroadcast ? 0 : out_ptr, dtype,
                            std::move(shape), kCpuDevice, reduce_op, prescale, postscale, root, {}, -1, 0,
                            /*caller_waits=*/true, std::nullopt, process_set);
  std::string error;
  bool ok;
  try {
    ok = WaitFor(h, /*release=*/true, &error);
  } catch (py::error_already_set&) {  // a signal handler raised; the request goes on
    g_interrupted_runs.push_back(InterruptedRun{h, std::move(a), std::move(b)});
    throw;
  }
  if (!ok) RaiseHvdliteError(error);
  return true;
}

// Runs `body` (which returns a new reference, or null with a Python error set) and
// turns a C++ exception into the Python error pybind11 would raise for it (a name
// already in flight: HvdliteValueError). For the plain CPython functions below.
template <typename Body>
PyObject* CallGuarded(Body&& body) {
  try {
    return body();
  } catch (py::error_already_set& e) {
    e.restore();
  } catch (const DuplicateName& e) {
    SetHvdliteError(e.what(), "HvdliteValueError");
  } catch (const WorldError& e) {
    SetHvdliteError(e.what());
  } catch (const std::invalid_argument& e) {
    PyErr_SetString(PyExc_ValueError, e.what());
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  return nullptr;
}

// The NumPy front end's blocking calls enter here first (see _direct_run in
// hvdlite/mpi_ops.py): a plain CPython function taking the public function's own
// arguments, positionally,
//   (kind, tensor, output, name, average, op, prescale, postscale, root),
// that does the common case or declines. Right after a large collective has flushed
// the CPU caches, each Python-level lookup and call between the user's call and the
// engine costs microseconds, and so does pybind11's generic argument dispatch; this
// entry does the checks in C with pointers registered once (SetDirectInputs) and
// compares dtypes by identity instead of hashing them. Returns True once the
// collective ran, False having done nothing when the call is not the common case
// (not exactly a NumPy array of a registered dtype, no name, `average` given, an op
// or factor of another type, dropped handles waiting to be reaped, the engine not
// running, an unusable array), or raises HvdliteError if the collective failed.
struct DirectInputs {
  PyTypeObject* ndarray = nullptr;
  std::vector<std::pair<PyObject*, int>> dtypes;  // dtype object -> engine code
  PyObject* orphans = nullptr;                    // the front end's list of dropped handles
  PyObject* dtype_attr = nullptr;                 // interned "dtype"
};
DirectInputs g_direct;

void SetDirectInputs(py::handle ndarray, const std::vector<std::pair<py::object, int>>& dtypes, py::handle orphans) {
  if (!PyType_Check(ndarray.ptr()) || !PyList_Check(orphans.ptr()))
    throw std::invalid_argument("set_direct_inputs takes numpy.ndarray, (dtype, code) pairs and a list");
  DirectInputs d;
  d.ndarray = reinterpret_cast<PyTypeObject*>(ndarray.inc_ref().ptr());
  for (const auto& [dt, code] : dtypes) {
    if (!ValidDataType(code)) throw std::invalid_argument("hvdlite: unknown dtype code " + std::to_string(code));
    d.dtypes.emplace_back(dt.inc_ref().ptr(), code);
  }
  d.orphans = orphans.inc_ref().ptr();
  d.dtype_attr = PyUnicode_InternFromString("dtype");
  g_direct = std::move(d);  // kept for the life of the process, like the module
}

// A double from a float or int argument; false for anything else.
bool PlainDouble(PyObject* o, double* v) {
  if (PyFloat_CheckExact(o)) *v = PyFloat_AS_DOUBLE(o);
  else if (PyLong_CheckExact(o)) *v = PyLong_AsDouble(o);
  else return false;
  return !PyErr_Occurred();
}

PyObject* DirectRun(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 9) {
    PyErr_SetString(PyExc_TypeError, "direct_run takes 9 positional arguments");
    return nullptr;
  }
  PyObject *tensor = args[1], *output = args[2], *name = args[3], *op = args[5];
  const DirectInputs& d = g_direct;
  const long kind = PyLong_AsLong(args[0]);
  if (kind == -1 && PyErr_Occurred()) return nullptr;
  long reduce_op = static_cast<long>(ReduceOp::kAverage), root = -1;
  double prescale = 1.0, postscale = 1.0;
  int code = -1;
  bool usual = d.ndarray && Py_TYPE(tensor) == d.ndarray && (output == tensor || Py_TYPE(output) == d.ndarray) &&
               PyList_GET_SIZE(d.orphans) == 0 && PyUnicode_CheckExact(name) && args[4] == Py_None &&
               PlainDouble(args[6], &prescale) && PlainDouble(args[7], &postscale) && PyLong_CheckExact(args[8]);
  if (usual && op != Py_None) {
    usual = PyLong_CheckExact(op);
    if (usual) reduce_op = PyLong_AsLong(op);
    usual = usual && !PyErr_Occurred() && reduce_op >= 0 && reduce_op <= static_cast<long>(ReduceOp::kProduct) &&
            reduce_op != static_cast<long>(ReduceOp::kAdasum);
  }
  if (usual) {
    root = PyLong_AsLong(args[8]);
    PyObject* dt = PyObject_GetAttr(tensor, d.dtype_attr);
    if (!dt) return nullptr;
    for (const auto& [obj, c] : d.dtypes)
      if (obj == dt) code = c;
    Py_DECREF(dt);
    usual = code >= 0 && !PyErr_Occurred();
  }
  PyErr_Clear();  // a failed conversion above only means "not the usual case"
  if (!usual) Py_RETURN_FALSE;
  Py_ssize_t len = 0;
  const char* chars = PyUnicode_AsUTF8AndSize(name, &len);
  if (!chars) return nullptr;
  return CallGuarded([&]() -> PyObject* {
    return PyBool_FromLong(RunCollective(static_cast<int>(kind), std::string(chars, len), tensor, output, code,
                                         static_cast<int>(reduce_op), prescale, postscale, static_cast<int>(root),
                                         /*decline=*/true));
  });
}

PyMethodDef g_direct_run_def = {"direct_run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&DirectRun)),
                                METH_FASTCALL, "A blocking NumPy collective's common case (see bindings.cc)."};

// Persistent requests: a collective that a front end submits again and again with the
// same name, memory and options (a PyTorch gradient bucket, every step). It is checked
// and built once (persistent_prepare); then each start is one call that queues a copy
// of the built request, and each wait one call that waits for it, orders the consumer
// stream after it and releases the handle. Both are plain CPython functions taking
// and returning objects that exist already (ints, None), so the steady state builds no
// Python object and skips pybind11's argument matching, the name's conversion and the
// front end's handle objects. Guarded by the GIL.
struct Persistent {
  Request request;
  uintptr_t in = 0, out = 0;
  int32_t process_set = 0;
  int64_t handle = 0;               // the start in flight (0: none)
  std::optional<uintptr_t> stream;  // the producer stream it was started after
};
std::vector<std::unique_ptr<Persistent>> g_persistent;  // by id; null: closed

int64_t PersistentPrepare(int type, const std::string& name, uintptr_t in_ptr, uintptr_t out_ptr, int dtype,
                          const std::vector<int64_t>& shape, int device, int reduce_op, double prescale,
                          double postscale, int32_t process_set) {
  if (!ValidDataType(dtype)) throw std::invalid_argument("hvdlite: unknown dtype code " + std::to_string(dtype));
  const RequestType kind = CheckedType(type);
  if (kind != RequestType::kAllreduce && kind != RequestType::kBroadcast)
    throw std::invalid_argument("hvdlite: persistent requests are allreduces or broadcasts");
  for (int64_t d : shape)
    if (d < 0) throw std::invalid_argument("hvdlite: negative dimension in shape of '" + name + "'");
  auto p = std::make_unique<Persistent>();
  p->request.type = kind;
  p->request.name = name;
  p->request.dtype = static_cast<DataType>(dtype);
  p->request.shape = shape;
  p->request.device = device;
  p->request.reduce_op = static_cast<ReduceOp>(reduce_op);
  p->request.prescale = prescale;
  p->request.postscale = postscale;
  p->in = in_ptr;
  p->out = out_ptr;
  p->process_set = process_set;
  for (size_t i = 0; i < g_persistent.size(); ++i)
    if (!g_persistent[i]) {
      g_persistent[i] = std::move(p);
      return static_cast<int64_t>(i);
    }
  g_persistent.push_back(std::move(p));
  return static_cast<int64_t>(g_persistent.size() - 1);
}

// The persistent request `id`, or null if there is none (never made, or closed).
Persistent* FindPersistent(int64_t id) {
  if (id < 0 || static_cast<size_t>(id) >= g_persistent.size()) return nullptr;
  return g_persistent[id].get();
}

// The persistent request the first argument names, or null with a Python error set.
Persistent* PersistentArg(PyObject* const* args, Py_ssize_t nargs, const char* fn) {
  if (nargs != 2) {
    PyErr_Format(PyExc_TypeError, "%s takes 2 positional arguments", fn);
    return nullptr;
  }
  const long id = PyLong_AsLong(args[0]);
  if (id == -1 && PyErr_Occurred()) return nullptr;
  Persistent* p = FindPersistent(id);
  if (!p) PyErr_Format(PyExc_ValueError, "hvdlite: no persistent request %ld", id);
  return p;
}

// An address argument (a pointer or a cudaStream_t as an int); false with a Python
// error set if it is not a non-negative int.
bool AddressArg(PyObject* o, uintptr_t* v) {
  const unsigned long long u = PyLong_AsUnsignedLongLong(o);
  if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return false;
  *v = static_cast<uintptr_t>(u);
  return true;
}

// A stream argument: None, or a cudaStream_t as an int.
bool StreamArg(PyObject* o, std::optional<uintptr_t>* stream) {
  if (o == Py_None) return true;
  uintptr_t v;
  if (!AddressArg(o, &v)) return false;
  *stream = v;
  return true;
}

// persistent_start(id, stream): queue request `id` again, after the work queued on
// `stream` so far (None for host memory). Its previous start must have been waited for.
PyObject* PersistentStart(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Persistent* p = PersistentArg(args, nargs, "persistent_start");
  if (!p) return nullptr;
  std::optional<uintptr_t> stream;
  if (!StreamArg(args[1], &stream)) return nullptr;
  return CallGuarded([&]() -> PyObject* {
    if (p->handle != 0) {
      if (!Handles().Poll(p->handle)) {
        SetHvdliteError("hvdlite: " + RequestLabel(p->request.type, p->request.name) +
                            " was started again before its previous start was waited for",
                        "HvdliteValueError");
        return nullptr;
      }
      Handles().Release(p->handle);
      p->handle = 0;
    }
    p->handle = RunningSet(p->process_set)
                    .Enqueue(Request(p->request), reinterpret_cast<const void*>(p->in), reinterpret_cast<void*>(p->out),
                             /*caller_waits=*/false, stream, /*advance=*/true);
    p->stream = stream;
    Py_RETURN_NONE;
  });
}

// persistent_wait(id, consumer): wait for the last start of `id`, order `consumer`
// (a cudaStream_t, or None) and the stream it was started after behind it, and
// release its handle; raise HvdliteError if it failed. A signal handler's exception
// leaves it in flight for the next wait.
PyObject* PersistentWait(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  Persistent* p = PersistentArg(args, nargs, "persistent_wait");
  if (!p) return nullptr;
  std::optional<uintptr_t> consumer;
  if (!StreamArg(args[1], &consumer)) return nullptr;
  if (p->handle == 0) {
    SetHvdliteError("hvdlite: " + RequestLabel(p->request.type, p->request.name) + " was not started",
                    "HvdliteValueError");
    return nullptr;
  }
  std::vector<uintptr_t> streams;
  if (p->stream) streams.push_back(*p->stream);
  if (consumer && consumer != p->stream) streams.push_back(*consumer);
  return CallGuarded([&]() -> PyObject* {
    std::string error;
    const bool ok = WaitFor(p->handle, /*release=*/true, &error, streams);
    p->handle = 0;
    if (!ok) {
      SetHvdliteError(error);
      return nullptr;
    }
    Py_RETURN_NONE;
  });
}

// Forgets request `id`; returns the handle of a start still in flight (0 if none), which
// the caller keeps the memory alive for until it is done, then releases.
int64_t PersistentClose(int64_t id) {
  Persistent* p = FindPersistent(id);
  if (!p) return 0;
  const int64_t h = p->handle;
  g_persistent[id].reset();
  return h;
}

PyMethodDef g_persistent_start_def = {
    "persistent_start", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&PersistentStart)),
    METH_FASTCALL, "persistent_start(id, stream): queue a persistent request again (see bindings.cc)."};
PyMethodDef g_persistent_wait_def = {
    "persistent_wait", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&PersistentWait)),
    METH_FASTCALL, "persistent_wait(id, consumer): wait for its last start (see bindings.cc)."};

// The request path's three calls, enqueue / poll / wait, made once per collective by
// every front end's asynchronous calls: plain CPython functions with positional
// arguments, as the persistent requests' are. pybind11's generic dispatch (keyword
// matching, a converted std::vector and std::optional per argument, a tuple for the
// result) cost about as much host time as the engine's own work for a small GPU
// collective.

// A long argument; false with a Python error set if it is not an int.
bool LongArg(PyObject* o, long long* v) {
  *v = PyLong_AsLongLong(o);
  return !(*v == -1 && PyErr_Occurred());
}

// Integers from a tuple or list of ints: a shape or alltoall's splits (int64_t), or
// cudaStream_t handles (uintptr_t); false with a Python error set otherwise.
template <typename T>
bool IntList(PyObject* seq, std::vector<T>* out) {
  if (!PyTuple_Check(seq) && !PyList_Check(seq)) {
    PyErr_SetString(PyExc_TypeError, "hvdlite: expected a tuple or list of ints");
    return false;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  PyObject** items = PySequence_Fast_ITEMS(seq);
  out->resize(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if constexpr (std::is_unsigned_v<T>) {
      uintptr_t v;
      if (!AddressArg(items[i], &v)) return false;
      (*out)[i] = static_cast<T>(v);
    } else {
      long long v;
      if (!LongArg(items[i], &v)) return false;
      (*out)[i] = static_cast<T>(v);
    }
  }
  return true;
}

// enqueue(type, name, in_ptr, out_ptr, dtype, shape, device, reduce_op, prescale,
//         postscale, root, splits, group_id, group_size, caller_waits[, stream[, process_set]])
// -> handle: hand one request to the engine (see Enqueue). `stream` is a cudaStream_t
// as an int, or None.
PyObject* EnqueueCall(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 15 || nargs > 17) {
    PyErr_SetString(PyExc_TypeError, "enqueue takes 15 to 17 positional arguments");
    return nullptr;
  }
  long long type, dtype, device, op, root, group_id, group_size, process_set = 0;
  uintptr_t in_ptr, out_ptr;
  if (!LongArg(args[0], &type) || !LongArg(args[4], &dtype) || !LongArg(args[6], &device) ||
      !LongArg(args[7], &op) || !LongArg(args[10], &root) || !LongArg(args[12], &group_id) ||
      !LongArg(args[13], &group_size) || (nargs == 17 && !LongArg(args[16], &process_set)) ||
      !AddressArg(args[2], &in_ptr) || !AddressArg(args[3], &out_ptr))
    return nullptr;
  const double prescale = PyFloat_AsDouble(args[8]), postscale = PyFloat_AsDouble(args[9]);
  if ((prescale == -1.0 || postscale == -1.0) && PyErr_Occurred()) return nullptr;
  const int caller_waits = PyObject_IsTrue(args[14]);
  if (caller_waits < 0) return nullptr;
  std::optional<uintptr_t> stream;
  if (nargs >= 16 && !StreamArg(args[15], &stream)) return nullptr;
  Py_ssize_t len = 0;
  const char* chars = PyUnicode_AsUTF8AndSize(args[1], &len);
  if (!chars) return nullptr;
  std::vector<int64_t> shape, splits;
  if (!IntList(args[5], &shape) || !IntList(args[11], &splits)) return nullptr;
  return CallGuarded([&]() -> PyObject* {
    const int64_t h = Enqueue(static_cast<int>(type), std::string(chars, len), in_ptr, out_ptr,
                              static_cast<int>(dtype), std::move(shape), static_cast<int>(device),
                              static_cast<int>(op), prescale, postscale, static_cast<int>(root), splits,
                              static_cast<int>(group_id), static_cast<int>(group_size), caller_waits != 0, stream,
                              static_cast<int32_t>(process_set));
    return PyLong_FromLongLong(h);
  });
}

// poll(handle) -> bool: whether the request has finished.
PyObject* PollCall(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1) {
    PyErr_SetString(PyExc_TypeError, "poll takes 1 positional argument");
    return nullptr;
  }
  long long h;
  if (!LongArg(args[0], &h)) return nullptr;
  return CallGuarded([&]() -> PyObject* {
    RaiseIfForkedCopy();
    return PyBool_FromLong(Handles().Poll(h));
  });
}

// wait(handle[, release[, streams[, sync_host]]]) -> None, or the error message: waits
// for the request (see WaitFor); `streams`, a tuple or list of cudaStream_t ints.
PyObject* WaitCall(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs < 1 || nargs > 4) {
    PyErr_SetString(PyExc_TypeError, "wait takes 1 to 4 positional arguments");
    return nullptr;
  }
  long long h;
  if (!LongArg(args[0], &h)) return nullptr;
  int release = 0, sync_host = 0;
  if (nargs >= 2 && (release = PyObject_IsTrue(args[1])) < 0) return nullptr;
  if (nargs >= 4 && (sync_host = PyObject_IsTrue(args[3])) < 0) return nullptr;
  std::vector<uintptr_t> streams;
  if (nargs >= 3 && !IntList(args[2], &streams)) return nullptr;
  return CallGuarded([&]() -> PyObject* {
    std::string error;
    if (WaitFor(h, release != 0, &error, streams, sync_host != 0)) Py_RETURN_NONE;
    return PyUnicode_FromStringAndSize(error.data(), static_cast<Py_ssize_t>(error.size()));
  });
}

PyMethodDef g_enqueue_def = {"enqueue", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&EnqueueCall)),
                             METH_FASTCALL, "enqueue(...): hand one request to the engine (see bindings.cc)."};
PyMethodDef g_poll_def = {"poll", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&PollCall)),
                          METH_FASTCALL, "poll(handle): whether the request has finished."};
PyMethodDef g_wait_def = {"wait", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(&WaitCall)),
                          METH_FASTCALL, "wait(handle, release, streams, sync_host): None, or why it failed."};

// The address of a C-contiguous buffer (a NumPy array), much cheaper than building
// its __array_interface__ dict.
uintptr_t Address(py::handle obj) {
  Py_buffer view;
  if (PyObject_GetBuffer(obj.ptr(), &view, PyBUF_ANY_CONTIGUOUS) != 0) throw py::error_already_set();
  const uintptr_t p = reinterpret_cast<uintptr_t>(view.buf);
  PyBuffer_Release(&view);
  return p;
}

// A result in GPU memory, as Python sees it: the memory (freed when the last owner lets
// go, after the work of the streams it was used on), its shape and element type.
struct DeviceResult {
  std::shared_ptr<DeviceAllocation> memory;
  std::vector<int64_t> shape;
  int dtype = 0;
  std::vector<int64_t> aux;
};

// Copies between host and device memory for the NumPy front end's device arrays
// (their get() and from_numpy()), ordered on `stream` and waited for.
void CopyAndWait(void* dst, const void* src, int64_t bytes, int kind, int device, uintptr_t stream) {
  cuda::Runtime& rt = cuda::Runtime::Get();
  py::gil_scoped_release nogil;
  cuda::DeviceGuard guard(rt, device);
  auto s = reinterpret_cast<cuda::Stream>(stream);
  if (bytes > 0) rt.Check(rt.api().MemcpyAsync(dst, src, static_cast<size_t>(bytes), kind, s), "cudaMemcpyAsync");
  rt.Check(rt.api().StreamSynchronize(s), "cudaStreamSynchronize");
}

// What --check-build and hvd.nccl_built() report: whether the CUDA runtime and NCCL
// load here, which versions, from where, or why not. Loads them.
py::dict GpuInfo() {
  py::dict cuda_info, nccl_info, out;
  std::string error;
  cuda::Runtime* rt = cuda::Runtime::TryGet(&error);
  cuda_info["loaded"] = rt != nullptr;
  if (rt) {
    cuda_info["path"] = rt->path();
    cuda_info["runtime_version"] = rt->runtime_version();
    cuda_info["driver_version"] = rt->driver_version();
    cuda_info["device_count"] = rt->device_count();
  } else {
    cuda_info["error"] = error;
  }
  nccl::Library* lib = nccl::Library::TryGet(&error);
  nccl_info["loaded"] = lib != nullptr;
  if (lib) {
    nccl_info["path"] = lib->path();
    nccl_info["version"] = lib->VersionString();
    nccl_info["version_code"] = lib->version();
  } else {
    nccl_info["error"] = error;
  }
  out["cuda"] = cuda_info;
  out["nccl"] = nccl_info;
  return out;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "hvdlite's C++ engine (internal; use hvdlite, hvdlite.torch or hvdlite.tensorflow)";

  py::class_<OutputBuffer>(m, "OutputBuffer", py::buffer_protocol())
      .def_buffer([](OutputBuffer& b) -> py::buffer_info {
        return py::buffer_info(b.data.get(), 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(b.bytes)}, {static_cast<py::ssize_t>(1)});
      })
      .def("__len__", [](const OutputBuffer& b) { return b.bytes; });

  // The engine's codes, so that no front end keeps its own copy of them: element types
  // and request kinds by their engine names, reduce ops by Horovod's names.
  py::dict data_types, reduce_ops, request_types;
  for (int c = 0; c < kNumDataTypes; ++c) data_types[DataTypeName(static_cast<DataType>(c))] = c;
  for (int c = 0; c <= static_cast<int>(ReduceOp::kProduct); ++c)
    reduce_ops[ReduceOpName(static_cast<ReduceOp>(c))] = c;
  for (int c = 0; c <= static_cast<int>(RequestType::kJoin); ++c)
    request_types[RequestTypeName(static_cast<RequestType>(c))] = c;
  m.attr("DATA_TYPES") = data_types;
  m.attr("REDUCE_OPS") = reduce_ops;
  m.attr("REQUEST_TYPES") = request_types;
  m.attr("CPU_DEVICE") = kCpuDevice;

  // The engine's C interface (c_api.h) for libraries built apart from this module
  // (hvdlite's TensorFlow kernels): the address of its table of functions.
  static const HvdliteCoreApi* c_api = InstallCoreApi(CoreAccess{
      [](int32_t id, std::string* why) { return TheWorld().SetEngineForC(id, why); }, &Handles(),
      [] { return ForkedCopy() ? TheWorld().ForkedMessage() : std::string(); }});
  m.def("c_api_address", [] { return reinterpret_cast<uintptr_t>(c_api); });

  m.def("shutdown", &Shutdown);
  m.def("finalize", &Finalize);
  pthread_atfork(nullptr, nullptr, [] { TheWorld().MarkForked(); });
  // The world's own failures are hvdlite's errors in Python.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const WorldError& ex) {
      SetHvdliteError(ex.what());
    }
  });

  m.def("init", [](uintptr_t comm_handle, const std::vector<int>& ranks) { TheWorld().Init(comm_handle, ranks); },
        py::arg("comm_handle") = 0, py::arg("ranks") = std::vector<int>{});
  m.def("rebuild", [] { TheWorld().Rebuild(); });
  m.def("lost_ranks", [] { return TheWorld().lost_ranks(); });
  m.def("dismiss", [](std::vector<int> leaving) {
    std::sort(leaving.begin(), leaving.end());
    return TheWorld().Dismiss(leaving);
  }, py::arg("leaving"));
  m.def("start_suspension_watch", &StartSuspensionWatch, py::arg("limit_s"), py::arg("failure_timeout"));
  m.def("agree", [](int value) { return TheWorld().Agree(value); }, py::arg("value"));
  m.def("grow",
        [](const std::string& command, const std::vector<std::string>& args, const std::vector<std::string>& hosts,
           const std::string& wdir, bool oversubscribe) { TheWorld().Grow(command, args, hosts, wdir, oversubscribe); },
        py::arg("command"), py::arg("args"), py::arg("hosts"), py::arg("wdir") = std::string(),
        py::arg("oversubscribe") = false);
  m.def("joined", [] { return TheWorld().joined(); });
  m.def("peer_failed", [] { return TheWorld().current() && TheWorld().current()->PeerFailed(); });
  m.def("stalled_ranks", [] { return TheWorld().current() ? TheWorld().current()->StalledRanks() : std::vector<int>(); });
  m.def("is_initialized",
        [] { return TheWorld().current() && !TheWorld().forked() && TheWorld().current()->Running(); });
  m.def("has_world", [] { return TheWorld().current() != nullptr; });
  m.def("shutdown_reason", [] { return TheWorld().current() ? TheWorld().current()->ShutdownReason() : std::string(); });
  m.def("stopped_by_failure", [] { return TheWorld().current() && TheWorld().current()->StoppedByFailure(); });
  // Non-empty in a process forked from an initialized one: why it cannot run collectives.
  m.def("forked_reason", [] { return ForkedCopy() ? TheWorld().ForkedMessage() : std::string(); });
  m.def("rank", [] { return Known().rank(); });
  m.def("size", [] { return Known().size(); });
  m.def("local_rank", [] { return Known().topology().local_rank(); });
  m.def("local_size", [] { return Known().topology().local_size(); });
  m.def("cross_rank", [] { return Known().topology().cross_rank(); });
  m.def("cross_size", [] { return Known().topology().cross_size(); });
  m.def("is_homogeneous", [] { return Known().topology().homogeneous(); });
  m.def("mpi_threads_supported", [] { return TheWorld().mpi_threads_supported(); });
  m.def("stats", [](int32_t process_set) {
    std::shared_ptr<Engine> set_engine;
    if (process_set != 0) {
      std::string why;
      set_engine = TheWorld().SetEngineForC(process_set, &why);
      if (!set_engine) throw std::invalid_argument(why);
    }
    const Engine::Stats s = set_engine ? set_engine->GetStats() : Known().GetStats();
    py::dict d;
    d["requests_in_full"] = s.requests_in_full;
    d["requests_as_ids"] = s.requests_as_ids;
    d["cycles"] = s.cycles;
    d["carried"] = s.carried;
    d["control_bytes_sent"] = s.control_bytes_sent;
    d["control_bytes_received"] = s.control_bytes_received;
    d["waits_driven"] = s.waits_driven;
    d["waits_handed_back"] = s.waits_handed_back;
    d["submits_advanced"] = s.submits_advanced;
    d["huge_page_extents"] = s.huge_page_extents;
    d["device_collectives"] = s.device_collectives;
    d["tunables_applied"] = s.tunables_applied;
    d["fusion_threshold_bytes"] = s.tunables.fusion_threshold_bytes;
    d["cycle_time_ms"] = s.tunables.cycle_time_ms;
    d["response_cache"] = s.tunables.cache_enabled != 0;
    d["hierarchical_allreduce"] = s.tunables.hierarchical;
    return d;
  }, py::arg("process_set") = 0);
  m.add_object("enqueue", py::reinterpret_steal<py::object>(PyCFunction_New(&g_enqueue_def, nullptr)));
  m.def("refuse", &Refuse, py::arg("type"), py::arg("name"), py::arg("message"), py::arg("group_id") = -1,
        py::arg("group_size") = 0, py::arg("process_set") = 0);
  m.def("add_process_set", [](const std::vector<int>& ranks) { return TheWorld().AddProcessSet(ranks); },
        py::arg("ranks"));
  m.def("remove_process_set", [](int32_t id) { return TheWorld().RemoveProcessSet(id); }, py::arg("process_set"));
  // Every registered set's world ranks by id, the global set (0) included.
  m.def("process_sets", [] { return TheWorld().ProcessSets(); });
  m.add_object("poll", py::reinterpret_steal<py::object>(PyCFunction_New(&g_poll_def, nullptr)));
  m.add_object("wait", py::reinterpret_steal<py::object>(PyCFunction_New(&g_wait_def, nullptr)));
  m.def("run", [](int type, const std::string& name, py::handle in, py::handle out, int dtype, int reduce_op,
                  double prescale, double postscale, int root, int32_t process_set) {
    RunCollective(type, name, in, out, dtype, reduce_op, prescale, postscale, root, /*decline=*/false, process_set);
  }, py::arg("type"), py::arg("name"), py::arg("in"), py::arg("out"), py::arg("dtype"), py::arg("reduce_op"),
        py::arg("prescale"), py::arg("postscale"), py::arg("root"), py::arg("process_set") = 0);
  m.def("persistent_prepare", &PersistentPrepare, py::arg("type"), py::arg("name"), py::arg("in_ptr"),
        py::arg("out_ptr"), py::arg("dtype"), py::arg("shape"), py::arg("device"), py::arg("reduce_op"),
        py::arg("prescale"), py::arg("postscale"), py::arg("process_set") = 0);
  m.add_object("persistent_start",
               py::reinterpret_steal<py::object>(PyCFunction_New(&g_persistent_start_def, nullptr)));
  m.add_object("persistent_wait",
               py::reinterpret_steal<py::object>(PyCFunction_New(&g_persistent_wait_def, nullptr)));
  m.def("persistent_close", &PersistentClose, py::arg("id"));
  m.def("persistent_done", [](int64_t id) {
    const Persistent* p = FindPersistent(id);
    return !p || p->handle == 0 || Handles().Poll(p->handle);
  }, py::arg("id"));
  m.def("set_direct_inputs", &SetDirectInputs);
  m.add_object("direct_run", py::reinterpret_steal<py::object>(PyCFunction_New(&g_direct_run_def, nullptr)));
  m.def("address", &Address);
  m.def("take_output", [](int64_t h) {
    std::unique_ptr<OutputBuffer> out = Handles().TakeOutput(h);
    std::vector<int64_t> shape = out->shape;
    std::vector<int64_t> aux = out->aux;
    int dtype = static_cast<int>(out->dtype);
    if (out->device_data) {  // a GPU result
      DeviceResult r{out->device_data, shape, dtype, aux};
      return py::make_tuple(py::cast(std::move(r)), shape, dtype, aux);
    }
    return py::make_tuple(py::cast(std::move(out)), shape, dtype, aux);
  });
  m.def("release", [](int64_t h) { Handles().Release(h); });
  py::class_<DeviceResult>(m, "DeviceResult")
      .def_property_readonly("ptr", [](const DeviceResult& r) { return reinterpret_cast<uintptr_t>(r.memory->data()); })
      .def_property_readonly("nbytes", [](const DeviceResult& r) { return r.memory->bytes(); })
      .def_property_readonly("device", [](const DeviceResult& r) { return r.memory->device(); })
      .def_property_readonly("stream", [](const DeviceResult& r) { return r.memory->stream(); })
      .def_property_readonly("shape", [](const DeviceResult& r) { return r.shape; })
      .def_property_readonly("dtype", [](const DeviceResult& r) { return r.dtype; })
      .def("used_on", [](DeviceResult& r, uintptr_t stream) { r.memory->UsedOn(stream); })
      .def("to_dlpack", [](const DeviceResult& r, const std::vector<int64_t>& shape, int dtype) {
        if (!ValidDataType(dtype)) throw std::invalid_argument("hvdlite: unknown dtype code " + std::to_string(dtype));
        PyObject* capsule = ToDlpack(r.memory, shape, static_cast<DataType>(dtype));
        if (!capsule) throw py::error_already_set();
        return py::reinterpret_steal<py::object>(capsule);
      });
  m.def("allocate_device", [](int device, int64_t nbytes, const std::vector<int64_t>& shape, int dtype) {
    DeviceResult r{Running().AllocateDevice(device, nbytes), shape, dtype, {}};
    return r;
  });
  m.def("copy_on_device", [](int device, uintptr_t dst, uintptr_t src, int64_t nbytes, std::optional<uintptr_t> after) {
    Running().CopyOnDevice(device, reinterpret_cast<void*>(dst), reinterpret_cast<const void*>(src), nbytes, after);
  }, py::arg("device"), py::arg("dst"), py::arg("src"), py::arg("nbytes"), py::arg("after") = py::none());
  m.def("copy_device_to_host", [](uintptr_t src, py::buffer dst, int device, uintptr_t stream) {
    py::buffer_info info = dst.request(true);
    CopyAndWait(info.ptr, reinterpret_cast<const void*>(src), info.size * info.itemsize, cuda::kDeviceToHost, device,
                stream);
  });
  m.def("copy_host_to_device", [](py::buffer src, uintptr_t dst, int device, uintptr_t stream) {
    py::buffer_info info = src.request();
    CopyAndWait(reinterpret_cast<void*>(dst), info.ptr, info.size * info.itemsize, cuda::kHostToDevice, device,
                stream);
  });
  m.def("device_of_pointer", [](uintptr_t ptr) {
    std::string why;
    const int d = cuda::Runtime::Get().DeviceOf(reinterpret_cast<const void*>(ptr), &why);
    if (d < 0) throw std::invalid_argument(why);
    return d;
  });
  // `consumer` (a cudaStream_t of `device`) waits for the work queued on `producer` so
  // far; the host does not wait.
  m.def("order_stream_after", [](int device, uintptr_t consumer, uintptr_t producer) {
    cuda::Runtime& rt = cuda::Runtime::Get();
    cuda::DeviceGuard guard(rt, device);
    auto events = std::make_shared<cuda::EventPool>(rt, device);
    events->Record(reinterpret_cast<cuda::Stream>(producer))->OrderBefore(consumer);
  });
  // What a DLPack capsule describes: (address, shape, NumPy type string, C-contiguous).
  m.def("dlpack_describe", [](py::capsule capsule) {
    const char* name = capsule.name();
    if (!name || std::string(name) != "dltensor") throw std::invalid_argument("not an unconsumed DLPack capsule");
    auto* t = static_cast<dlpack::ManagedTensor*>(capsule.get_pointer());
    const dlpack::Tensor& d = t->dl_tensor;
    std::vector<int64_t> shape(d.shape, d.shape + d.ndim);
    bool contiguous = true;
    if (d.strides) {
      int64_t expect = 1;
      for (int i = d.ndim - 1; i >= 0; --i) {
        if (shape[i] > 1 && d.strides[i] != expect) contiguous = false;
        expect *= shape[i];
      }
    }
    if (d.dtype.lanes != 1) throw std::invalid_argument("vector DLPack types (lanes > 1) are not supported");
    std::string kind = d.dtype.code == dlpack::kInt ? "i" : d.dtype.code == dlpack::kUInt ? "u"
                     : d.dtype.code == dlpack::kFloat ? "f" : d.dtype.code == dlpack::kBfloat ? "bfloat" : "?";
    std::string typestr = kind == "bfloat" ? std::string("bfloat16") : "<" + kind + std::to_string(d.dtype.bits / 8);
    const uintptr_t ptr = reinterpret_cast<uintptr_t>(d.data) + d.byte_offset;
    return py::make_tuple(ptr, shape, typestr, contiguous);
  });
  m.def("set_library_search_folders", &SetLibrarySearchFolders);
  m.def("gpu_info", &GpuInfo);
  // Whether ncclGetUniqueId works here (it needs no GPU): the loader test's check that
  // the table of functions matches the library.
  m.def("nccl_unique_id_works", [] {
    std::string error;
    nccl::Library* lib = nccl::Library::TryGet(&error);
    if (!lib) throw std::runtime_error(error);
    nccl::UniqueId id{};
    return lib->api().GetUniqueId(&id) == nccl::kSuccess;
  });

  m.def("start_timeline", [](const std::string& path, bool mark_cycles) {
    std::string error;
    if (!Running().StartTimeline(path, mark_cycles, &error)) throw std::runtime_error(error);
  });
  m.def("stop_timeline", [] { Running().StopTimeline(); });
}
