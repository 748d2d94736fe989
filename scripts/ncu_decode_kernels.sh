#!/usr/bin/env bash
# Nsight Compute's full set for single decode-step kernels of the V2-Lite-shape bench (batch 1, a
# 600-token context), one profiled launch per kernel name; the reports go to $OUT/ncu_<name>.txt and
# a digest (duration, cycles, issue stalls) to stdout. Run on the device after unpacking the carried
# binaries (scripts/device_tests.sh does that; here BIN defaults to /tmp/di_dev/cudabin).
#   scripts/ncu_decode_kernels.sh ["regex1" "regex2" ...]   (demangled names; defaults below)
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-/tmp/di_dev/cudabin}"
if [ ! -x "$BIN/bench_cuda_decode" ]; then
  mkdir -p /tmp/di_dev && tar xJf .carry/cudapack/bin.tar.xz -C /tmp/di_dev && BIN=/tmp/di_dev/cudabin
fi
export LD_LIBRARY_PATH="$BIN:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
LOG="${OUT:-./device-logs}"
mkdir -p "$LOG"
# ncu writes template arguments as "(int)1"
[ $# -gt 0 ] || set -- "mla_attn_kernel<.int.1, .int.1>" "moe_gate_kernel" "skinny_kernel<.int.1, .int.1>" \
  "moe_down_combine_kernel" "grouped_gemv_kernel<.int.1, .int.1>" "skinny_kn_kernel<.int.1>"
for k in "$@"; do
  f="$LOG/ncu${NCU_TAG:-}_$(echo "$k" | tr -c 'a-zA-Z0-9_\n' '_').txt"
  env DEEPINFER_CUDA_GRAPHS=0 timeout 120 ncu --clock-control none --cache-control none --set full \
    --kernel-name-base demangled -k "regex:$k" --launch-skip 3 --launch-count 1 \
    "$BIN/bench_cuda_decode" bench/configs/v2-lite.json --batches 1 --gen 8 --prompt 600 --prefill 0 >"$f" 2>&1
  echo "=== $k"
  grep -E "^  void|^  [a-z_]+kernel|Duration|Elapsed Cycles|SM Active Cycles|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Issued Ipc Active|DRAM Throughput|L2 Hit Rate  " "$f" | head -14
  grep -E "Est. Speedup|stall|Stall" "$f" | grep -iv "^ *-" | head -8
done
