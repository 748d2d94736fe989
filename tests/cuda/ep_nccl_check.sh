#!/bin/sh
# One-GPU check of the CUDA backend's expert parallel (issue 21; for the device machine, not CI):
# `DEEPINFER_ACCELERATOR=cuda mpirun -np 1 deepinfer score --enable-expert-parallel` initialises the NCCL
# communicator (unique id over MPI) and sends every routed-expert row through the NCCL exchange to
# itself. Its logits must match the plain single-GPU path within bf16 tolerance (rel L2 < 2e-2: the
# expert-parallel form runs the shared experts unfolded and the experts as grouped GEMMs, so not
# bit for bit), with the same argmax at every position, on the V2/V3 fixtures. Usage:
#   tests/cuda/ep_nccl_check.sh [BUILD_DIR]    (default build; one line per fixture; exit 1 on a failure)
# Without mpirun (the device image has none) the EP run is started directly: a build configured with
# -DDI_NCCL_ONE_RANK=ON (NCCL without MPI) then makes a one-rank NCCL communicator with its own unique
# id, so the same exchange runs. EP_LAUNCH overrides the launcher ("" = direct).
set -u
BUILD=${1:-build}
CLI="$BUILD/deepinfer"
T=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DEEPINFER_ACCELERATOR=cuda
if [ -z "${EP_LAUNCH+x}" ]; then
  if command -v mpirun >/dev/null; then EP_LAUNCH="mpirun -np 1"; else EP_LAUNCH=""; fi
fi
fail=0
# case = [fp8:|ovl:]MODEL; fp8: DEEPINFER_CUDA_FP8=1 on both sides and the experts must be FP8 under
# expert parallel; ovl: DEEPINFER_CUDA_EP_OVERLAP=1 (shared experts on a second stream), which must
# also equal the in-order expert-parallel run of the same model bit for bit
cases="dsv2-tiny dsv3-tiny dsv3-odd dsv3-tiny-fp8 ovl:dsv3-tiny ovl:dsv2-tiny fp8:dsv3-tiny-fp8"
for c in $cases; do
  m=${c#*:}
  unset DEEPINFER_CUDA_FP8 DEEPINFER_CUDA_EP_OVERLAP
  want="cuda expert parallel over 1 rank (nccl)"
  exact="" ep_env="DEEPINFER_CUDA_EP_OVERLAP=0"
  case "$c" in
    fp8:*) export DEEPINFER_CUDA_FP8=1; want="experts in fp8" ;;
    ovl:*) want="shared experts on a second stream"; exact="$T/ep-$m.safetensors" ep_env="DEEPINFER_CUDA_EP_OVERLAP=1" ;;
  esac
  args="score --model tests/data/models/$m --ids 1,8,15,22,29,36,43,50,57,64,71,78"
  if ! "$CLI" $args --out "$T/plain.safetensors" 2>"$T/plain.err" ||
     ! env "$ep_env" $EP_LAUNCH "$CLI" $args --out "$T/ep.safetensors" --enable-expert-parallel 2>"$T/ep.err" ||
     ! grep -q "cuda expert parallel over 1 rank (nccl)" "$T/ep.err" || ! grep -q "$want" "$T/ep.err"; then
    echo "$c: FAILED to run"; cat "$T/plain.err" "$T/ep.err"; fail=1; continue
  fi
  [ "$c" = "$m" ] && cp "$T/ep.safetensors" "$T/ep-$m.safetensors"
  python3 - "$T/plain.safetensors" "$T/ep.safetensors" "$c" "$exact" <<'PY' || fail=1
import sys
import numpy as np
from safetensors.numpy import load_file
a, b = (next(iter(load_file(p).values())).astype(np.float64) for p in sys.argv[1:3])
rel = np.linalg.norm(a - b) / np.linalg.norm(a)
same = bool((a.argmax(-1) == b.argmax(-1)).all())
ok = rel < 2e-2 and same
msg = f"{sys.argv[3]}: logits rel L2 {rel:.2e}, argmax equal: {same}"
if sys.argv[4]:
    e = next(iter(load_file(sys.argv[4]).values()))
    bits = bool((e.view(np.uint8) == next(iter(load_file(sys.argv[2]).values())).view(np.uint8)).all())
    msg += f", equal to the in-order EP run bit for bit: {bits}"
    ok = ok and bits
print(msg)
sys.exit(0 if ok else 1)
PY
done
# EPLB on one GPU: 16 experts + 4 redundant slots (replicas of the hottest), rebalanced every 3 steps
# from the last 4: score's logits within tolerance of plain, and greedy generate equal to expert
# parallel without EPLB (the replicas hold the same weights), with rebalances that moved experts
eplb='{"num_redundant_experts": 4, "window_size": 4, "step_interval": 3}'
for m in dsv3-tiny dsv2-tiny; do
  args="score --model tests/data/models/$m --ids 1,8,15,22,29,36,43,50,57,64,71,78"
  gen="generate --model tests/data/models/$m --prompt-ids 3,9,27,81 --max-tokens 16 --temperature 0 --output-format json"
  if ! "$CLI" $args --out "$T/plain.safetensors" 2>"$T/plain.err" ||
     ! $EP_LAUNCH "$CLI" $args --out "$T/ep.safetensors" --enable-expert-parallel --enable-eplb --eplb-config "$eplb" \
         2>"$T/ep.err" || ! grep -q "expert slots here (EPLB)" "$T/ep.err" ||
     ! $EP_LAUNCH "$CLI" $gen --enable-expert-parallel >"$T/g0.json" 2>"$T/g0.err" ||
     ! $EP_LAUNCH "$CLI" $gen --enable-expert-parallel --enable-eplb --eplb-config "$eplb" >"$T/g1.json" 2>"$T/g1.err"; then
    echo "eplb:$m: FAILED to run"; cat "$T/plain.err" "$T/ep.err" "$T/g0.err" "$T/g1.err" 2>/dev/null; fail=1; continue
  fi
  python3 - "$T/plain.safetensors" "$T/ep.safetensors" "eplb:$m" "" <<'PY' || fail=1
import sys
import numpy as np
from safetensors.numpy import load_file
a, b = (next(iter(load_file(p).values())).astype(np.float64) for p in sys.argv[1:3])
rel = np.linalg.norm(a - b) / np.linalg.norm(a)
same = bool((a.argmax(-1) == b.argmax(-1)).all())
print(f"{sys.argv[3]}: score logits rel L2 {rel:.2e}, argmax equal: {same}")
sys.exit(0 if rel < 2e-2 and same else 1)
PY
  moved=$(grep -c "EPLB rebalance" "$T/g1.err")
  if cmp -s "$T/g0.json" "$T/g1.json" && [ "$moved" -gt 0 ]; then
    echo "eplb:$m: greedy generate equal with and without EPLB ($moved rebalances: $(grep "EPLB rebalance" "$T/g1.err" | tail -1))"
  else
    echo "eplb:$m: generate differs or no rebalance ($moved)"; head -c 600 "$T/g0.json" "$T/g1.json"; tail -5 "$T/g1.err"; fail=1
  fi
done
rm -rf "$T"
exit $fail
