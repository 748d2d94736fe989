# s13-20 req-6 (final: 6834bbd + native default; supersedes req-5, which may be skipped): tests, hashes vs req-2, final bench, MXFP4 form / indexer form A/B, ncu native
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
F="4096,32768,131072 32 8 1,16,64,256 4096 4"
step v4_kernels 50 "$BIN/test_cuda_v4_kernels"
step v4_model 50 "$BIN/test_cuda_v4"
step hash_bf16 25 "$B" $A
step hash_native 25 env DEEPINFER_CUDA_V4_NATIVE=1 "$B" $A
step full_bf16 45 env DEEPINFER_CUDA_V4_NATIVE=0 "$B" $F
step full_native 45 env DEEPINFER_CUDA_V4_NATIVE=1 "$B" $F
step native_mx3 20 env DEEPINFER_CUDA_V4_NATIVE=1 BENCH_V4_MX_FORM=3 "$B" $A

step native_ix0 20 env DEEPINFER_CUDA_V4_NATIVE=1 BENCH_V4_INDEX_FORM=0 "$B" $A
if command -v ncu >/dev/null; then
  step ncu_native 35 env DEEPINFER_CUDA_V4_NATIVE=1 ncu --clock-control none --csv --metrics gpu__time_duration.sum --launch-count 700 --log-file "$LOG/ncu_native.csv" "$B" 4096 8 1 1
fi
echo "--- hashes: req-2 bf16 7041470f55baa928 6ec05057bf1c8612 6b675e510e9d539e 429624e7c9060499 63ea31ca4c25e083 2c487cbc83fca24c"
echo "--- hashes: req-2 native afea066517fe5286 37697e995f2bf1fd 794cc9bcbb301144 b04ed9cce0ea3a8f 8d2d3a26d70ce170 1a252c84a8bf9551"
for f in hash_bf16 hash_native native_mx3 native_ix0; do echo "$f: $(grep -o 'logits [0-9a-f]*' "$LOG/$f.log" | cut -c8- | tr '\n' ' ')"; done
for f in hash_bf16 hash_native native_mx3 native_ix0 full_bf16 full_native; do echo "$f: $(grep -E '^decode batch' "$LOG/$f.log" | sed -E 's/.*batch +([0-9]+) at context ([0-9]+): ([0-9.]+) ms.*/b\1@\2 \3/' | tr '\n' ' ')"; done
grep -h -E "prefill" "$LOG/full_bf16.log" "$LOG/full_native.log"
grep -E "indexer: the|passed|failed" "$LOG/v4_kernels.log" | tail -3
tail -1 "$LOG/v4_model.log"
