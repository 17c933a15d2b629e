#include "backends/mpi/mpi_backend.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "backends/layout.h"
#include "backends/mpi/reduce_ops.h"
#include "common/logging.h"

namespace hvdlite {

MpiBackend::MpiBackend(const Topology& topology, const Config* config)
    : config_(config),
      params_(config->job()),
      mpi_(topology.world(), params_.ring_min_segment_bytes),
      huge_pages_(params_.huge_pages),
      rank_(topology.rank()),
      size_(topology.size()),
      adasum_(topology.world()) {
  InitReduceOps();  // MPI's handles for hvdlite's own types and ops, once per process
  const bool several_hosts = topology.cross_size() > 1 && topology.local_size() > 1;
  if (several_hosts && topology.homogeneous()) {
    local_ = std::make_unique<MpiCollectives>(topology.local(), params_.ring_min_segment_bytes);
    cross_ = std::make_unique<MpiCollectives>(topology.cross(), params_.ring_min_segment_bytes);
    hierarchical_ = std::make_unique<HierarchicalAllreduce>(
        local_.get(), cross_.get(),
        params_.two_level.algorithm == 1 ? TwoLevelSchedule::kLeader : TwoLevelSchedule::kTorus);
    hierarchical_gather_ = std::make_unique<HierarchicalAllgather>(topology, local_.get(), cross_.get());
  } else if (several_hosts && rank_ == 0) {
    if (params_.two_level.allreduce == 1)
      HVD_WARN("HOROVOD_HIERARCHICAL_ALLREDUCE=1 is ignored: the hosts run different numbers of ranks, "
               "and the two-level allreduce needs the same number on every host; allreduces stay flat");
    if (params_.two_level.allgather == 1)
      HVD_WARN("HOROVOD_HIERARCHICAL_ALLGATHER=1 is ignored: the hosts run different numbers of ranks, "
               "and the two-level allgather needs the same number on every host; allgathers stay flat");
  }
}

namespace {

// A two-level setting (1 always, 0 never, -1 default) applied to a message of `bytes`:
// by default two-level from `threshold` on.
bool TwoLevel(int32_t mode, int64_t bytes, int64_t threshold) { return mode == 1 || (mode < 0 && bytes >= threshold); }

}  // namespace

// Two-level where the hosts allow it and it is asked for, or by default from 64 KiB on.
// On emulated hosts (docs/scale.md: 2 x 2, 2 x 4 and 4 x 2 ranks, 1 and 10 Gbit/s) it was
// as fast as flat or faster from 64 KiB to 256 MiB, up to 3x at 1 MiB on 4 x 2 ranks,
// except by 5-7 % on 2 x 4 ranks sharing 2 cores; at 4 KiB either won by turns.
// Every rank decides alike: from the count, the type, rank 0's settings and the topology.
bool MpiBackend::Hierarchical(int64_t count, int64_t element_bytes) const {
  return hierarchical_ && TwoLevel(config_->tunables().hierarchical, count * element_bytes, kHierarchicalMinBytes);
}

void MpiBackend::AllreduceRange(const void* src, void* dst, int64_t count, DataType dt, ReduceOp op,
                                double postscale) {
  if (Hierarchical(count, DataTypeSize(dt)))
    hierarchical_->Run(src, dst, count, dt, op, postscale,
                       std::max<int64_t>(1, params_.hierarchical_chunk_bytes / DataTypeSize(dt)));
  else mpi_.Allreduce(src, dst, count, dt, op, postscale);
}

// Two-level where the hosts allow it and it is asked for, or by default from 256 KiB of
// gathered bytes on. On emulated hosts (docs/scale.md: 2 x 2, 2 x 4 and 4 x 2 ranks,
// 1 Gbit/s) it took 0.27-0.59 of the flat time from 256 KiB to 64 MiB, but 1.06-1.2 at
// 4-64 KiB on 2 x 4 and 4 x 2 ranks, whose hosts need more calls inside them.
// `total` comes from the response, so every rank decides alike.
bool MpiBackend::HierarchicalGather(int64_t total) const {
  return hierarchical_gather_ && TwoLevel(params_.two_level.allgather, total, kHierarchicalGatherMinBytes);
}

bool MpiBackend::Supports(const Response& r, std::string* why_not) const {
  if (KindOfDevice(r.device) != DeviceKind::kHost) {
    *why_not = "the MPI backend takes host memory";
    return false;
  }
  return true;
}

FusionLimits MpiBackend::Fusion() const {
  FusionLimits f;
  f.allreduce_bytes = config_->tunables().fusion_threshold_bytes;
  // Small allgathers are packed with memcpy: only while the copies stay in cache.
  f.allgather_tensor_bytes = params_.fusion_direct_bytes;
  f.allgather_bytes = std::min(config_->tunables().fusion_threshold_bytes, params_.host_chunk_bytes);
  f.reducescatter_bytes = config_->tunables().fusion_threshold_bytes;
  return f;
}

std::unique_ptr<Completion> MpiBackend::Run(CollectiveJob& job) {
  switch (job.response.type) {
    case RequestType::kAllreduce:
      Allreduce(job);
      break;
    case RequestType::kAllgather:
      Allgather(job);
      break;
    case RequestType::kBroadcast:
      Broadcast(job);
      break;
    case RequestType::kAlltoall:
      Alltoall(job);
      break;
    case RequestType::kReducescatter:
      Reducescatter(job);
      break;
    default:
      throw std::runtime_error(std::string("the MPI backend has no ") + RequestTypeName(job.response.type));
  }
  return nullptr;  // MPI's calls have finished
}

double MpiBackend::PostFactor(const Response& r) const {
  return hvdlite::PostFactor(r.postscale, r.reduce_op, size_);
}

// A fused allreduce on host memory. Tensors too big to share a piece are reduced
// straight from their own memory (no copy) in cache-sized chunks; small ones are
// packed into a cache-sized piece of the fusion buffer, reduced there, and copied out
// while the piece is still in cache. Ranks that joined contribute zeros.
void MpiBackend::Allreduce(CollectiveJob& job) {
  if (job.response.reduce_op == ReduceOp::kAdasum) return AdasumTensors(job);
  const Response& r = job.response;
  std::vector<TensorEntry>& entries = job.entries;
  const std::vector<char>& have = job.have;
  const size_t n = r.names.size();
  const DataType dt = r.dtype;
  const int64_t es = DataTypeSize(dt);
  const double pre = r.prescale;
  const double post = PostFactor(r);
  const ReduceOp op = r.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r.reduce_op;
  const int64_t chunk_bytes = std::max<int64_t>(es, params_.host_chunk_bytes);
  const int64_t chunk_elems = std::max<int64_t>(1, chunk_bytes / es);
  const bool trace = job.trace.Active();

  // Plan: a list of steps, each either one tensor alone or a piece of several.
  struct Step {
    std::vector<size_t> members;
  };
  std::vector<Step> plan;
  Step piece;
  int64_t piece_elems = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t cnt = r.sizes[i];
    if (cnt == 0) continue;
    if (n == 1 || cnt * es >= std::min(params_.fusion_direct_bytes, chunk_bytes / 2)) {
      plan.push_back(Step{{i}});
      continue;
    }
    if (piece_elems + cnt > chunk_elems) {
      plan.push_back(std::move(piece));
      piece = Step{};
      piece_elems = 0;
    }
    piece.members.push_back(i);
    piece_elems += cnt;
  }
  if (!piece.members.empty()) plan.push_back(std::move(piece));

