#!/usr/bin/env bash
# Engine benchmark sweep (not a test): host scheduling time per step and the share the async overlap
# hides, against a backend that only sleeps, for several batch sizes and vocabularies; the prefix-cache
# speedup on a shared-system-prompt workload; optionally the engine over a real model/backend.
#   bench/run_sweep.sh [BUILD_DIR]            (default build/)
#   MODEL=DIR ACCEL=cuda LOAD=dummy bench/run_sweep.sh build-cuda    also: the engine on that model
# Results go to stdout; record them in docs/PERFORMANCE.md with the commit and the machine.
set -euo pipefail
cd "$(dirname "$0")/.."
B="${1:-build}/bench_engine"
[ -x "$B" ] || { echo "run_sweep: $B not built (cmake --build ${1:-build} --target bench_engine)" >&2; exit 2; }
echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) $(nproc) cores"
for seqs in 64 256; do
  for vocab in 1024 129280; do
    "$B" host "$seqs" "$vocab" "${SLEEP_MS:-5}"
  done
done
"$B" prefix tests/data/models/dsv3-tiny 32 1024
if [ -n "${MODEL:-}" ]; then
  for seqs in 64 256; do
    "$B" model "$MODEL" "${LOAD:-auto}" "${ACCEL:-cpu}" "$seqs" 128
    DEEPINFER_HOST_SAMPLING=1 "$B" model "$MODEL" "${LOAD:-auto}" "${ACCEL:-cpu}" "$seqs" 128
  done
fi
# Throughput/latency Pareto sweep over concurrency (CSV + SVG plot): set PARETO_OUT=dir
if [ -n "${PARETO_OUT:-}" ]; then
  DEEPINFER_LIB="${1:-build}/libdeepinfer.so" python3 bench/sweep_pareto.py \
    --model "${MODEL:-models/default}" --load-format "${LOAD:-auto}" ${ACCEL:+--accelerator "$ACCEL"} \
    --concurrency "${CONCURRENCY:-1,2,4,8,16,32,64}" --out "$PARETO_OUT"
fi
