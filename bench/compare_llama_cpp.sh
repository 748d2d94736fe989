#!/usr/bin/env bash
# DeepInfer against llama.cpp on the DeepSeek-V2-Lite shape, one H200, in ONE device call (issue 6:
# a milestone is recorded only with llama.cpp measured beside it in the same call).
#
#   bench/compare_llama_cpp.sh --pack LLAMA_CPP_DIR   (build machine) stage into .carry/llama/:
#       llama-batched-bench from LLAMA_CPP_DIR/build/bin (llama.cpp from the llama-cpp-python sdist,
#       vendor/llama.cpp, configured -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=OFF
#       -DLLAMA_CURL=OFF -DGGML_NATIVE=OFF, Release), stripped and xz-packed; llama.cpp's own converter
#       (convert_hf_to_gguf.py, conversion/, gguf-py/); ../shared/tools/make_synth.py.
#   bench/compare_llama_cpp.sh                        (device, repo root; carry .carry/llama and
#       .carry/cudapack) 1. DeepInfer: bench_cuda_decode on bench/configs/v2-lite.json (dummy bf16
#       weights; decode at batch 1/4/16/64/256 after 512-token prompts, 128 new tokens; prefill 512 and
#       4096); 2. make_synth.py v2-lite (random bf16 checkpoint, 31.6 GB, in /dev/shm) with the
#       DeepSeek-V3 tokenizer; 3. llama.cpp's converter to a bf16 GGUF on disk; 4. llama-batched-bench
#       -npp 512 -ntg 128 -npl 1,4,16,64,256 -fa on -ngl 99: the same prompts and lengths, S_PP is its
#       prefill and S_TG its aggregate decode tokens/s. Logs go to $OUT (or ./device-logs).
# The whole working tree travels with a device call (64 MiB at most) and the llama.cpp binary is ~41 MB
# packed, so the call is made with the big test data moved out of the tree (see docs/NOTES.md).
set -uo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--pack" ]; then
  set -e
  L="${2:?usage: --pack LLAMA_CPP_DIR}"
  rm -rf .carry/llama && mkdir -p .carry/llama
  strip -o /tmp/llama-batched-bench "$L/build/bin/llama-batched-bench"
  xz -T2 -6 -c /tmp/llama-batched-bench > .carry/llama/llama-batched-bench.xz
  cp "$L/convert_hf_to_gguf.py" .carry/llama/
  cp -r "$L/conversion" .carry/llama/
  mkdir -p .carry/llama/gguf-py && cp -r "$L/gguf-py/gguf" .carry/llama/gguf-py/
  cp ../shared/tools/make_synth.py .carry/llama/
  find .carry/llama -name __pycache__ -prune -exec rm -rf {} +
  du -sh .carry/llama
  exit 0
fi
LOG="${OUT:-./device-logs}"
mkdir -p "$LOG"
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.mem,driver_version --format=csv,noheader | tee "$LOG/gpu.txt"
mkdir -p /tmp/di_dev && tar xJf .carry/cudapack/bin.tar.xz -C /tmp/di_dev
export LD_LIBRARY_PATH="/tmp/di_dev/cudabin:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
t0=$SECONDS
echo "=== deepinfer ($(date -u +%T))"
timeout 240 /tmp/di_dev/cudabin/bench_cuda_decode bench/configs/v2-lite.json 2>&1 | tee "$LOG/deepinfer.log"
echo "=== make_synth ($(date -u +%T))"
mkdir -p /tmp/tok && xz -dc tests/data/tokenizers/deepseek-v3/tokenizer.json.xz > /tmp/tok/tokenizer.json &&
  cp tests/data/tokenizers/deepseek-v3/tokenizer_config.json /tmp/tok/
timeout 300 python3 .carry/llama/make_synth.py v2-lite /dev/shm/v2l /tmp/tok 2>&1 | tail -3 | tee "$LOG/make_synth.log"
echo "=== convert ($(date -u +%T))"
s=$SECONDS
timeout 400 python3 .carry/llama/convert_hf_to_gguf.py /dev/shm/v2l --outtype bf16 --outfile /tmp/v2l-bf16.gguf \
  >"$LOG/convert.log" 2>&1
echo "convert: exit $? in $((SECONDS - s)) s"; tail -2 "$LOG/convert.log"; ls -la /tmp/v2l-bf16.gguf
rm -rf /dev/shm/v2l
echo "=== llama.cpp ($(date -u +%T))"
xz -dc .carry/llama/llama-batched-bench.xz > /tmp/llama-batched-bench && chmod +x /tmp/llama-batched-bench
# NCCL and OpenMP come with the image's Python packages where /usr/local/cuda lacks them
for lib in libnccl.so.2 libgomp.so.1; do
  ldd /tmp/llama-batched-bench | grep -q "$lib => not found" || continue
  d=$(dirname "$(find / -name "$lib" -not -path "/proc/*" 2>/dev/null | head -1)")
  [ -n "$d" ] && export LD_LIBRARY_PATH="$d:$LD_LIBRARY_PATH"
done
ldd /tmp/llama-batched-bench | grep "not found"
timeout 300 /tmp/llama-batched-bench -m /tmp/v2l-bf16.gguf -c 165000 -b 2048 -ub 512 -ngl 99 -fa on \
  -npp 512 -ntg 128 -npl ${LLAMA_NPL:-1,4,16,64,256} 2>&1 | tee "$LOG/llama.log" | grep -E "^\||ggml_cuda_init|Device 0|error"
echo "=== done in $((SECONDS - t0)) s"
