#!/usr/bin/env bash
# `deepinfer serve` against the engine alone on the device machine (issue 24's benchmark): the
# DeepSeek-V2-Lite shape (bench/configs/v2-lite.json, dummy weights) with a tokenizer (DeepSeek-V3's:
# its 129,280 ids are the config's vocabulary), on the CUDA backend.
#
#   bench/bench_serve_device.sh BIN_DIR LABEL [serve] [engine]     (repo root; default: both)
#
# BIN_DIR holds `deepinfer` (and `bench_engine` for "engine"); results go to $OUT/LABEL (default
# ./device-logs/LABEL).
#   serve:  bench/sweep.py's decode sweep through the server as users start it: prompt 128 + output
#           128 tokens, streamed, CONCURRENCY (default 1,4,16,64,256) clients x ROUNDS (2) requests
#           each, 8 client processes (one Python client is the bottleneck at 256 streams); per point
#           aggregate and per-user tok/s, TTFT and TPOT p50 / p99 (decode.csv, sweep.json).
#   engine: bench_engine model ... SEQS 128 for SEQS in ENGINE_SEQS (default 256): pure decode once
#           every prompt is in (no HTTP, no tokenizer, no prefill), async scheduling off and on.
# Each step runs under `timeout` (SWEEP_TIMEOUT, default 40 s; ENGINE_TIMEOUT, 25 s) so one hang does
# not take a whole device call; the sweep saves after every point, so a cut run keeps its points.
# The tokenizer is read from TOKENIZER_XZ (default tests/data/tokenizers/deepseek-v3/tokenizer.json.xz);
# CONFIG (default bench/configs/v2-lite.json) and ACCEL (cuda) let the script be tried on a small model
# on the CPU (MODEL_DIR: where the model folder is made, default /tmp/di-v2lite-tok).
set -uo pipefail
cd "$(dirname "$0")/.."
BIN="$1"
LABEL="$2"
shift 2
WHAT="${*:-serve engine}"
OUT="${OUT:-./device-logs}/$LABEL"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$BIN:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
MODEL="${MODEL_DIR:-/tmp/di-v2lite-tok}"
if [ ! -f "$MODEL/tokenizer.json" ]; then
  mkdir -p "$MODEL"
  cp "${CONFIG:-bench/configs/v2-lite.json}" "$MODEL/config.json" || exit 2
  xz -dc "${TOKENIZER_XZ:-tests/data/tokenizers/deepseek-v3/tokenizer.json.xz}" > "$MODEL/tokenizer.json" || exit 2
fi
echo "# $LABEL $(date -u +%T): $WHAT, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null)"
case " $WHAT " in *" serve "*)
  timeout -k 10 "${SWEEP_TIMEOUT:-40}" python3 bench/sweep.py --deepinfer "$BIN/deepinfer" --model "$MODEL" \
    --load-format dummy --accelerator "${ACCEL:-cuda}" --prompt-len 128 --output-len 128 \
    --concurrency "${CONCURRENCY:-1,4,16,64,256}" --rounds "${ROUNDS:-2}" --prompt-lens "" --client-procs 8 \
    --no-plots --out "$OUT" > "$OUT/sweep.log" 2>&1
  echo "# $LABEL serve: exit $? at $(date -u +%T)"
  cat "$OUT/decode.csv" 2>/dev/null
  grep -o '"startup_s": [0-9.]*' "$OUT/sweep.json" 2>/dev/null
  tail -n 5 "$OUT/sweep.log" ;;
esac
case " $WHAT " in *" engine "*)
  for seqs in ${ENGINE_SEQS:-256}; do
    timeout -k 5 "${ENGINE_TIMEOUT:-25}" "$BIN/bench_engine" model "$MODEL" dummy "${ACCEL:-cuda}" "$seqs" 128 2>&1 | tee "$OUT/engine_$seqs.log"
    echo "# $LABEL engine $seqs: exit ${PIPESTATUS[0]} at $(date -u +%T)"
  done ;;
esac
