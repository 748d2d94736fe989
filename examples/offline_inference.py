#!/usr/bin/env python3
"""Offline batched inference with DeepInfer's Python API (the shape vLLM users know).

    python3 examples/offline_inference.py            # the shipped default model (models/default)
    DEEPINFER_HF_MODEL_DIR=/path/to/model python3 examples/offline_inference.py
    python3 examples/offline_inference.py --model DIR --max-tokens 64

Needs the built library (./build.sh); set DEEPINFER_LIB if it is somewhere unusual.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python"))
from deepinfer import DeepInferError, LLM, SamplingParams  # noqa: E402

PROMPTS = [
    "Hello, my name is",
    "The capital of France is",
    "The future of AI is",
    "Once upon a time,",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model folder (default: $DEEPINFER_HF_MODEL_DIR, else models/default)")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--load-format", default="auto", help="auto, or dummy (random weights; for trying the API)")
    args = ap.parse_args()
    try:
        run(args)
    except (DeepInferError, FileNotFoundError, ValueError) as e:
        sys.exit(f"offline_inference: {e}")


def run(args):
    llm = LLM(model=args.model, load_format=args.load_format, quiet=False)
    params = SamplingParams(temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens,
                            seed=args.seed)
    if not llm.has_tokenizer:
        # a folder without tokenizer.json (bench/configs/*, say): prompts and outputs are token ids
        print("the model folder has no tokenizer.json: prompting with token ids\n")
        outputs = llm.generate([{"prompt_token_ids": [1, 2, 3 + i]} for i in range(len(PROMPTS))], params)
        for out in outputs:
            c = out.outputs[0]
            print(f"Prompt ids: {out.prompt_token_ids}\nGenerated ids: {list(c.token_ids)}  [{c.finish_reason}]\n")
    else:
        outputs = llm.generate(PROMPTS, params)
        for out in outputs:
            c = out.outputs[0]
            print(f"Prompt: {out.prompt!r}\nGenerated: {c.text!r}  [{c.finish_reason}, {len(c.token_ids)} tokens, "
                  f"ttft {1000 * (out.metrics.time_to_first_token or 0):.1f} ms]\n")
        chat = llm.chat([{"role": "user", "content": "Write one sentence about the sea."}],
                        SamplingParams(temperature=0, max_tokens=args.max_tokens))
        print(f"Chat: {chat[0].outputs[0].text!r}\n")
    s = llm.get_stats()
    print(f"stats: {s['prompt_tokens']} prompt tokens, {s['generated_tokens']} generated, "
          f"{s['generation_tokens_per_s']:.1f} tok/s, prefix-cache hit rate {s['prefix_cache_hit_rate']:.2f}, "
          f"KV blocks {s['kv_blocks_used']}/{s['kv_blocks_total']} used")
    llm.close()


if __name__ == "__main__":
    main()
