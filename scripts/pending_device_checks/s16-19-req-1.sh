#!/bin/bash
# s16-19 req-1: the invariant mode's down + combine fusion (DEEPINFER_CUDA_INV_DOWN_COMBINE) and prep + absorption
# fusion (DEEPINFER_CUDA_INV_PREP_ABSORB): bits and speed.
# (session 16; queued as /work/devq/s16-19-req-1 and not run: the device never started for the helpers.) Run from the
# tree root with BIN = binaries built by `scripts/device_tests.sh --build` after the s16-19 merge (test_cuda_tc_gemm,
# test_cuda_invariance, test_cuda_engine, bench_cuda_decode are all in its target list; their .so files beside them),
# LOG set; MAINBIN optional (a pre-merge main: the in-process `invariant` mode, both switches off, already runs
# main's kernels). No model needed (the models/default load failures of the two tests are the packing).
set -u
T0=$SECONDS
S=$LOG/summary.txt
left() { local r=$((${S16_19_LIMIT:-136} - (SECONDS - T0))); [ $r -lt $1 ] && echo $r || echo $1; }
export LD_LIBRARY_PATH="$BIN:${MAINBIN:-/nonexistent}:${LD_LIBRARY_PATH:-}"
{ echo "device: $(nvidia-smi --query-gpu=name --format=csv,noheader 2>&1 | head -1)"; echo "MAINBIN=${MAINBIN:-unset}"; } | tee "$S"
ldd "$BIN/test_cuda_tc_gemm" | grep 'not found' | tee -a "$S"
step() { # name, cap seconds, command...
  local name="$1" cap="$2"; shift 2
  local t; t=$(left "$cap")
  if [ "$t" -lt 5 ]; then echo "$name: SKIPPED (budget)" | tee -a "$S"; return; fi
  local s=$SECONDS
  timeout "$t" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  echo "$name: rc $rc in $((SECONDS - s)) s (limit $t): $(grep -E 'passed|failed|FAIL' "$LOG/$name.log" | tail -1)" | tee -a "$S"
}
# 1. kernel level: y, h, xn of the fused form == grouped GEMM + moe_combine bit for bit (T 1..16, 33; norm on / off);
#    Qa + cache of the prep + absorption == mla_prep + tc GEMM (T 1..16, [N][K] / [K][N], bf16 / fp8 cache)
step tc_fusions 30 "$BIN/test_cuda_tc_gemm" --fusions-only
grep -E 'NO$|FAIL' "$LOG/tc_fusions.log" | head -5 | tee -a "$S"
# 2. model level: invariance with the fused forms at small steps (down + combine <= 4 tokens, prep + absorption
#    <= 16) and the unfused kernels above (so the batch-composition / chunk / verify equalities compare fused rows
#    against unfused ones)
step invariance_dc4 30 env DEEPINFER_CUDA_INV_DOWN_COMBINE=4 DEEPINFER_CUDA_INV_PREP_ABSORB=1 "$BIN/test_cuda_invariance"
# 3. A/B, one process: default / invariant (fusions off: main's kernels, their PTX unchanged) / invariant-dcpa (both
#    fusions on), 3 alternating reps, + per-phase profile
step bench_s16_19 60 "$BIN/bench_cuda_decode" bench/configs/v2-lite.json --modes default,invariant,invariant-dcpa \
  --batches 1,4,16 --gen 32 --prefill 0 --reps 3 --profile
grep -E '/ default' "$LOG/bench_s16_19.log" | tee -a "$S"
# 5. the engine's batch-invariant 16/16 with the fused form on every step it takes (models/default absent: its
#    load failures are the packing, not the change)
step engine_dc 45 env DEEPINFER_CUDA_INV_DOWN_COMBINE=256 DEEPINFER_CUDA_INV_PREP_ABSORB=1 "$BIN/test_cuda_engine" --invariant-only
grep -E 'FAIL' "$LOG/engine_dc.log" | grep -v 'models/default' | head -5 | tee -a "$S"
grep -E 'FAIL' "$LOG/invariance_dc4.log" | grep -v 'models/default' | head -5 | tee -a "$S"
# 4. if time is left: main's binary, the same bench without the new mode (the baseline across binaries)
if [ -n "${MAINBIN:-}" ] && [ -x "$MAINBIN/bench_cuda_decode" ] && [ "$(left 30)" -ge 25 ]; then
  step bench_main 30 "$MAINBIN/bench_cuda_decode" bench/configs/v2-lite.json --modes default,invariant \
    --batches 1,4,16 --gen 32 --prefill 0 --reps 3
  grep -E '/ default' "$LOG/bench_main.log" | tee -a "$S"
fi
echo "total $((SECONDS - T0)) s" | tee -a "$S"
tail -c 1400 "$S"
