"""The measurements of the Pareto sweep (bench/sweep.py), against a server or in-process.

Decode point (concurrency c): c clients each send `rounds` requests back to back (random token-id
prompts of prompt_len ids, output_len greedy tokens, ignore_eos, streamed), so the server's batch stays
at c; aggregate output tok/s = all output tokens / the wall time, per-user tok/s = 1 / the mean time per
output token (after the first), plus the mean and p50 time to first token. At large c one Python
process cannot read every stream in time, so the clients are spread over up to `procs` processes
(forked; their clocks are time.monotonic, the same across processes on Linux).

Prefill point (prompt length L, batch b): b requests of L random ids and max_tokens 1 sent at once;
prefill tok/s = b * L / the time until the last first token, TTFT = the mean time to first token.

Every request's prompt is drawn from its own seeded random.Random, so no two share a prefix (the prefix
cache does not help) and a rerun sends the same prompts. In-process the same points run through one
deepinfer.LLM: a decode point is `rounds` waves of c requests (all the same length, so the batch is c
throughout), a prefill point one wave of b requests.
"""
import asyncio
import json
import math
import multiprocessing
import os
import random
import statistics
import sys
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_serve  # noqa: E402


def prompt_ids(seed, n, vocab):
    rng = random.Random(repr(seed))  # a str seed: the same ids on every run (a tuple is not accepted)
    lo = min(100, vocab // 4)
    return [rng.randrange(lo, vocab) for _ in range(n)]


class Target:
    """An OpenAI-compatible server: base URL (http://host:port[/v1]) and the model name to send (given,
    else the first the server lists)."""

    def __init__(self, base_url, model=None, api_key=None):
        u = urllib.parse.urlsplit(base_url if "://" in base_url else "http://" + base_url)
        if u.scheme != "http":
            raise ValueError(f"{base_url}: only http:// servers can be measured")
        self.host, self.port = u.hostname, u.port or 80
        prefix = u.path.rstrip("/")
        if not prefix.endswith("/v1"):
            prefix += "/v1"
        self.path = prefix + "/completions"
        self.headers = f"Authorization: Bearer {api_key}\r\n".encode() if api_key else b""
        self.base_url = base_url
        self.model = model or self._first_model(f"http://{self.host}:{self.port}{prefix}/models", api_key)

    @staticmethod
    def _first_model(url, api_key):
        """The first id of GET /v1/models (servers such as vLLM want a model name), else None."""
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read())["data"][0]["id"]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            return None


async def _client(target, bodies, out):
    reader, writer = await asyncio.open_connection(target.host, target.port, limit=1 << 22)
    try:
        for body in bodies:
            t0 = time.monotonic()
            lat, ttft, tpot, n = await bench_serve.one_request(reader, writer, body, True, target.path, target.headers)
            out.append((t0, t0 + lat, ttft, tpot, n))
    finally:
        writer.close()


def _body(target, ids, max_tokens):
    b = {"prompt": ids, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
         "stream_options": {"include_usage": True}}
    if target.model:
        b["model"] = target.model
    return b


def _run_clients(args):
    """One process's share: [(start, end, ttft, tpot, n)] of its clients' requests."""
    target, client_bodies = args
    out = []

    async def go():
        await asyncio.gather(*(_client(target, bodies, out) for bodies in client_bodies))
    asyncio.run(go())
    return out


def _fan_out(target, client_bodies, procs):
    procs = max(1, min(procs, len(client_bodies)))
    if procs == 1:
        return _run_clients((target, client_bodies))
    shares = [client_bodies[i::procs] for i in range(procs)]
    with multiprocessing.get_context("fork").Pool(procs) as pool:
        parts = pool.map(_run_clients, [(target, s) for s in shares])
    return [r for part in parts for r in part]


def _summary(rs):
    start = min(r[0] for r in rs)
    wall = max(r[1] for r in rs) - start
    toks = sum(r[4] for r in rs)
    tpot = [r[3] for r in rs if r[4] > 1]
    ttft = [r[2] for r in rs]
    return wall, toks, tpot, ttft