  for (const Step& step : plan) {
    if (step.members.size() == 1) {
      const size_t i = step.members[0];
      const int64_t cnt = r.sizes[i];
      const int64_t t0 = NowMicros();
      if (have[i]) {
        huge_pages_.Prepare(entries[i].input, cnt * es);
        if (entries[i].output != entries[i].input) huge_pages_.Prepare(entries[i].output, cnt * es);
      }
      if (Hierarchical(cnt, es)) {  // the whole tensor at once: the algorithm cuts its own pieces
        const void* src = entries[i].input;
        void* dst = entries[i].output;
        if (!have[i]) {  // zeros, through the same steps as every other rank's data
          dst = scratch_.Get(cnt * es);
          std::memset(dst, 0, static_cast<size_t>(cnt * es));
          src = dst;
        } else if (pre != 1.0) {
          ScaleCopy(dst, src, cnt, dt, pre);
          src = dst;
        }
        AllreduceRange(src, dst, cnt, dt, op, post);
        if (trace && have[i]) job.trace.Phase(r.names[i], hierarchical_->PhaseName(), t0, NowMicros());
        continue;
      }
      for (int64_t off = 0; off < cnt; off += chunk_elems) {
        const int64_t c = std::min(chunk_elems, cnt - off);
        if (!have[i]) {
          uint8_t* z = scratch_.Get(c * es);
          std::memset(z, 0, static_cast<size_t>(c * es));
          // The same factor as every other rank: a backend may scale on any rank's behalf.
          AllreduceRange(z, z, c, dt, op, post);
          continue;
        }
        const uint8_t* src = static_cast<const uint8_t*>(entries[i].input) + off * es;
        uint8_t* dst = static_cast<uint8_t*>(entries[i].output) + off * es;
        if (pre != 1.0) {
          ScaleCopy(dst, src, c, dt, pre);
          src = dst;
        }
        AllreduceRange(src, dst, c, dt, op, post);
      }
      if (trace && have[i]) job.trace.Phase(r.names[i], "MPI_ALLREDUCE", t0, NowMicros());
      continue;
    }
    // Pack, reduce, unpack one piece.
    int64_t total = 0;
    for (size_t i : step.members) total += r.sizes[i];
    uint8_t* buf = fusion_.Get(chunk_bytes);
    int64_t off = 0;
    std::vector<int64_t> copy_in_end(step.members.size());
    const int64_t t_in = NowMicros();
    for (size_t k = 0; k < step.members.size(); ++k) {
      const size_t i = step.members[k];
      const int64_t c = r.sizes[i];
      if (!have[i]) std::memset(buf + off * es, 0, static_cast<size_t>(c * es));
      else if (pre != 1.0) ScaleCopy(buf + off * es, entries[i].input, c, dt, pre);
      else std::memcpy(buf + off * es, entries[i].input, static_cast<size_t>(c * es));
      off += c;
      if (trace) copy_in_end[k] = NowMicros();
    }
    const int64_t t_mpi = NowMicros();
    huge_pages_.Prepare(buf, total * es);
    AllreduceRange(buf, buf, total, dt, op, 1.0);  // scaled as it is copied out
    const int64_t t_out = NowMicros();
    off = 0;
    for (size_t k = 0; k < step.members.size(); ++k) {
      const size_t i = step.members[k];
      const int64_t c = r.sizes[i];
      const int64_t s = trace ? NowMicros() : 0;
      if (have[i]) {
        if (post != 1.0) ScaleCopy(entries[i].output, buf + off * es, c, dt, post);
        else std::memcpy(entries[i].output, buf + off * es, static_cast<size_t>(c * es));
        if (trace) {
          job.trace.Phase(r.names[i], "MEMCPY_IN_FUSION_BUFFER", k ? copy_in_end[k - 1] : t_in, copy_in_end[k]);
          job.trace.Phase(r.names[i], Hierarchical(total, es) ? hierarchical_->PhaseName() : "MPI_ALLREDUCE",
                          t_mpi, t_out);
          job.trace.Phase(r.names[i], "MEMCPY_OUT_FUSION_BUFFER", s, NowMicros());
        }
      }
      off += c;
    }
  }
}

