#!/bin/sh
# One-GPU check of the CUDA backend's expert parallel (issue 21; for the device machine, not CI):
# `DEEPINFER_ACCELERATOR=cuda mpirun -np 1 deepinfer score --enable-expert-parallel` initialises the NCCL
# communicator (unique id over MPI) and sends every routed-expert row through the NCCL exchange to
# itself. Its logits must match the plain single-GPU path within bf16 tolerance (rel L2 < 2e-2: the
# expert-parallel form runs the shared experts unfolded and the experts as grouped GEMMs, so not
# bit for bit), with the same argmax at every position whose margin exceeds 0.1, on the V2/V3
# fixtures. Usage:
#   tests/cuda/ep_nccl_check.sh [BUILD_DIR]    (default build; one line per fixture; exit 1 on a failure)
# Without mpirun (the device image has none) the EP run is started directly: a build configured with
# -DDI_NCCL_ONE_RANK=ON (NCCL without MPI) then makes a one-rank NCCL communicator with its own unique
# id, so the same exchange runs. EP_LAUNCH overrides the launcher ("" = direct); EP_CASES and
# EPLB_CASES pick the cases (below).
set -u
BUILD=${1:-build}
CLI="$BUILD/deepinfer"
T=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DEEPINFER_ACCELERATOR=cuda
if [ -z "${EP_LAUNCH+x}" ]; then
  if command -v mpirun >/dev/null; then EP_LAUNCH="mpirun -np 1"; else EP_LAUNCH=""; fi
fi
fail=0
ids="--ids 1,8,15,22,29,36,43,50,57,64,71,78"
# compare A B NAME [EXACT]: logits rel L2 < 2e-2 and argmax equal at every position whose top1-top2
# margin in A exceeds 0.1 (the CUDA backend's convention, tests/cuda/test_cuda_model.c: tiny random
# models have near-ties a bf16 rounding flips), and B == EXACT bit for bit when given
compare() {
  python3 - "$@" <<'PY'
import sys
import numpy as np
from safetensors.numpy import load_file
a, b = (next(iter(load_file(p).values())) for p in sys.argv[1:3])
a64, b64 = a.astype(np.float64), b.astype(np.float64)
rel = np.linalg.norm(a64 - b64) / np.linalg.norm(a64)
top2 = np.sort(a64, -1)[..., -2:]
margin = top2[..., 1] - top2[..., 0]
flip = a64.argmax(-1) != b64.argmax(-1)
same = bool((~flip | (margin <= 0.1)).all())
ok = rel < 2e-2 and same
msg = f"{sys.argv[3]}: logits rel L2 {rel:.2e}, argmax equal where the margin > 0.1: {same}"
if flip.any():
    msg += f" ({int(flip.sum())} top-1 flip(s), plain margins {', '.join(f'{m:.3g}' for m in margin[flip])})"
if len(sys.argv) > 4:
    e = next(iter(load_file(sys.argv[4]).values()))
    bits = e.tobytes() == b.tobytes()
    msg += f", equal to the in-order EP run bit for bit: {bits}"
    ok = ok and bits
print(msg, flush=True)
sys.exit(0 if ok else 1)
PY
}
# run NAME OUT ARGS...: one score, stderr kept in $T/NAME.err
run() {
  name=$1 out=$2; shift 2
  "$@" $ids --out "$out" 2>"$T/$name.err" || { echo "$name: FAILED to run"; tail -20 "$T/$name.err"; fail=1; return 1; }
}
# case = [fp8:|ovl:]MODEL; fp8: DEEPINFER_CUDA_FP8=1 on both sides and the experts must be FP8 under
# expert parallel; ovl: DEEPINFER_CUDA_EP_OVERLAP=1 (shared experts on a second stream), which must
# also equal the in-order expert-parallel run of the same model bit for bit. The plain run of a model
# is made once. Most telling first (the device run has a short limit).
for c in ${EP_CASES:-dsv3-tiny fp8:dsv3-tiny-fp8 ovl:dsv3-tiny dsv2-tiny dsv3-odd dsv3-tiny-fp8 ovl:dsv2-tiny}; do
  m=${c#*:} f8=0 ov=0 want="cuda expert parallel over 1 rank (nccl)"
  case "$c" in fp8:*) f8=1 want="experts in fp8" ;; ovl:*) ov=1 want="shared experts on a second stream" ;; esac
  P="$T/plain-$m-$f8.safetensors"
  [ -f "$P" ] || run "plain-$m-$f8" "$P" env DEEPINFER_CUDA_FP8=$f8 "$CLI" score --model tests/data/models/$m || continue
  run "$c" "$T/ep.safetensors" env DEEPINFER_CUDA_FP8=$f8 DEEPINFER_CUDA_EP_OVERLAP=$ov $EP_LAUNCH "$CLI" score \
    --model tests/data/models/$m --enable-expert-parallel || continue
  if ! grep -q "cuda expert parallel over 1 rank (nccl)" "$T/$c.err" || ! grep -q "$want" "$T/$c.err"; then
    echo "$c: the run did not say '$want'"; tail -5 "$T/$c.err"; fail=1; continue
  fi
  if [ $ov = 1 ]; then
    compare "$P" "$T/ep.safetensors" "$c" "$T/ep-$m-$f8.safetensors" || fail=1
  else
    compare "$P" "$T/ep.safetensors" "$c" || fail=1
    cp "$T/ep.safetensors" "$T/ep-$m-$f8.safetensors"
  fi
