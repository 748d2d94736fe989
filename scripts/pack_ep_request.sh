#!/usr/bin/env bash
# Packs what a device request of the several-rank GPU checks needs (issue 21; issue 28 reuses it):
#   scripts/pack_ep_request.sh BUILD_DIR OUT_DIR
# BUILD_DIR: a CUDA build with MPI (and NCCL), e.g. `cmake -S . -B build-cuda -DDI_CUDA=ON` with
# libopenmpi-dev installed, target deepinfer_cli. Writes OUT_DIR/bin.tar.xz (cudabin/: deepinfer
# stripped, the cJSON and PCRE2 libraries, and a stub libmicrohttpd, scripts/mhd_stub.c: the real one
# and its GnuTLS chain would not fit the 6 MB cap, and the checks never serve HTTP), OUT_DIR/ompi.tar.xz
# (scripts/pack_openmpi.sh) and the check scripts. On the device:
#   tar xJf bin.tar.xz -C /tmp/x && tar xJf ompi.tar.xz -C /tmp/x && . /tmp/x/ompi/env.sh
#   LD_LIBRARY_PATH=/tmp/x/cudabin:/usr/local/cuda/lib64:$LD_LIBRARY_PATH tests/cuda/ep_multi_rank_check.sh DIR
# (DIR holding `deepinfer`, e.g. a link to /tmp/x/cudabin/deepinfer).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:?usage: pack_ep_request.sh BUILD_DIR OUT_DIR}
OUT=${2:?usage: pack_ep_request.sh BUILD_DIR OUT_DIR}
mkdir -p "$OUT"
T=$(mktemp -d)
mkdir -p "$T/cudabin"
strip -o "$T/cudabin/deepinfer" "$BUILD/deepinfer"
for lib in $(ldd "$BUILD/deepinfer" | awk '/=> \// {print $3}' | grep -E 'libcjson|libpcre2'); do cp -L "$lib" "$T/cudabin/"; done
gcc -shared -fPIC -O2 -Wl,-soname,libmicrohttpd.so.12 -o "$T/cudabin/libmicrohttpd.so.12" scripts/mhd_stub.c
tar cf - -C "$T" cudabin | xz -9e >"$OUT/bin.tar.xz"
scripts/pack_openmpi.sh "$OUT/ompi.tar.xz" >/dev/null
cp tests/cuda/ep_multi_rank_check.sh tests/cuda/ep_nccl_check.sh "$OUT/"
rm -rf "$T"
du -sh "$OUT"/*
