#!/usr/bin/env bash
# The Pareto sweep anyone can rerun: `deepinfer serve` as users run it (one server for the whole sweep,
# its KV pool sized for the largest point), a decode sweep (aggregate output tok/s against per-user
# tok/s over --concurrency) and a prefill sweep (prefill tok/s against time to first token over
# --prompt-lens x --prefill-batches); CSV, JSON (machine, commit, settings) and two PNG plots in --out,
# other engines' points in the same plots (--compare URL, --llama-batched-bench FILE). bench/sweep.py
# does the work (python3 bench/sweep.py --help for every flag); PYTHON names the interpreter (default
# python3; the plots need bench/requirements.txt there).
#
#   bench/run_sweep.sh [BUILD_DIR] [--model DIR|CONFIG.json] [--accelerator cpu|cuda] [--load-format auto|dummy]
#       [--prompt-len 128] [--output-len 128] [--concurrency 1,2,...,512] [--prompt-lens 128,512,2048,8192]
#       [--out DIR] [--compare [LABEL=]URL] [--in-process] [more bench/sweep.py flags]
#   bench/run_sweep.sh [BUILD_DIR] --host-bench     the engine's host-scheduling micro-benchmarks instead
#
# Environment (the older interface, still read; flags win): MODEL, ACCEL, LOAD, CONCURRENCY, PROMPT_LEN,
# OUTPUT_LEN, PROMPT_LENS, COMPARE, PARETO_OUT (the --out folder), SLEEP_MS (--host-bench).
# BUILD_DIR (default build/) holds the deepinfer executable and libdeepinfer.so.
# The plots need matplotlib: pip install -r bench/requirements.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then BUILD="$1"; shift; fi
host_bench=0
args=()
for a in "$@"; do
  if [ "$a" = "--host-bench" ]; then host_bench=1; else args+=("$a"); fi
done

if [ "$host_bench" = 1 ]; then
  B="$BUILD/bench_engine"
  [ -x "$B" ] || { echo "run_sweep: $B not built (cmake --build $BUILD --target bench_engine)" >&2; exit 2; }
  echo "# $(date -u +%FT%TZ) $(git rev-parse --short HEAD 2>/dev/null) $(nproc) cores"
  for seqs in 64 256; do
    for vocab in 1024 129280; do "$B" host "$seqs" "$vocab" "${SLEEP_MS:-5}"; done
  done
  "$B" prefix tests/data/models/dsv3-tiny 32 1024
  if [ -n "${MODEL:-}" ]; then
    for seqs in 64 256; do
      "$B" model "$MODEL" "${LOAD:-auto}" "${ACCEL:-cpu}" "$seqs" 128
      DEEPINFER_HOST_SAMPLING=1 "$B" model "$MODEL" "${LOAD:-auto}" "${ACCEL:-cpu}" "$seqs" 128
    done
  fi
  exit 0
fi

env_args=()
[ -n "${MODEL:-}" ] && env_args+=(--model "$MODEL")
[ -n "${ACCEL:-}" ] && env_args+=(--accelerator "$ACCEL")
[ -n "${LOAD:-}" ] && env_args+=(--load-format "$LOAD")
[ -n "${CONCURRENCY:-}" ] && env_args+=(--concurrency "$CONCURRENCY")
[ -n "${PROMPT_LEN:-}" ] && env_args+=(--prompt-len "$PROMPT_LEN")
[ -n "${OUTPUT_LEN:-}" ] && env_args+=(--output-len "$OUTPUT_LEN")
[ -n "${PROMPT_LENS:-}" ] && env_args+=(--prompt-lens "$PROMPT_LENS")
[ -n "${COMPARE:-}" ] && env_args+=(--compare "$COMPARE")
[ -n "${PARETO_OUT:-}" ] && env_args+=(--out "$PARETO_OUT")
[ -x "$BUILD/deepinfer" ] || { echo "run_sweep: $BUILD/deepinfer not built (./build.sh, or give BUILD_DIR)" >&2; exit 2; }
export DEEPINFER_LIB="${DEEPINFER_LIB:-$BUILD/libdeepinfer.so}"
# env first, flags after: argparse keeps the last value of a flag given twice
exec "${PYTHON:-python3}" bench/sweep.py --deepinfer "$BUILD/deepinfer" "${env_args[@]}" "${args[@]}"
