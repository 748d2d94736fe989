#!/usr/bin/env bash
# DeepInfer's CPU backend against llama.cpp's CPU build on the same machine, in one run: batch-1 decode
# and prompt processing of a DeepSeek-V3-shaped model of ~1.2 B parameters (bench/configs/v3-1b with
# the real DeepSeek-V3 vocabulary, 129,280 tokens), random bf16 weights, same thread count.
#   bench/compare_llama_cpp_cpu.sh LLAMA_CPP_DIR MAKE_SYNTH_PY [WORKDIR] [THREADS]
# LLAMA_CPP_DIR: llama.cpp's source (the vendor/llama.cpp of the llama-cpp-python sdist on PyPI); it is
# built here for the CPU (build-cpu/, GGML_NATIVE) if llama-bench is not there yet. MAKE_SYNTH_PY: the
# make_synth.py that writes random-weight checkpoints (../shared/tools/make_synth.py); it and
# llama.cpp's convert_hf_to_gguf.py need torch, transformers and safetensors (pip). WORKDIR (default
# /tmp/di_llama_cpu) gets the checkpoint (2.4 GB) and its bf16 GGUF. Our side needs build/ (./build.sh).
# llama-bench: tg128 (decode 128 tokens after an empty context) and pp512; bench_cpu_decode: 128
# decode steps after a 16-token prompt and a 512-token prefill, dummy weights of the same config (the
# numbers do not depend on the values), best of 3, with the machine's read bandwidth measured.
set -euo pipefail
cd "$(dirname "$0")/.."
LLAMA="${1:?llama.cpp source dir}"
SYNTH="${2:?make_synth.py}"
WORK="${3:-/tmp/di_llama_cpu}"
THREADS="${4:-2}"
mkdir -p "$WORK"
if [ ! -f "$WORK/hf/config.json" ]; then
  # make_synth's checkpoint writer with this shape (its own SHAPES are the GPU benchmark's)
  python3 - "$SYNTH" "$WORK/hf" tests/data/tokenizers/deepseek-v3 <<'EOF'
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("make_synth", sys.argv[1])
ms = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ms)
cfg = json.load(open("bench/configs/v3-1b/config.json"))
cfg["vocab_size"] = 129280  # the DeepSeek-V3 tokenizer's, which llama.cpp's converter reads
cfg.setdefault("aux_loss_alpha", 0.001)
ms.SHAPES["v3-1b-v129k"] = cfg
sys.argv = ["make_synth.py", "v3-1b-v129k", sys.argv[2], sys.argv[3]]
ms.main()
EOF
fi
if [ ! -f "$WORK/model-bf16.gguf" ]; then
  PYTHONPATH="$LLAMA/gguf-py" python3 "$LLAMA/convert_hf_to_gguf.py" "$WORK/hf" --outtype bf16 \
    --outfile "$WORK/model-bf16.gguf" >"$WORK/convert.log" 2>&1 || { tail -20 "$WORK/convert.log"; exit 1; }
fi
if [ ! -x "$LLAMA/build-cpu/bin/llama-bench" ]; then
  cmake -S "$LLAMA" -B "$LLAMA/build-cpu" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=OFF >/dev/null
  cmake --build "$LLAMA/build-cpu" -j "$(nproc)" --target llama-bench >/dev/null
fi
echo "=== machine"
lscpu | grep -E "Model name|^CPU\(s\)|L2|L3" || true
echo "=== llama.cpp ($(cd "$LLAMA" && git describe --tags 2>/dev/null || basename "$(dirname "$(dirname "$LLAMA")")"))"
"$LLAMA/build-cpu/bin/llama-bench" -m "$WORK/model-bf16.gguf" -t "$THREADS" -p 512 -n 128 -r 3
echo "=== DeepInfer (build/bench_cpu_decode, $THREADS threads)"
build/bench_cpu_decode --model "$WORK/hf" --threads "$THREADS" --tokens 128 --repeat 3
build/bench_cpu_decode --model "$WORK/hf" --threads "$THREADS" --tokens 4 --prompt 512 --repeat 3
