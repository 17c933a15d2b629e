"""A buffer allreduced again and again ends up on 2 MiB pages, with its values intact.

The buffer is a private anonymous mapping of its own (so /proc/self/smaps describes
exactly it), written before the first allreduce with ordinary 4 KiB pages. After three
in-place allreduces it should be backed by huge pages (see hvdlite/csrc/backends/mpi/host_memory.h),
unless HVDLITE_HUGE_PAGES=0 or the kernel cannot collapse pages, which this job finds
out on a scratch mapping of its own first. Prints one HUGEPAGES line per rank."""
import ctypes
import mmap
import os

import numpy as np

import hvdlite as hvd
from hvdlite.common import basics

EXTENT = 2 << 20
MADV_COLLAPSE = 25

libc = ctypes.CDLL(None, use_errno=True)
libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def aligned_mapping(nbytes: int) -> tuple[mmap.mmap, np.ndarray]:
    """A private anonymous mapping with a 2 MiB aligned, writable uint8 view of nbytes."""
    m = mmap.mmap(-1, nbytes + EXTENT, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(m, np.uint8)
    off = (-raw.ctypes.data) % EXTENT
    return m, raw[off:off + nbytes]


def anon_huge_kib(address: int) -> int:
    """AnonHugePages of the mapping that contains `address`."""
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= address < hi
            elif inside and head == "AnonHugePages:":
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {address:#x}")


def kernel_can_collapse() -> bool:
    m, view = aligned_mapping(EXTENT)
    view[:] = 1
    ok = libc.madvise(view.ctypes.data, EXTENT, MADV_COLLAPSE) == 0
    del view
    m.close()
    return ok


hvd.init()
rank, size = hvd.rank(), hvd.size()
can = kernel_can_collapse()
enabled = os.environ.get("HVDLITE_HUGE_PAGES", "1") not in ("0", "false", "no", "off")

count = EXTENT  # float32 elements: 8 MiB, four extents
mapping, raw = aligned_mapping(count * 4)
x = raw.view(np.float32)
before = anon_huge_kib(x.ctypes.data)
for step in range(3):
    x[:] = np.arange(count, dtype=np.float32) % 1000 + rank
    hvd.allreduce_(x, op=hvd.Sum, name="hugepages.grad")
    want = (np.arange(count, dtype=np.float32) % 1000) * size + size * (size - 1) / 2
    assert np.array_equal(x, want), f"step {step}: wrong sum"
after = anon_huge_kib(x.ctypes.data)
extents = basics.core().stats()["huge_page_extents"]
print(f"HUGEPAGES rank {rank} can={int(can)} enabled={int(enabled)} extents={extents} "
      f"before_kib={before} after_kib={after}", flush=True)
del x, raw
hvd.shutdown()
print(f"ALL CHECKS PASSED rank {rank}", flush=True)