// An allgather of one tensor or of several fused ones. One tensor is gathered straight
// from its own memory into its output. Several are packed, rank by rank, into one block
// per rank: this rank copies its tensors into the fusion buffer, one MPI_Allgatherv
// moves every block, and each output is cut from the blocks of all ranks. The
// coordinator fuses only small tensors (Fusion()), so the copies stay in cache.
// Across hosts the blocks may be gathered in two levels (hierarchical_allgather.h),
// which lays them out host after host: the same as the world's order unless mpirun
// placed the ranks otherwise, in which case they are gathered into scratch memory and
// put in rank order from there.
void MpiBackend::Allgather(CollectiveJob& job) {
  const Response& r = job.response;
  std::vector<TensorEntry>& entries = job.entries;
  const size_t n = r.names.size();
  for (size_t i = 0; i < n; ++i)  // every rank submitted it before rank 0 answered
    if (!job.have[i]) throw std::runtime_error("allgather '" + r.names[i] + "' is not queued on this rank");
  const int64_t t0 = NowMicros();
  const GatherLayout g = PlanAllgather(r, entries, size_);
  job.outputs.resize(n);
  for (size_t i = 0; i < n; ++i) {
    auto out = std::make_unique<OutputBuffer>();
    out->bytes = g.OutputBytes(i);
    out->data.reset(new uint8_t[std::max<int64_t>(1, out->bytes)]);
    out->dtype = entries[i].request.dtype;
    out->shape = g.OutputShape(i, entries[i].request.shape);
    job.outputs[i] = std::move(out);
  }
  const bool trace = job.trace.Active();
  const bool two_level = g.total > 0 && HierarchicalGather(g.total);
  const char* phase = two_level ? "MPI_HIERARCHICAL_ALLGATHER" : "MPI_ALLGATHER";
  if (n == 1) {
    uint8_t* dst = job.outputs[0]->data.get();
    if (!two_level) {
      if (g.total > 0) mpi_.Allgatherv(entries[0].input, g.block[rank_], dst, g.block);
    } else if (hierarchical_gather_->WorldOrder()) {
      hierarchical_gather_->Run(entries[0].input, dst, g.block, params_.hierarchical_chunk_bytes);
    } else {
      uint8_t* tmp = scratch_.Get(g.total);
      hierarchical_gather_->Run(entries[0].input, tmp, g.block, params_.hierarchical_chunk_bytes);
      const std::vector<int64_t> at = hierarchical_gather_->Offsets(g.block);
      for (int q = 0; q < size_; ++q)
        std::memcpy(dst + g.block_offset[q], tmp + at[q], static_cast<size_t>(g.block[q]));
    }
    if (trace) job.trace.Phase(r.names[0], phase, t0, NowMicros());
    return;
  }
  if (g.total == 0) return;
  // Where each rank's block lies in the packed result.
  std::vector<int64_t> at = two_level ? hierarchical_gather_->Offsets(g.block) : g.block_offset;
  uint8_t* buf = fusion_.Get(g.total + (two_level ? 0 : g.block[rank_]));
  // Flat, this rank's block is packed after the result and gathered from there; two-level,
  // it is packed where it belongs and gathered in place.
  uint8_t* mine = two_level ? buf + at[rank_] : buf + g.total;
  int64_t off = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t bytes = g.Bytes(i, rank_);
    std::memcpy(mine + off, entries[i].input, static_cast<size_t>(bytes));
    off += bytes;
  }
  const int64_t t_mpi = NowMicros();
  if (two_level) hierarchical_gather_->Run(nullptr, buf, g.block, params_.hierarchical_chunk_bytes);
  else mpi_.Allgatherv(mine, g.block[rank_], buf, g.block);
  const int64_t t_out = NowMicros();
  for (size_t i = 0; i < n; ++i) {
    uint8_t* dst = job.outputs[i]->data.get();
    for (int q = 0; q < size_; ++q) {
      const int64_t bytes = g.Bytes(i, q);
      std::memcpy(dst, buf + at[q], static_cast<size_t>(bytes));
      dst += bytes;
      at[q] += bytes;
    }
  }
  if (trace) {
    const int64_t t_end = NowMicros();
    for (size_t i = 0; i < n; ++i) {
      job.trace.Phase(r.names[i], "MEMCPY_IN_FUSION_BUFFER", t0, t_mpi);
      job.trace.Phase(r.names[i], phase, t_mpi, t_out);
      job.trace.Phase(r.names[i], "MEMCPY_OUT_FUSION_BUFFER", t_out, t_end);
    }
  }
}

