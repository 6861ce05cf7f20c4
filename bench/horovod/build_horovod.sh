#!/usr/bin/env bash
# Build Horovod 0.28.1 (PyTorch + gloo, CPU only) into a venv OUTSIDE the repository.
#
# Horovod 0.28.1 is the last release; its CMake asks for C++14, which torch >= 2.1 headers reject.
# So: download the registry's sdist, switch CMAKE_CXX_STANDARD 14 -> 17 in the two CMakeLists.txt,
# and build it against the torch already in the venv (--no-build-isolation).
#
# Usage: bench/horovod/build_horovod.sh [VENV]     (default $HVD_VENV); HOROVOD_SDIST=path skips the download
# Afterwards: VENV/bin/horovodrun --check-build    (PyTorch [X], Gloo [X])
set -euo pipefail
VENV=${1:-${HVD_VENV:?usage: build_horovod.sh VENV (a new venv folder, e.g. /opt/hvd)}}
TORCH=${TORCH_VERSION:-2.13.0}
HVD=${HOROVOD_VERSION:-0.28.1}
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)

python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip
"$VENV/bin/pip" install --quiet "torch==$TORCH" numpy cmake packaging psutil pyyaml cloudpickle wheel setuptools
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
if [ -n "${HOROVOD_SDIST:-}" ]; then cp "$HOROVOD_SDIST" "$WORK/"   # an sdist already at hand
else "$VENV/bin/pip" download --quiet --no-deps --no-binary :all: "horovod==$HVD" -d "$WORK"; fi
tar -xzf "$WORK"/horovod-"$HVD".tar.gz -C "$WORK"
SRC="$WORK/horovod-$HVD"
sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/; s/-std=c++14/-std=c++17/g' \
    "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"
grep -n "CXX_STANDARD\|c++1" "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt" || true
HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_TENSORFLOW=1 \
HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo MAKEFLAGS="-j${BUILD_JOBS:-2}" \
    "$VENV/bin/pip" install --no-build-isolation --no-cache-dir -v "$SRC" > "$WORK/build.log" 2>&1 \
    || { tail -60 "$WORK/build.log"; exit 1; }
# dagprof itself (the reader, the passes, `dagprof profile`) into the same venv, editable.
"$VENV/bin/pip" install --quiet -e "$REPO"
"$VENV/bin/horovodrun" --check-build
