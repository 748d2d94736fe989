# s15-20 req-3 (session 15; binaries of branch s15-20's last commit: test_cuda_v4, test_cuda_v4_kernels, bench_cuda_v4;
# no model): test_cuda_v4 with the session's V4 defaults (index form 4, attention form 4, fuse 2; only the kernel tests and
# the bench hashes ran on them), the hashes of the final defaults (must equal the line below: req-1/2's, = main's), and
# an ncu of the indexer / split attention kernels at 128K, batch 64 (what bounds them: the 85% aim at batch 16-64).
set -u
export PATH="$BIN:$PATH"
B="$BIN/bench_cuda_v4"
step() { # name timeout cmd...
  local n="$1" t="$2"; shift 2
  local s=$SECONDS
  timeout "$t" "$@" > "$LOG/$n.log" 2>&1
  echo "=== $n: exit $? in $((SECONDS - s)) s"
}
step v4_kernels 30 "$BIN/test_cuda_v4_kernels"
step v4_model 30 "$BIN/test_cuda_v4"
step def 15 env DEEPINFER_CUDA_V4_NATIVE=1 "$B" 4096,131072 32 6 1,16,64 0 4
if command -v ncu >/dev/null; then
  step ncu 60 env DEEPINFER_CUDA_V4_NATIVE=1 ncu --clock-control none --kernel-name regex:"index_score3|index_topk|att_" \
    --launch-count 40 --section SpeedOfLight --section Occupancy --section MemoryWorkloadAnalysis --csv \
    --log-file "$LOG/ncu.csv" "$B" 131072 32 1 64
fi
echo "--- expected (s15-20 req-1 / req-2 def, = main): afea066517fe5286 d5467cd94f1eb181 37697e995f2bf1fd 8d2d3a26d70ce170 c20f34c37247503c 1a252c84a8bf9551"
echo "def: $(grep -o 'logits [0-9a-f]*' "$LOG/def.log" | cut -c8- | tr '\n' ' ')"
echo "def: $(grep -E '^decode batch' "$LOG/def.log" | sed -E 's/.*batch +([0-9]+) at context ([0-9]+): ([0-9.]+) ms.*/b\1@\2 \3/' | tr '\n' ' ')"
tail -1 "$LOG/v4_kernels.log"; tail -1 "$LOG/v4_model.log"