void MpiBackend::Broadcast(CollectiveJob& job) {
  if (!job.have[0]) return;
  const Response& r = job.response;
  TensorEntry& e = job.entries[0];
  const int64_t t0 = NowMicros();
  void* buf = e.output ? e.output : const_cast<void*>(e.input);
  const int64_t bytes = r.sizes[0] * DataTypeSize(r.dtype);
  if (bytes > 0) mpi_.Broadcast(buf, bytes, r.root);
  if (job.trace.Active()) job.trace.Phase(r.names[0], "MPI_BCAST", t0, NowMicros());
}

void MpiBackend::Alltoall(CollectiveJob& job) {
  if (!job.have[0]) return;
  const Response& r = job.response;
  TensorEntry& e = job.entries[0];
  const int64_t t0 = NowMicros();
  const AlltoallLayout a = PlanAlltoall(r, e, rank_, size_);
  auto out = std::make_unique<OutputBuffer>();
  out->data.reset(new uint8_t[std::max<int64_t>(1, a.total_recv)]);
  out->bytes = a.total_recv;
  out->dtype = r.dtype;
  out->shape = a.output_shape;
  out->aux = a.received_rows;
  // Every rank runs the collective unless nobody moves any data.
  if (a.moves_data) mpi_.Alltoallv(e.input, a.send_bytes, out->data.get(), a.recv_bytes);
  if (job.trace.Active()) job.trace.Phase(r.names[0], "MPI_ALLTOALL", t0, NowMicros());
  job.outputs.resize(1);
  job.outputs[0] = std::move(out);
}

