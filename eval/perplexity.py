#!/usr/bin/env python3
"""Perplexity of the model on texts (lm-evaluation-harness's loglikelihood_rolling metrics).

--tasks FILE: a .jsonl file of {"text": str} documents (one per line, "id" optional), or any other
file read as one UTF-8 text. Each document is scored with LLM.loglikelihood_rolling: every token
predicted once, in disjoint windows of at most --max-length tokens (default: the model's context - 1),
the first window after BOS. With LL the summed log-likelihood (natural log) over all documents, and
T, B, W their total tokens, UTF-8 bytes and whitespace-separated words:
  token_perplexity = exp(-LL / T)      bits_per_byte = -LL / (B ln 2)
  byte_perplexity  = exp(-LL / B)      word_perplexity = exp(-LL / W)

    python3 eval/perplexity.py --tasks eval/tasks/perplexity.jsonl [--limit N] [--max-length 512]
"""
import math
import time

import evalutil


def load_docs(path, limit):
    if path.endswith(".jsonl"):
        docs = []
        for no, obj in evalutil.read_jsonl(path, limit):
            text = evalutil.field(path, no, obj, "text", str)
            if not text:
                raise evalutil.TaskError(f"{path}:{no}: empty \"text\"")
            docs.append({"line": no, "id": obj.get("id"), "text": text})
        return docs
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise evalutil.TaskError(f"{path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise evalutil.TaskError(f"{path}: not UTF-8 text ({e})") from None
    if not text:
        raise evalutil.TaskError(f"{path}: empty file")
    return [{"line": None, "id": None, "text": text}]


def metrics_of(per_doc):
    ll = sum(d["logprob"] for d in per_doc)
    T = sum(d["n_tokens"] for d in per_doc)
    B = sum(d["n_bytes"] for d in per_doc)
    W = sum(d["n_words"] for d in per_doc)
    return {"logprob": ll, "tokens": T, "bytes": B, "words": W,
            "nll_per_token": -ll / T, "token_perplexity": math.exp(-ll / T),
            "bits_per_byte": -ll / (B * math.log(2)), "byte_perplexity": math.exp(-ll / B),
            "word_perplexity": math.exp(-ll / W) if W else None}


def main(argv):
    p = evalutil.parser("Token perplexity, bits per byte and word perplexity of texts.")
    p.add_argument("--max-length", type=int, default=None,
                   help="tokens fed per window (default: the model's context - 1)")
    args = p.parse_args(argv)
    started = time.time()
    docs = load_docs(args.tasks, args.limit)
    llm = evalutil.make_llm(args)
    lls = llm.loglikelihood_rolling([d["text"] for d in docs], max_length=args.max_length)
    per_doc = []
    for d, ll in zip(docs, lls):
        n_tokens = len(llm.encode(d["text"]))
        per_doc.append({"line": d["line"], "id": d["id"], "logprob": ll, "n_tokens": n_tokens,
                        "n_bytes": len(d["text"].encode("utf-8")), "n_words": len(d["text"].split())})
    evalutil.finish(args, {"driver": "perplexity", "tasks": args.tasks, "model": llm.model_dir, "n": len(docs),
                           "config": {"max_length": args.max_length},  # None: the model's context - 1
                           "metrics": metrics_of(per_doc), "items": per_doc}, started)
    llm.close()


if __name__ == "__main__":
    evalutil.run(main)