def decode_point(target, c, prompt_len, output_len, rounds, vocab, procs, seed=0):
    bodies = [[_body(target, prompt_ids((seed, c, k, j), prompt_len, vocab), output_len) for j in range(rounds)]
              for k in range(c)]
    wall, toks, tpot, ttft = _summary(_fan_out(target, bodies, procs))
    return decode_row(c, prompt_len, output_len, c * rounds, toks, wall, tpot, ttft)


def prefill_point(target, prompt_len, batch, vocab, procs, seed=0):
    bodies = [[_body(target, prompt_ids((seed, "prefill", prompt_len, batch, k), prompt_len, vocab), 1)]
              for k in range(batch)]
    rs = _fan_out(target, bodies, procs)
    start = min(r[0] for r in rs)
    wall = max(r[0] + r[2] for r in rs) - start  # until the last first token
    return prefill_row(prompt_len, batch, wall, [r[2] for r in rs])


def decode_row(c, prompt_len, output_len, requests, toks, wall, tpot, ttft):
    mean_tpot = statistics.mean(tpot) if tpot else float("nan")
    return {"concurrency": c, "prompt_len": prompt_len, "output_len": output_len, "requests": requests,
            "output_tokens": toks, "wall_s": round(wall, 6), "output_tok_s": round(toks / wall, 2),
            "per_user_tok_s": round(1.0 / mean_tpot, 2) if tpot else None,
            "mean_tpot_ms": round(1e3 * mean_tpot, 3) if tpot else None,
            "mean_ttft_ms": round(1e3 * statistics.mean(ttft), 2), "p50_ttft_ms": round(1e3 * statistics.median(ttft), 2),
            "p99_ttft_ms": round(1e3 * percentile(ttft, 0.99), 2),
            "p50_tpot_ms": round(1e3 * percentile(tpot, 0.50), 3) if tpot else None,
            "p99_tpot_ms": round(1e3 * percentile(tpot, 0.99), 3) if tpot else None}


def percentile(xs, q):
    """The nearest-rank q-quantile (0 < q <= 1) of a non-empty list: the smallest value with at least
    q of the values at or below it (p99 of 256 requests is the 254th smallest)."""
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def prefill_row(prompt_len, batch, wall, ttft):
    return {"prompt_len": prompt_len, "batch": batch, "prompt_tokens": prompt_len * batch, "wall_s": round(wall, 6),
            "prefill_tok_s": round(prompt_len * batch / wall, 2), "mean_ttft_ms": round(1e3 * statistics.mean(ttft), 2),
            "p50_ttft_ms": round(1e3 * statistics.median(ttft), 2)}


class InProcess:
    """The same points through one deepinfer.LLM (no HTTP)."""

    def __init__(self, llm, vocab):
        self.llm, self.vocab = llm, vocab
        import deepinfer
        self.SP = deepinfer.SamplingParams

    def _wave(self, prompts, max_tokens):
        sp = self.SP(temperature=0, max_tokens=max_tokens, ignore_eos=True)
        t0 = time.monotonic()
        outs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], sp)
        return time.monotonic() - t0, outs

    def decode_point(self, c, prompt_len, output_len, rounds, seed=0):
        wall, toks, tpot, ttft = 0.0, 0, [], []
        for j in range(rounds):
            w, outs = self._wave([prompt_ids((seed, c, k, j), prompt_len, self.vocab) for k in range(c)], output_len)
            wall += w
            toks += sum(len(o.outputs[0].token_ids) for o in outs)
            tpot += [o.metrics.time_per_output_token for o in outs if o.metrics.time_per_output_token]
            ttft += [o.metrics.time_to_first_token for o in outs if o.metrics.time_to_first_token is not None]
        return decode_row(c, prompt_len, output_len, c * rounds, toks, wall, tpot, ttft)

    def prefill_point(self, prompt_len, batch, seed=0):
        prompts = [prompt_ids((seed, "prefill", prompt_len, batch, k), prompt_len, self.vocab) for k in range(batch)]
        wall, outs = self._wave(prompts, 1)
        ttft = [o.metrics.time_to_first_token for o in outs if o.metrics.time_to_first_token is not None]
        return prefill_row(prompt_len, batch, wall, ttft or [wall])
