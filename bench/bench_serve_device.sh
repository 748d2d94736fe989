#!/usr/bin/env bash
# deepinfer serve vs the engine alone on the device machine (not run yet: see docs/NOTES.md).
#   here:   cmake -S . -B build-server-cuda -DDI_CUDA=ON && cmake --build build-server-cuda --target deepinfer_cli bench_engine
#           mkdir -p .carry/server && cp build-server-cuda/{deepinfer,bench_engine} .carry/server/ && strip .carry/server/*
#           (plus libcjson.so.1 and libpcre2-8.so.0 when the device lacks them)
#   device: bench/bench_serve_device.sh [.carry/server]   (run with carry [".carry/server"]; logs in $OUT)
# The v3-1b shape (12 layers, hidden 1536, 32 experts) with dummy weights on the CUDA backend:
# bench_engine's pure-decode tok/s at 256 sequences, then the server under whole and streamed
# load (4 client processes x 64 streams, so the Python client is not the bottleneck).
B="${1:-.carry/server}"
OUT="${OUT:-./device-logs}"
mkdir -p "$OUT"
export LD_LIBRARY_PATH="$PWD/$B:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 "$B/bench_engine" model bench/configs/v3-1b dummy cuda 256 128 2>&1 | tail -2
"$B/deepinfer" serve bench/configs/v3-1b --load-format dummy --accelerator cuda --port 0 --max-num-seqs 256 \
  --num-kv-blocks 4096 --disable-log-requests 2> "$OUT/serve_gpu.err" &
PID=$!
for i in $(seq 600); do grep -q listening "$OUT/serve_gpu.err" && break; sleep 0.1; done
PORT=$(grep -o 'listening on http://[^ ]*' "$OUT/serve_gpu.err" | sed 's/.*://')
R="python3 bench/bench_serve.py --port $PORT --prompt-len 128 --max-tokens 128 --vocab 32000"
timeout 60 $R --concurrency 64 --requests 2 --no-stream
timeout 60 $R --concurrency 256 --requests 2 --no-stream
timeout 60 $R --concurrency 64 --requests 2
echo "4 client processes x 64 streams:"
P=""
for k in 1 2 3 4; do timeout 90 $R --concurrency 64 --requests 2 > "$OUT/c$k.json" & P="$P $!"; done
wait $P
cat "$OUT"/c*.json
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:$PORT/metrics').read().decode())" |
  grep -E "^deepinfer_(generation_tokens_total|engine_steps_total|time_per_output_token_seconds_(sum|count))"
kill -TERM $PID
wait $PID
echo "serve exit $?"
