#!/bin/sh
# One-GPU check of the CUDA backend's expert parallel (issue 21; for the device machine, not CI):
# `DEEPINFER_ACCELERATOR=cuda mpirun -np 1 deepinfer score --enable-expert-parallel` initialises the NCCL
# communicator (unique id over MPI) and sends every routed-expert row through the NCCL exchange to
# itself. Its logits must match the plain single-GPU path within bf16 tolerance (rel L2 < 2e-2: the
# expert-parallel form runs the shared experts unfolded and the experts as grouped GEMMs, so not
# bit for bit), with the same argmax at every position, on the V2/V3 fixtures. Usage:
#   tests/cuda/ep_nccl_check.sh [BUILD_DIR]    (default build; one line per fixture; exit 1 on a failure)
set -u
BUILD=${1:-build}
CLI="$BUILD/deepinfer"
T=$(mktemp -d)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DEEPINFER_ACCELERATOR=cuda
fail=0
for m in dsv2-tiny dsv3-tiny dsv3-odd dsv3-tiny-fp8; do
  args="score --model tests/data/models/$m --ids 1,8,15,22,29,36,43,50,57,64,71,78"
  if ! "$CLI" $args --out "$T/plain.safetensors" 2>"$T/plain.err" ||
     ! mpirun -np 1 "$CLI" $args --out "$T/ep.safetensors" --enable-expert-parallel 2>"$T/ep.err" ||
     ! grep -q "cuda expert parallel over 1 rank (nccl)" "$T/ep.err"; then
    echo "$m: FAILED to run"; cat "$T/plain.err" "$T/ep.err"; fail=1; continue
  fi
  python3 - "$T/plain.safetensors" "$T/ep.safetensors" "$m" <<'PY' || fail=1
import sys
import numpy as np
from safetensors.numpy import load_file
a, b = (next(iter(load_file(p).values())).astype(np.float64) for p in sys.argv[1:3])
rel = np.linalg.norm(a - b) / np.linalg.norm(a)
same = bool((a.argmax(-1) == b.argmax(-1)).all())
print(f"{sys.argv[3]}: logits rel L2 {rel:.2e}, argmax equal: {same}")
sys.exit(0 if rel < 2e-2 and same else 1)
PY
done
rm -rf "$T"
exit $fail
