#!/usr/bin/env python3
"""Reference fixtures for the default model, and the check that training/model.py == transformers.

Loads the HF folder twice: with transformers' DeepseekV3ForCausalLM (float32, eager attention, CPU) for
the main logits, and with training/model.py for the MTP module (transformers has none). Prints the
relative L2 difference between the two main-model forwards (must be ~1e-6) and writes:
  golden.safetensors      pN.ids I32 [T], pN.logits F32 [T, V], pN.greedy I32 [12], pN.margin F32 [12]
  mtp_golden.safetensors  pN.ids I32 [T], pN.hidden F32 [T, H] (final hidden after model.norm),
                          pN.mtp_logits F32 [T-1, V] (row i uses h[i] and ids[i+1])

Usage: python3 training/make_golden.py [--model models/default] [--out tests/data/default-model]
"""
import argparse, json, os, sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import load_hf  # noqa: E402

PROMPTS = [
    "The",
    "In the beginning God created the heaven and the earth.",
    "A dictionary is a book that lists the words of a language and explains what they mean. "
    "The word \"apple\" is a noun.",
]


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--out", default="tests/data/default-model")
    ap.add_argument("--ids", default=None, help="JSON list of id lists to use instead of the tokenized prompts")
    a = ap.parse_args()
    torch.manual_seed(0)
    from safetensors.torch import save_file
    from transformers import DeepseekV3ForCausalLM

    if a.ids:
        prompts = json.loads(a.ids)
    else:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(a.model, "tokenizer.json"))
        prompts = [tok.encode(p).ids for p in PROMPTS]  # BOS prepended by the post-processor
    hf = DeepseekV3ForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32, attn_implementation="eager").eval()
    own = load_hf(a.model)
    gold, mtp = {}, {}
    worst = 0.0
    with torch.no_grad():
        for n, ids in enumerate(prompts):
            x = torch.tensor([ids])
            ref = hf(x).logits[0].float()
            h = own.hidden(x)
            mine = own.lm_head(h)[0]
            err = rel(mine, ref)
            worst = max(worst, err)
            print(f"p{n}: T={len(ids)} rel L2(own forward, transformers) = {err:.3e}")
            gold[f"p{n}.ids"] = torch.tensor(ids, dtype=torch.int32)
            gold[f"p{n}.logits"] = ref.contiguous()
            seq, greedy, margin = list(ids), [], []
            for _ in range(12):
                lg = hf(torch.tensor([seq])).logits[0, -1].float()
                top = lg.topk(2)
                greedy.append(int(top.indices[0]))
                margin.append(float(top.values[0] - top.values[1]))
                seq.append(greedy[-1])
            gold[f"p{n}.greedy"] = torch.tensor(greedy, dtype=torch.int32)
            gold[f"p{n}.margin"] = torch.tensor(margin, dtype=torch.float32)
            mtp[f"p{n}.ids"] = gold[f"p{n}.ids"]
            mtp[f"p{n}.hidden"] = h[0].contiguous()
            if len(ids) > 1:
                mtp[f"p{n}.mtp_logits"] = own.lm_head(own.mtp_hidden(h, x))[0].contiguous()
    os.makedirs(a.out, exist_ok=True)
    save_file(gold, os.path.join(a.out, "golden.safetensors"))
    save_file(mtp, os.path.join(a.out, "mtp_golden.safetensors"))
    print(f"worst rel L2 = {worst:.3e}", "OK" if worst < 1e-5 else "MISMATCH")
    return 0 if worst < 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