void MpiBackend::AdasumTensors(CollectiveJob& job) {
  const Response& r = job.response;
  const DataType dt = r.dtype;
  const int64_t es = DataTypeSize(dt);
  for (size_t i = 0; i < r.names.size(); ++i) {
    const int64_t cnt = r.sizes[i];
    const int64_t t0 = NowMicros();
    TensorEntry& e = job.entries[i];
    void* buf = job.have[i] ? e.output : scratch_.Get(cnt * es);
    if (!job.have[i]) std::memset(buf, 0, static_cast<size_t>(cnt * es));  // a joined rank: zeros
    else if (r.prescale != 1.0) ScaleCopy(buf, e.input, cnt, dt, r.prescale);
    else if (buf != e.input) std::memcpy(buf, e.input, static_cast<size_t>(cnt * es));
    adasum_.Run(buf, cnt, dt);
    ScaleBuffer(buf, cnt, dt, r.postscale);
    if (job.trace.Active() && job.have[i]) job.trace.Phase(r.names[i], "ADASUM", t0, NowMicros());
  }
}

void MpiBackend::Reducescatter(CollectiveJob& job) {
  if (job.response.names.size() > 1) return FusedReducescatter(job);
  if (!job.have[0]) return;
  const Response& r = job.response;
  TensorEntry& e = job.entries[0];
  const int64_t t0 = NowMicros();
  const DataType dt = r.dtype;
  const int64_t es = DataTypeSize(dt);
  const ScatterLayout s = PlanReducescatter(e.request.shape, rank_, size_);
  auto out = std::make_unique<OutputBuffer>();
  const int64_t my = s.counts[rank_];
  out->data.reset(new uint8_t[std::max<int64_t>(1, my * es)]);
  out->bytes = my * es;
  out->dtype = dt;
  out->shape = s.output_shape;
  if (s.total > 0) {
    const void* src = e.input;
    if (r.prescale != 1.0) {
      uint8_t* tmp = scratch_.Get(s.total * es);
      ScaleCopy(tmp, e.input, s.total, dt, r.prescale);
      src = tmp;
    }
    if (r.reduce_op == ReduceOp::kAdasum) {  // the whole Adasum, of which this rank keeps its share
      uint8_t* all = scratch_.Get(s.total * es);
      if (src != all) std::memcpy(all, src, static_cast<size_t>(s.total * es));
      adasum_.Run(all, s.total, dt);
      std::memcpy(out->data.get(), all + s.offset[rank_] * es, static_cast<size_t>(my * es));
      ScaleBuffer(out->data.get(), my, dt, r.postscale);
      if (job.trace.Active()) job.trace.Phase(r.names[0], "ADASUM", t0, NowMicros());
      job.outputs.resize(1);
      job.outputs[0] = std::move(out);
      return;
    }
    const ReduceOp op = r.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r.reduce_op;
    mpi_.ReduceScatter(src, out->data.get(), s.counts, dt, op);
    const double post = PostFactor(r);
    ScaleBuffer(out->data.get(), my, dt, post);
  }
  if (job.trace.Active()) job.trace.Phase(r.names[0], "MPI_REDUCESCATTER", t0, NowMicros());
  job.outputs.resize(1);
  job.outputs[0] = std::move(out);
}

