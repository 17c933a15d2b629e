// Huge pages for the host buffers the data plane hands to MPI as they are.
//
// Between processes of one host, MPI copies a large message in one step through the
// kernel (CMA, process_vm_readv): the kernel pins the sender's pages one by one and
// copies through the TLB. With 4 KiB pages that pinning and the TLB misses cost as much
// as the copy itself: a 2-rank allreduce of the 38 MB of an MLP's gradients took
// 5.1-5.2 ms with 4 KiB pages and 3.3-3.5 ms with 2 MiB pages (docs/architecture.md).
//
// Buffers come from the framework's allocator (TensorFlow's gradients, PyTorch's .grad,
// NumPy arrays), so hvdlite cannot choose how they are mapped; it can ask the kernel to
// back them with huge pages after the fact (madvise MADV_COLLAPSE, Linux 6.1+). That
// changes no byte of the buffer, only how its memory is mapped, as an RDMA library's
// memory registration changes the flags of the pages it registers. It is done for the
// whole 2 MiB extents a buffer overlaps, once per extent (a few tries if a page is busy),
// and only for an extent seen in a second allreduce: training reuses the same gradient
// buffers every step, and a buffer used once would not repay the collapse (a copy of
// 2 MiB).
#pragma once

#include <atomic>
#include <cstdint>
#include <unordered_map>

namespace hvdlite {

class HugePages {
 public:
  static constexpr int64_t kExtent = 2 << 20;
  // Buffers smaller than this are left alone: most of each extent would be other memory.
  static constexpr int64_t kMinBytes = 1 << 20;

  explicit HugePages(bool enabled);
  // Called for a buffer about to be sent or received as it is. Cheap once every extent
  // of the buffer has been handled (a hash lookup per extent).
  void Prepare(const void* p, int64_t bytes);
  // Extents remapped so far; read by other threads (stats).
  int64_t collapsed() const { return collapsed_.load(std::memory_order_relaxed); }

 private:
  // Per extent: how many times it was seen, up to kDone (collapsed, or given up on).
  static constexpr uint8_t kDone = 8;
  bool enabled_;
  std::unordered_map<uintptr_t, uint8_t> extents_;
  std::atomic<int64_t> collapsed_{0};
};

}  // namespace hvdlite
