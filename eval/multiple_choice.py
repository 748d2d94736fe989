#!/usr/bin/env python3
"""Multiple-choice accuracy by log-likelihood, as lm-evaluation-harness scores multiple_choice tasks.

Each JSONL line: {"context": str, "choices": [str, ...], "gold": int, "target_delimiter": str
(optional, default " "), "id": any (optional, copied to the item)}. Every choice is scored as the
continuation target_delimiter + choice of the context (LLM.loglikelihood). acc: the choice of
highest log-likelihood is the gold one; acc_norm: the same after dividing each log-likelihood by the
choice's length in UTF-8 bytes. Ties go to the first choice.

Few-shot (--num-fewshot K), as lm-evaluation-harness builds it from one document set: for each item,
random.Random(--fewshot-seed).sample of K + 1 other items of the same file (the first K that are not
the item itself), each written as context + target_delimiter + its gold choice, joined and followed by
the item's context with --fewshot-delimiter (default a blank line). The generator is one per run, so
every item gets its own examples; the choices of an item share their context, which the engine's
prefix cache computes once.

    python3 eval/multiple_choice.py --tasks eval/tasks/multiple_choice.jsonl [--limit N] [--output r.json]
        [--num-fewshot K [--fewshot-seed S] [--fewshot-delimiter D]]
"""
import random
import time

import evalutil


def load_items(path, limit, default_delimiter):
    items = []
    for no, obj in evalutil.read_jsonl(path, limit):
        context = evalutil.field(path, no, obj, "context", str)
        choices = evalutil.field(path, no, obj, "choices", list)
        gold = evalutil.field(path, no, obj, "gold", int)
        delim = evalutil.field(path, no, obj, "target_delimiter", str, default_delimiter, required=False)
        if len(choices) < 2 or not all(isinstance(c, str) for c in choices):
            raise evalutil.TaskError(f"{path}:{no}: \"choices\" must be a list of at least two strings")
        if not 0 <= gold < len(choices):
            raise evalutil.TaskError(f"{path}:{no}: \"gold\" {gold} is not an index into the {len(choices)} choices")
        if any(not (delim + c) for c in choices):
            raise evalutil.TaskError(f"{path}:{no}: an empty choice (with an empty target_delimiter) has nothing to score")
        items.append({"line": no, "id": obj.get("id"), "context": context, "choices": choices, "gold": gold,
                      "target_delimiter": delim})
    return items


def with_fewshot(items, pool, k, seed, delimiter):
    """Each item's context with k examples from `pool` (all items of the file) in front; the chosen
    examples' line numbers go to the item as "fewshot"."""
    if k <= 0:
        return items
    if k >= len(pool):
        raise evalutil.TaskError(f"--num-fewshot {k} needs more than {k} items in the task file, it has {len(pool)}")
    rnd = random.Random(seed)
    out = []
    for it in items:
        shots = [ex for ex in rnd.sample(pool, k + 1) if ex["line"] != it["line"]][:k]
        demo = [ex["context"] + ex["target_delimiter"] + ex["choices"][ex["gold"]] for ex in shots]
        out.append(dict(it, context=delimiter.join(demo + [it["context"]]), fewshot=[ex["line"] for ex in shots]))
    return out


def argmax(xs):
    best = 0
    for i, x in enumerate(xs):
        if x > xs[best]:
            best = i
    return best


def score(items, lls):
    """Per-item predictions and the metrics. lls: per item, [(logprob, is_greedy)] per choice."""
    out, accs, norms = [], [], []
    for it, ll in zip(items, lls):
        lps = [lp for lp, _ in ll]
        normed = [lp / len(c.encode("utf-8")) for lp, c in zip(lps, it["choices"])]
        pred, pred_norm = argmax(lps), argmax(normed)
        acc, acc_norm = float(pred == it["gold"]), float(pred_norm == it["gold"])
        accs.append(acc)
        norms.append(acc_norm)
        out.append({"line": it["line"], "id": it["id"], "gold": it["gold"], "pred": pred, "pred_norm": pred_norm,
                    "acc": acc, "acc_norm": acc_norm, "logprobs": lps, "is_greedy": [g for _, g in ll]})
        if "fewshot" in it:
            out[-1]["fewshot"] = it["fewshot"]
    metrics = {"acc": evalutil.mean(accs), "acc_stderr": evalutil.mean_stderr(accs),
               "acc_norm": evalutil.mean(norms), "acc_norm_stderr": evalutil.mean_stderr(norms)}
    return metrics, out


def main(argv):
    p = evalutil.parser("Multiple-choice accuracy (acc, acc_norm) by log-likelihood of each choice.")
    p.add_argument("--target-delimiter", default=" ", help="between context and choice, for lines without "
                   "\"target_delimiter\" (default: a space)")
    p.add_argument("--num-fewshot", type=int, default=0, help="examples from the same file before each item (default 0)")
    p.add_argument("--fewshot-seed", type=int, default=1234, help="seed of the example sampling (default 1234)")
    p.add_argument("--fewshot-delimiter", default="\n\n", help="between examples and before the item (default a blank line)")
    args = p.parse_args(argv)
    if args.num_fewshot < 0:
        raise evalutil.TaskError(f"--num-fewshot must be >= 0, got {args.num_fewshot}")
    started = time.time()
    items = load_items(args.tasks, args.limit, args.target_delimiter)
    if args.num_fewshot:
        items = with_fewshot(items, load_items(args.tasks, None, args.target_delimiter), args.num_fewshot,
                             args.fewshot_seed, args.fewshot_delimiter)
    llm = evalutil.make_llm(args)
    reqs = [(it["context"], it["target_delimiter"] + c) for it in items for c in it["choices"]]
    flat = llm.loglikelihood(reqs)
    lls, k = [], 0
    for it in items:
        lls.append(flat[k:k + len(it["choices"])])
        k += len(it["choices"])
    metrics, per_item = score(items, lls)
    evalutil.finish(args, {"driver": "multiple_choice", "tasks": args.tasks, "model": llm.model_dir, "n": len(items),
                           "num_fewshot": args.num_fewshot, "metrics": metrics, "items": per_item}, started)
    llm.close()


if __name__ == "__main__":
    evalutil.run(main)