done
# EPLB on one GPU: 16 experts + 4 redundant slots (replicas of the hottest), rebalanced every 3 steps
# from the last 4: score's logits within tolerance of plain, and greedy generate equal to expert
# parallel without EPLB (the replicas hold the same weights), with rebalances that moved experts
# (EPLB_CASES: fp8:MODEL runs it with FP8 experts, whose moved slots are uploaded in FP8)
eplb='{"num_redundant_experts": 4, "window_size": 4, "step_interval": 3}'
for c in ${EPLB_CASES:-dsv3-tiny}; do
  m=${c#fp8:} f8=0
  [ "$c" != "$m" ] && f8=1
  P="$T/plain-$m-$f8.safetensors"
  [ -f "$P" ] || run "plain-$m-$f8" "$P" env DEEPINFER_CUDA_FP8=$f8 "$CLI" score --model tests/data/models/$m || continue
  run "eplb:$c" "$T/ep.safetensors" env DEEPINFER_CUDA_FP8=$f8 $EP_LAUNCH "$CLI" score --model tests/data/models/$m \
    --enable-expert-parallel --enable-eplb --eplb-config "$eplb" || continue
  grep -q "expert slots here (EPLB)" "$T/eplb:$c.err" || { echo "eplb:$c: not EPLB"; fail=1; }
  compare "$P" "$T/ep.safetensors" "eplb:$c score" || fail=1
  gen="generate --model tests/data/models/$m --prompt-ids 3,9,27,81 --max-tokens 16 --temperature 0 --output-format json --gpu-memory-utilization 0.2"
  if ! env DEEPINFER_CUDA_FP8=$f8 $EP_LAUNCH "$CLI" $gen --enable-expert-parallel >"$T/g0.json" 2>"$T/g0.err" ||
     ! env DEEPINFER_CUDA_FP8=$f8 $EP_LAUNCH "$CLI" $gen --enable-expert-parallel --enable-eplb --eplb-config "$eplb" \
         >"$T/g1.json" 2>"$T/g1.err"; then
    echo "eplb:$c generate: FAILED to run"; tail -20 "$T/g0.err" "$T/g1.err"; fail=1; continue
  fi
  moved=$(grep -c "EPLB rebalance" "$T/g1.err")
  if cmp -s "$T/g0.json" "$T/g1.json" && [ "$moved" -gt 0 ]; then
    echo "eplb:$c: greedy generate equal with and without EPLB ($moved rebalances; $(grep "EPLB rebalance" "$T/g1.err" | tail -1))"
  else
    echo "eplb:$c: generate differs or no rebalance ($moved)"; head -c 400 "$T/g0.json" "$T/g1.json"; tail -5 "$T/g1.err"; fail=1
  fi
done
rm -rf "$T"
exit $fail
