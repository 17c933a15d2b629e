#!/usr/bin/env bash
# Builds the fake CUDA runtime and fake NCCL:  build.sh OUTDIR
#   OUTDIR/libcudart.so  (soname libcudart.so)
#   OUTDIR/libnccl.so    (soname libnccl.so; needs the libcudart.so beside it, rpath $ORIGIN)
# Plain g++, no CUDA or NCCL headers. Skips the build when both libraries are newer than
# the sources. CXX overrides the compiler.
set -euo pipefail

if [ "$#" -ne 1 ]; then
    echo "usage: $0 OUTDIR" >&2
    exit 2
fi

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cxx="${CXX:-g++}"
if ! command -v "$cxx" >/dev/null 2>&1; then
    echo "build.sh: C++ compiler '$cxx' not found" >&2
    exit 1
fi
mkdir -p "$1" || { echo "build.sh: cannot create $1" >&2; exit 1; }
out="$(cd "$1" && pwd)"

sources=("$here/fake_common.h" "$here/fake_cudart.cc" "$here/fake_nccl.cc" "$here/build.sh")
up_to_date=1
for lib in "$out/libcudart.so" "$out/libnccl.so"; do
    [ -f "$lib" ] || { up_to_date=0; break; }
    for src in "${sources[@]}"; do
        [ "$lib" -nt "$src" ] || { up_to_date=0; break 2; }
    done
done
[ "$up_to_date" = 1 ] && exit 0

flags=(-std=c++17 -O2 -fPIC -shared -pthread -fvisibility=hidden -ffp-contract=off
       -Wall -Wextra -Wl,--no-undefined -Wl,-z,nodelete)
tmp="$(mktemp -d "$out/.build.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
# Export only the API (cuda*/nccl*), not the C++ library's inline template instances.
printf '{ global: cuda*; nccl*; local: *; };\n' > "$tmp/exports.map"
flags+=("-Wl,--version-script=$tmp/exports.map")

# Each library is built under a temporary name and renamed into place, so a concurrent
# reader never sees a half-written file. libnccl links against the fake libcudart by path:
# its DT_NEEDED is the soname, found through rpath $ORIGIN, so loading both gives one
# runtime (one set of streams).
if ! "$cxx" "${flags[@]}" -Wl,-soname,libcudart.so -o "$tmp/libcudart.so" \
        "$here/fake_cudart.cc" -lrt; then
    echo "build.sh: building libcudart.so failed" >&2
    exit 1
fi
mv -f "$tmp/libcudart.so" "$out/libcudart.so"
if ! "$cxx" "${flags[@]}" -Wl,-soname,libnccl.so -o "$tmp/libnccl.so" \
        "$here/fake_nccl.cc" "$out/libcudart.so" -Wl,--disable-new-dtags -Wl,-rpath,'$ORIGIN' -lrt; then
    echo "build.sh: building libnccl.so failed" >&2
    exit 1
fi
mv -f "$tmp/libnccl.so" "$out/libnccl.so"
