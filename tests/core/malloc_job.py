"""Memory that a thread frees between steps stays with the process.

A thread (like TensorFlow's executor, which allocates a step's gradients) allocates
81 MB in 3 MB blocks, writes them and frees them, six times. That spans two of its
malloc arena's 64 MiB heaps. Prints the minor page faults of each round; after the
first round they should be near zero (see TuneHostAllocator in hvdlite/csrc/engine/engine.cc)."""
import ctypes
import resource
import threading

import hvdlite as hvd

BLOCK, COUNT, ROUNDS = 3 << 20, 27, 6

hvd.init()
rank = hvd.rank()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.malloc.argtypes = [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
faults: list[int] = []


def steps() -> None:
    for i in range(ROUNDS):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        blocks = [libc.malloc(BLOCK) for _ in range(COUNT)]
        assert all(blocks), "malloc failed"
        for b in blocks:
            ctypes.memset(b, 1, BLOCK)
        for b in blocks:
            libc.free(b)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)


t = threading.Thread(target=steps)
t.start()
t.join()
hvd.barrier()
print(f"FAULTS rank {rank} {faults}", flush=True)
hvd.shutdown()
print(f"ALL CHECKS PASSED rank {rank}", flush=True)
