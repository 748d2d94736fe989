#!/usr/bin/env python3
"""Generation accuracy: the model writes an answer to each prompt, the answer is matched.

Each JSONL line: {"prompt": str} (raw text, BOS as the tokenizer says) or {"messages": [{"role",
"content"}, ...]} (rendered with the model's chat template, generation prompt added), plus
"answer": str, "match": "exact" | "contains" | "regex" (default: --match, else "exact"),
"pattern": str (regex matching; default: --pattern), and optionally "stop": [str] and "max_tokens":
int for that line, "id": any. With o the generated text (stop strings removed) and a the answer:
  exact:    o.strip() == a.strip()
  contains: a in o
  regex:    the first match of the pattern in o (re.search); its first capture group (the whole
            match when the pattern has none), stripped, == a.strip(); no match is wrong.
Greedy decoding by default (--temperature 0).

    python3 eval/generation.py --tasks eval/tasks/generation.jsonl [--limit N] [--max-tokens 32] [--stop '\\n']
"""
import re
import time

import evalutil

MATCHES = ("exact", "contains", "regex")


def load_items(path, limit, args):
    items = []
    for no, obj in evalutil.read_jsonl(path, limit):
        prompt = evalutil.field(path, no, obj, "prompt", str, required=False)
        messages = evalutil.field(path, no, obj, "messages", list, required=False)
        if (prompt is None) == (messages is None):
            raise evalutil.TaskError(f"{path}:{no}: give exactly one of \"prompt\" and \"messages\"")
        if messages is not None and not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                            and isinstance(m.get("content"), str) for m in messages):
            raise evalutil.TaskError(f"{path}:{no}: \"messages\" must be a list of {{\"role\": str, \"content\": str}}")
        answer = evalutil.field(path, no, obj, "answer", str)
        match = evalutil.field(path, no, obj, "match", str, args.match, required=False)
        if match not in MATCHES:
            raise evalutil.TaskError(f"{path}:{no}: \"match\" must be one of {', '.join(MATCHES)}, got {match!r}")
        pattern = evalutil.field(path, no, obj, "pattern", str, args.pattern, required=False)
        regex = None
        if match == "regex":
            if pattern is None:
                raise evalutil.TaskError(f"{path}:{no}: regex matching needs a \"pattern\" (or --pattern)")
            try:
                regex = re.compile(pattern)
            except re.error as e:
                raise evalutil.TaskError(f"{path}:{no}: bad pattern {pattern!r}: {e}") from None
        stop = evalutil.field(path, no, obj, "stop", list, args.stop, required=False)
        if not all(isinstance(s, str) and s for s in stop):
            raise evalutil.TaskError(f"{path}:{no}: \"stop\" must be a list of non-empty strings")
        max_tokens = evalutil.field(path, no, obj, "max_tokens", int, args.max_tokens, required=False)
        if max_tokens < 1:
            raise evalutil.TaskError(f"{path}:{no}: \"max_tokens\" must be at least 1")
        items.append({"line": no, "id": obj.get("id"), "prompt": prompt, "messages": messages, "answer": answer,
                      "match": match, "regex": regex, "stop": stop, "max_tokens": max_tokens})
    return items


def judge(item, output):
    """(extracted, correct) for one generated text."""
    a = item["answer"]
    if item["match"] == "exact":
        return output.strip(), output.strip() == a.strip()
    if item["match"] == "contains":
        return None, a in output
    m = item["regex"].search(output)
    if not m:
        return None, False
    got = (m.group(1) if item["regex"].groups else m.group(0)) or ""
    return got.strip(), got.strip() == a.strip()


def main(argv):
    p = evalutil.parser("Generation accuracy: greedy answers matched exactly, by containment or by a regex.")
    p.add_argument("--max-tokens", type=int, default=32, help="new tokens at most (default 32)")
    p.add_argument("--stop", action="append", default=[], help="a stop string (repeatable)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    p.add_argument("--seed", type=int, default=0, help="sampling seed when --temperature > 0")
    p.add_argument("--match", default="exact", choices=MATCHES, help="for lines without \"match\"")
    p.add_argument("--pattern", default=None, help="regex for lines without \"pattern\"")
    args = p.parse_args(argv)
    if args.max_tokens < 1:
        p.error("--max-tokens must be at least 1")
    started = time.time()
    items = load_items(args.tasks, args.limit, args)
    deepinfer = evalutil.import_deepinfer()
    llm = evalutil.make_llm(args)

    def params(it):
        return deepinfer.SamplingParams(temperature=args.temperature, seed=args.seed, max_tokens=it["max_tokens"],
                                        stop=it["stop"] or None)
    outputs = [None] * len(items)
    raw = [i for i, it in enumerate(items) if it["prompt"] is not None]
    chat = [i for i, it in enumerate(items) if it["messages"] is not None]
    if raw:
        for i, o in zip(raw, llm.generate([items[i]["prompt"] for i in raw], [params(items[i]) for i in raw])):
            outputs[i] = o.outputs[0]
    if chat:
        for i, o in zip(chat, llm.chat([items[i]["messages"] for i in chat], [params(items[i]) for i in chat])):
            outputs[i] = o.outputs[0]
    per_item, correct = [], []
    for it, out in zip(items, outputs):
        if out.finish_reason == "error":
            raise evalutil.TaskError(f"{args.tasks}:{it['line']}: the request failed: {out.error}")
        extracted, ok = judge(it, out.text)
        correct.append(float(ok))
        per_item.append({"line": it["line"], "id": it["id"], "output": out.text, "extracted": extracted,
                         "answer": it["answer"], "match": it["match"], "correct": ok,
                         "finish_reason": out.finish_reason, "n_tokens": len(out.token_ids)})
    metrics = {"accuracy": evalutil.mean(correct), "accuracy_stderr": evalutil.mean_stderr(correct)}
    for kind in MATCHES:
        sub = [c for c, it in zip(correct, items) if it["match"] == kind]
        if sub:
            metrics[f"accuracy_{kind}"] = evalutil.mean(sub)
    evalutil.finish(args, {"driver": "generation", "tasks": args.tasks, "model": llm.model_dir, "n": len(items),
                           "config": {"max_tokens": args.max_tokens, "stop": args.stop, "temperature": args.temperature,
                                      "seed": args.seed},
                           "metrics": metrics, "items": per_item}, started)
    llm.close()


if __name__ == "__main__":
    evalutil.run(main)
