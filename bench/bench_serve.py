"""Load generator for `deepinfer serve` (stdlib only): CONCURRENCY clients, each sending REQUESTS
streamed (or whole) /v1/completions requests back to back over its own connection; token-id prompts
of PROMPT_LEN ids, MAX_TOKENS greedy tokens each (ignore_eos). Reports requests/s, output tokens/s
over the wall time, time to first token and time per output token (p50 / p90).

    python3 bench/bench_serve.py --port 8000 --concurrency 64 --requests 4 --prompt-len 128 --max-tokens 128
"""
import argparse
import asyncio
import json
import random
import statistics
import time


async def one_request(reader, writer, body, stream, path="/v1/completions", headers_extra=b""):
    """(latency, time to first token, time per output token after the first, output tokens) of one
    request on an open keep-alive connection (bench/sweep_measure.py uses it too)."""
    data = json.dumps(body).encode()
    t0 = time.perf_counter()
    writer.write(b"POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n" % path.encode() +
                 headers_extra + b"Content-Length: %d\r\n\r\n" % len(data) + data)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(b":", 1) for l in head.split(b"\r\n")[1:] if b":" in l)}
    first, body_bytes = None, b""
    if headers.get(b"transfer-encoding") == b"chunked":
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            chunk = await reader.readexactly(size + 2)
            if first is None and chunk.startswith(b"data: {"):
                first = time.perf_counter()
            body_bytes += chunk[:-2]
    else:
        body_bytes = await reader.readexactly(int(headers[b"content-length"]))
    t1 = time.perf_counter()
    if status != 200:
        raise RuntimeError("HTTP %d: %s" % (status, body_bytes[:300]))
    if stream:
        events = [e[6:] for e in body_bytes.split(b"\n\n") if e.startswith(b"data: {")]
        usage = json.loads(events[-1])["usage"]
    else:
        usage = json.loads(body_bytes)["usage"]
        first = t1
    n = usage["completion_tokens"]
    return t1 - t0, first - t0, (t1 - first) / (n - 1) if n > 1 else 0.0, n


async def client(args, k, results):
    reader, writer = await asyncio.open_connection(args.host, args.port, limit=1 << 22)
    rnd = random.Random(k)
    for _ in range(args.requests):
        prompt = [rnd.randrange(10, args.vocab) for _ in range(args.prompt_len)]
        body = {"prompt": prompt, "max_tokens": args.max_tokens, "temperature": 0, "ignore_eos": True,
                "stream": args.stream}
        if args.stream:
            body["stream_options"] = {"include_usage": True}
        results.append(await one_request(reader, writer, body, args.stream))
    writer.close()


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=4, help="per client")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=8000)
    ap.add_argument("--no-stream", dest="stream", action="store_false")
    args = ap.parse_args()
    results = []
    t0 = time.perf_counter()
    await asyncio.gather(*(client(args, k, results) for k in range(args.concurrency)))
    wall = time.perf_counter() - t0
    lat = sorted(r[0] for r in results)
    ttft = sorted(r[1] for r in results)
    tpot = sorted(r[2] for r in results)
    toks = sum(r[3] for r in results)

    def pct(a, p):
        return a[min(len(a) - 1, int(p * len(a)))]

    print(json.dumps({
        "concurrency": args.concurrency, "requests": len(results), "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens, "stream": args.stream, "wall_s": round(wall, 3),
        "requests_per_s": round(len(results) / wall, 2), "output_tokens_per_s": round(toks / wall, 1),
        "ttft_ms_p50": round(1e3 * pct(ttft, 0.5), 1), "ttft_ms_p90": round(1e3 * pct(ttft, 0.9), 1),
        "tpot_ms_p50": round(1e3 * pct(tpot, 0.5), 2), "tpot_ms_p90": round(1e3 * pct(tpot, 0.9), 2),
        "latency_s_mean": round(statistics.mean(lat), 3)}))


if __name__ == "__main__":
    asyncio.run(main())
