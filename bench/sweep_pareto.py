#!/usr/bin/env python3
"""Throughput/latency sweep with a Pareto plot (not a test).

For each concurrency c, one engine with max_num_seqs = c serves 3*c identical-length requests
(random token prompts, greedy, ignore_eos) so the batch stays at c; we record aggregate output
tokens/s and the per-user decode speed 1 / mean(time per output token), plus mean time to first token.
Writes sweep.csv and pareto.svg (per-user tok/s against aggregate tok/s, the frontier drawn) into --out.
The plot is plain SVG written here: no plotting library needed.

    python3 bench/sweep_pareto.py --model models/default --concurrency 1,2,4,8,16,32,64 --out /tmp/sweep
    python3 bench/sweep_pareto.py --model bench/configs/v2-lite.json-dir --load-format dummy --accelerator cuda
"""
import argparse
import csv
import os
import random
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))
from deepinfer import LLM, SamplingParams  # noqa: E402


def measure(args, c):
    llm = LLM(args.model, max_num_seqs=c, load_format=args.load_format, accelerator=args.accelerator,
              threads=args.threads, enable_prefix_caching=False, quiet=True)
    rng = random.Random(c)
    vocab = args.vocab
    prompts = [{"prompt_token_ids": [rng.randrange(3, vocab) for _ in range(args.prompt_len)]} for _ in range(3 * c)]
    sp = SamplingParams(temperature=0, max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp)
    wall = time.perf_counter() - t0
    llm.close()
    toks = sum(len(o.outputs[0].token_ids) for o in outs)
    tpot = [o.metrics.time_per_output_token for o in outs if o.metrics.time_per_output_token]
    ttft = [o.metrics.time_to_first_token for o in outs if o.metrics.time_to_first_token is not None]
    mean_tpot = sum(tpot) / len(tpot)
    return {"concurrency": c, "requests": len(outs), "output_tokens": toks, "wall_s": round(wall, 4),
            "throughput_tok_s": round(toks / wall, 2), "per_user_tok_s": round(1.0 / mean_tpot, 2),
            "mean_tpot_ms": round(1e3 * mean_tpot, 3), "mean_ttft_ms": round(1e3 * sum(ttft) / len(ttft), 3)}


def pareto(rows):
    """Points not dominated in (throughput, per-user speed), sorted by throughput."""
    front = [r for r in rows if not any(o["throughput_tok_s"] >= r["throughput_tok_s"] and
                                        o["per_user_tok_s"] >= r["per_user_tok_s"] and o is not r and
                                        (o["throughput_tok_s"], o["per_user_tok_s"]) !=
                                        (r["throughput_tok_s"], r["per_user_tok_s"]) for o in rows)]
    return sorted(front, key=lambda r: r["throughput_tok_s"])


def svg(rows, title):
    W, H, M = 640, 440, 60
    xs = [r["throughput_tok_s"] for r in rows]
    ys = [r["per_user_tok_s"] for r in rows]
    xmax, ymax = max(xs) * 1.1, max(ys) * 1.1

    def px(x):
        return M + (W - 2 * M) * x / xmax

    def py(y):
        return H - M - (H - 2 * M) * y / ymax

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="24" text-anchor="middle" font-size="14">{title}</text>',
           f'<line x1="{M}" y1="{H - M}" x2="{W - M}" y2="{H - M}" stroke="black"/>',
           f'<line x1="{M}" y1="{M}" x2="{M}" y2="{H - M}" stroke="black"/>',
           f'<text x="{W / 2}" y="{H - 20}" text-anchor="middle">aggregate output tokens/s</text>',
           f'<text x="18" y="{H / 2}" text-anchor="middle" transform="rotate(-90 18 {H / 2})">tokens/s per user</text>']
    for i in range(6):
        xv, yv = xmax * i / 5, ymax * i / 5
        out.append(f'<text x="{px(xv):.1f}" y="{H - M + 16}" text-anchor="middle">{xv:.0f}</text>')
        out.append(f'<text x="{M - 6}" y="{py(yv) + 4:.1f}" text-anchor="end">{yv:.0f}</text>')
    front = pareto(rows)
    if len(front) > 1:
        pts = " ".join(f"{px(r['throughput_tok_s']):.1f},{py(r['per_user_tok_s']):.1f}" for r in front)
        out.append(f'<polyline points="{pts}" fill="none" stroke="#c33" stroke-width="2"/>')
    for r in rows:
        x, y = px(r["throughput_tok_s"]), py(r["per_user_tok_s"])
        out.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="#36c"/>')
        out.append(f'<text x="{x + 6:.1f}" y="{y - 6:.1f}">c={r["concurrency"]}</text>')
    out.append("</svg>")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    ap.add_argument("--load-format", default="auto")
    ap.add_argument("--accelerator", default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--vocab", type=int, default=8000, help="prompt ids are drawn below this")
    ap.add_argument("--concurrency", default="1,2,4,8,16,32")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--out", default="sweep-out")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for c in [int(x) for x in args.concurrency.split(",")]:
        r = measure(args, c)
        rows.append(r)
        print(r, flush=True)
    with open(os.path.join(args.out, "sweep.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    title = f"{os.path.basename(os.path.normpath(args.model))} ({args.accelerator or 'cpu'}): prompt {args.prompt_len}, output {args.max_tokens}"
    with open(os.path.join(args.out, "pareto.svg"), "w") as f:
        f.write(svg(rows, title))
    print("wrote", os.path.join(args.out, "sweep.csv"), "and pareto.svg")


if __name__ == "__main__":
    main()
