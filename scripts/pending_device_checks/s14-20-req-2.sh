# s14-20 req-2 (branch s14-20, final): request 1 verified the session's first forms (tests 468/0, hashes == main's) and they
# are now the defaults (MXFP4 form 4, one-token GEMVs, FP8 one-row form 1, mHC collapse, norm + rope fusion, state
# writes, warp routing, two-key attention at one token). This runs the kernel tests, the model tests vs the CPU /
# goldens with the new defaults (test_cuda_v4, graphs-off pass), bench hashes with the defaults (must equal main's
# request-6 hashes) in both modes, and A/Bs the forms added after request 1 (MORE: FP8 from f32 rows, the window-write
# fusion, 4 rows a warp for the head, the mHC mixes' loads, 8 indexer entries a CTA): hashes equal and timings.
set -u
export PATH="$BIN:$PATH"
B="$BIN/bench_cuda_v4"
step() { # name timeout cmd...
  local n="$1" t="$2"; shift 2
  local s=$SECONDS
  timeout "$t" "$@" > "$LOG/$n.log" 2>&1
  echo "=== $n: exit $? in $((SECONDS - s)) s"
}
A="4096,32768,131072 32 6 1,64 0 4"
F="4096,131072 32 8 1,16,64 4096 4"
MORE="BENCH_V4_FP8_F32X=1 BENCH_V4_FUSE=2 BENCH_V4_LIN_FORM=2 BENCH_V4_HC_FORM=2 BENCH_V4_INDEX_FORM=2"
step v4_kernels 45 "$BIN/test_cuda_v4_kernels"
step v4_model 35 env TEST_V4_GRAPHS=0 "$BIN/test_cuda_v4"
step native_def 12 env DEEPINFER_CUDA_V4_NATIVE=1 "$B" $A
step bf16_def 12 env DEEPINFER_CUDA_V4_NATIVE=0 "$B" $A
step native_more 12 env DEEPINFER_CUDA_V4_NATIVE=1 $MORE "$B" $A
step full_more 15 env DEEPINFER_CUDA_V4_NATIVE=1 $MORE "$B" $F
if command -v ncu >/dev/null; then
  step ncu_more 18 env DEEPINFER_CUDA_V4_NATIVE=1 $MORE ncu --clock-control none --csv --metrics gpu__time_duration.sum --launch-count 700 --log-file "$LOG/ncu_more.csv" "$B" 4096 8 1 1
fi
echo "--- req-6 (main) native: afea066517fe5286 37697e995f2bf1fd 794cc9bcbb301144 b04ed9cce0ea3a8f 8d2d3a26d70ce170 1a252c84a8bf9551"
echo "--- req-6 (main) bf16:   7041470f55baa928 6ec05057bf1c8612 6b675e510e9d539e 429624e7c9060499 63ea31ca4c25e083 2c487cbc83fca24c"
for f in native_def native_more bf16_def; do echo "$f: $(grep -o 'logits [0-9a-f]*' "$LOG/$f.log" | cut -c8- | tr '\n' ' ')"; done
for f in native_def native_more bf16_def full_more; do echo "$f: $(grep -E '^decode batch' "$LOG/$f.log" | sed -E 's/.*batch +([0-9]+) at context ([0-9]+): ([0-9.]+) ms.*/b\1@\2 \3/' | tr '\n' ' ')"; done
grep -h -E "^prefill" "$LOG/full_more.log"
grep -E "DIFFER|FAIL" "$LOG/v4_kernels.log" | head -5; tail -1 "$LOG/v4_kernels.log"; tail -2 "$LOG/v4_model.log"
