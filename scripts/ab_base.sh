#!/usr/bin/env bash
# Batch-1 A/B on the device against a baseline build, one process per run, alternating:
#   (here) scripts/ab_base.sh --build-base REV: bench_cuda_decode of commit REV (a worktree in
#   /tmp/di_base_wt, its own build-cuda/), stripped and xz-packed into .carry/basepack/bench_base.xz;
#   and scripts/device_tests.sh --build for the current tree.
#   (device, carry .carry/cudapack and .carry/basepack) scripts/ab_base.sh
# VARIANTS: space-separated runs; "base" is the baseline binary, anything else VAR=value[+VAR=value]
# for the current build; either may end in :ARGS (extra bench arguments, "," for spaces:
# base:--feedback, DEEPINFER_CUDA_GPU_TIME=1:--feedback). REPS (2). SKIP_TESTS=1 skips the kernel /
# model / engine tests first. AB_GREP: the bench output lines kept (default "^1 ", the batch-1 decode
# line; with AB_ARGS="--batches 1,64 --prefill 512,4096", AB_GREP="^(1|64|512|4096) " keeps the
# prefill lines too).
set -u
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--build-base" ]; then
  set -e
  rev="${2:?usage: --build-base REV}"
  wt=/tmp/di_base_wt
  git worktree remove --force "$wt" 2>/dev/null || rm -rf "$wt"
  git worktree add -f --detach "$wt" "$rev" >/dev/null
  export PATH="/usr/local/cuda/bin:$PATH"
  cmake -S "$wt" -B "$wt/build-cuda" -DDI_CUDA=ON -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$wt/build-cuda" -j "${JOBS:-2}" --target bench_cuda_decode >/dev/null
  mkdir -p .carry/basepack
  strip -o /tmp/di_bench_base "$wt/build-cuda/bench_cuda_decode"
  xz -c /tmp/di_bench_base >.carry/basepack/bench_base.xz
  ls -la .carry/basepack
  exit 0
fi
rm -rf /tmp/di_ab && mkdir -p /tmp/di_ab && tar xJf .carry/cudapack/bin.tar.xz -C /tmp/di_ab
B=/tmp/di_ab/cudabin
[ "${SKIP_TESTS:-0}" = 1 ] || SKIP_BENCH=1 SKIP_PROFILE=1 SKIP_SWEEP=1 SKIP_NCU=1 SKIP_PDL_AB=1 \
  scripts/device_tests.sh "$B" 2>&1 | grep -E "^=== |passed|PASS|FAIL"
[ -f .carry/basepack/bench_base.xz ] && xz -dc .carry/basepack/bench_base.xz >/tmp/di_ab/bench_base && chmod +x /tmp/di_ab/bench_base
export LD_LIBRARY_PATH=$B:/usr/local/cuda/lib64
for rep in $(seq "${REPS:-2}"); do
  for v in ${VARIANTS:-base DEEPINFER_CUDA_X=new}; do
    bin=$B/bench_cuda_decode args=""
    case "$v" in *:*) args="${v#*:}"; args="${args//,/ }"; v="${v%%:*}" ;; esac
    [ "$v" = base ] && { bin=/tmp/di_ab/bench_base; v=DEEPINFER_CUDA_X=base; }
    # shellcheck disable=SC2086
    r=$(env ${v//+/ } "$bin" bench/configs/v2-lite.json --batches 1 --prefill 0 ${AB_ARGS:-} $args 2>&1 | grep -E "${AB_GREP:-^1 }" | tr '\n' ';')
    echo "$v $args: $r"
  done
done
