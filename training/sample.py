#!/usr/bin/env python3
"""Sample generations of the shipped model for docs/default-model.md, computed the way the C engine
computes them (float32 on the CPU from the bf16 weights; full recompute each step, no cache).

Writes JSON: for each fixed prompt the prompt ids, the greedy continuation (ids, text, top-1 minus top-2
logit margin per step, so that a test can skip near-ties) and one sampled continuation (temperature 0.7,
top-p 0.95, torch CPU generator seeded 1234: illustrative, an engine's RNG differs). Chat prompts use
the chat template (BOS <｜User｜>question<｜Assistant｜>) and stop at EOS.

Usage: python3 training/sample.py [--model models/default] [--out tests/data/default-model/generations.json]
"""
import argparse, json, os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import load_hf  # noqa: E402
from train import CHAT_PROMPTS, SAMPLE_PROMPTS, generate  # noqa: E402


@torch.no_grad()
def greedy_with_margin(model, ids, n, stop=None):
    seq, margins = list(ids), []
    for _ in range(n):
        lg = model(torch.tensor([seq]))[0][0, -1].float()
        top = lg.topk(2)
        margins.append(round(float(top.values[0] - top.values[1]), 4))
        seq.append(int(top.indices[0]))
        if stop is not None and seq[-1] == stop:
            break
    return seq[len(ids):], margins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--out", default="tests/data/default-model/generations.json")
    ap.add_argument("--n", type=int, default=40)
    a = ap.parse_args()
    from tokenizers import Tokenizer
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    model = load_hf(a.model)
    tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
    g = torch.Generator().manual_seed(1234)
    out = []
    for p in SAMPLE_PROMPTS:
        ids = tok.encode(p).ids
        gids, margins = greedy_with_margin(model, ids, a.n)
        s = generate(model, ids, a.n, temperature=0.7, top_p=0.95, gen=g)[len(ids):]
        out.append({"prompt": p, "chat": False, "ids": ids, "greedy_ids": gids, "greedy_margin": margins,
                    "greedy_text": tok.decode(gids), "sampled_text": tok.decode(s)})
        print(json.dumps(out[-1]["prompt"]), "->", json.dumps(out[-1]["greedy_text"]), flush=True)
    for q in CHAT_PROMPTS:
        ids = [0, 3] + tok.encode(q, add_special_tokens=False).ids + [4]
        gids, margins = greedy_with_margin(model, ids, 64, stop=1)
        s = generate(model, ids, 64, temperature=0.7, top_p=0.95, gen=g, stop=1)[len(ids):]
        out.append({"prompt": q, "chat": True, "ids": ids, "greedy_ids": gids, "greedy_margin": margins,
                    "greedy_text": tok.decode(gids, skip_special_tokens=True),
                    "sampled_text": tok.decode(s, skip_special_tokens=True)})
        print(json.dumps(q), "->", json.dumps(out[-1]["greedy_text"]), flush=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