// Several reducescatters reduced and scaled alike (never Adasum), as one: every rank's
// share of every tensor is packed rank by rank, so that one reduce-scatter hands each
// rank its shares of all of them in a row, which are then unpacked into one output each.
void MpiBackend::FusedReducescatter(CollectiveJob& job) {
  const Response& r = job.response;
  const size_t n = r.names.size();
  const DataType dt = r.dtype;
  const int64_t es = DataTypeSize(dt);
  const int64_t t0 = NowMicros();
  std::vector<ScatterLayout> layouts;
  layouts.reserve(n);
  std::vector<int64_t> counts(static_cast<size_t>(size_), 0);  // elements each rank receives
  for (size_t i = 0; i < n; ++i) {
    layouts.push_back(PlanReducescatter(job.entries[i].request.shape, rank_, size_));
    for (int q = 0; q < size_; ++q) counts[q] += layouts[i].counts[q];
  }
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::unique_ptr<uint8_t[]> packed(new uint8_t[std::max<int64_t>(1, total * es)]);
  int64_t at = 0;
  for (int q = 0; q < size_; ++q)
    for (size_t i = 0; i < n; ++i) {
      const int64_t c = layouts[i].counts[q];
      if (c > 0)
        std::memcpy(packed.get() + at * es, static_cast<const uint8_t*>(job.entries[i].input) + layouts[i].offset[q] * es,
                    static_cast<size_t>(c * es));
      at += c;
    }
  if (r.prescale != 1.0) ScaleBuffer(packed.get(), total, dt, r.prescale);
  const int64_t t_packed = NowMicros();
  const int64_t mine = counts[rank_];
  std::unique_ptr<uint8_t[]> received(new uint8_t[std::max<int64_t>(1, mine * es)]);
  if (total > 0) {
    const ReduceOp op = r.reduce_op == ReduceOp::kAverage ? ReduceOp::kSum : r.reduce_op;
    mpi_.ReduceScatter(packed.get(), received.get(), counts, dt, op);
  }
  const double post = PostFactor(r);
  const int64_t t_reduced = NowMicros();
  job.outputs.resize(n);
  at = 0;
  for (size_t i = 0; i < n; ++i) {
    const int64_t my = layouts[i].counts[rank_];
    auto out = std::make_unique<OutputBuffer>();
    out->data.reset(new uint8_t[std::max<int64_t>(1, my * es)]);
    out->bytes = my * es;
    out->dtype = dt;
    out->shape = layouts[i].output_shape;
    if (post != 1.0) ScaleCopy(out->data.get(), received.get() + at * es, my, dt, post);
    else if (my > 0) std::memcpy(out->data.get(), received.get() + at * es, static_cast<size_t>(my * es));
    at += my;
    job.outputs[i] = std::move(out);
  }
  if (job.trace.Active())
    for (size_t i = 0; i < n; ++i) {
      job.trace.Phase(r.names[i], "MEMCPY_IN_FUSION_BUFFER", t0, t_packed);
      job.trace.Phase(r.names[i], "MPI_REDUCESCATTER", t_packed, t_reduced);
      job.trace.Phase(r.names[i], "MEMCPY_OUT_FUSION_BUFFER", t_reduced, NowMicros());
    }
}

}  // namespace hvdlite
