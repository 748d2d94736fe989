"""What the AIME, GPQA and HLE drivers share: the command line, judge selection, sampling the model,
judging every sample, pass@k, --resume, the results file, the summary table and the progress bar.

A benchmark module gives `NAME`, `load(path, args) -> (items, skipped)` (items: dicts with "id",
"prompt" (the messages), "question" (for the judge), "gold" (the reference as the judge sees it)), `rule_judge(item,
response) -> (extracted, correct)` (or None: no rule judge), optionally `add_arguments(parser)` and
`extra_metrics(items) -> dict`, and calls `main(benchmark)`.

Metrics: with n samples per item and c of them correct, pass@1 of an item is c / n (the mean over its
samples) and pass@k = 1 - C(n-c, k) / C(n, k) (the unbiased estimator of Chen et al. 2021, "Evaluating
Large Language Models Trained on Code"); `accuracy` is the mean pass@1 over the items judged and
`n_items` their number. The results file is rewritten (atomically) after every batch, so an
interrupted run continues with --resume: items whose id is already there with as many samples are
kept and not asked again.

Exit status: 0 done, 2 a bad dataset file or option (the message names it), 1 the model, its server
or the judge failed.
"""
import argparse
import concurrent.futures
import json
import math
import os
import sys
import time

import datafiles
import evalutil
import llm_judge
import model_client
from rule_judge import strip_reasoning

ROOT = model_client.ROOT


class UsageError(evalutil.TaskError):
    """A bad option or combination of options (exit status 2)."""


def parser(bench):
    p = argparse.ArgumentParser(prog=f"eval/{bench.NAME}/run.sh", description=bench.__doc__.splitlines()[0])
    p.add_argument("--data", default=os.environ.get("EVAL_DATA"), help="the dataset file (default: $EVAL_DATA)")
    p.add_argument("--output", default=None, help=f"results JSON (default: {bench.NAME}-results.json)")
    p.add_argument("--limit", type=int, default=None, help="only the first N usable items")
    p.add_argument("--samples", type=int, default=1, help="samples per item (pass@1 is their mean; pass@k reported)")
    p.add_argument("--judge", choices=("rule", "llm"), default=None,
                   help="default: llm when EVAL_JUDGE_URL, EVAL_JUDGE_MODEL and EVAL_JUDGE_API_KEY are set, else rule")
    p.add_argument("--resume", action="store_true", help="keep the items already in --output, ask only the rest")
    g = p.add_argument_group("the model: in-process (--model) or an OpenAI-compatible server (--base-url)")
    g.add_argument("--model", default=None, help="model folder (default: $DEEPINFER_HF_MODEL_DIR, else models/default)")
    g.add_argument("--base-url", default=None, help="OpenAI-compatible API base, e.g. http://127.0.0.1:8000/v1 "
                   "(key: $EVAL_API_KEY)")
    g.add_argument("--served-model-name", default=None, help="the model name sent to --base-url (default: the first of its GET /models)")
    g.add_argument("--accelerator", default=None, help="cpu or cuda (in-process; default: $DEEPINFER_ACCELERATOR, else cpu)")
    g.add_argument("--load-format", default="auto", help="auto or dummy (in-process)")
    g.add_argument("--threads", type=int, default=None, help="CPU threads (in-process)")
    g.add_argument("--num-kv-blocks", type=int, default=None, help="KV blocks (in-process; default: the engine's)")
    g.add_argument("--max-num-seqs", type=int, default=256, help="engine batch (in-process)")
    g.add_argument("--concurrency", type=int, default=16, help="parallel requests to --base-url")
    g.add_argument("--request-timeout", type=float, default=3600.0, help="seconds per request to --base-url")
    g.add_argument("--retries", type=int, default=3, help="retries of a failed request to --base-url")
    s = p.add_argument_group("sampling (DeepSeek-R1's evaluation settings by default)")
    s.add_argument("--temperature", type=float, default=0.6)
    s.add_argument("--top-p", type=float, default=0.95)
    s.add_argument("--max-tokens", type=int, default=None, help="new tokens per sample (default: up to the context)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--batch-size", type=int, default=64, help="items sent together (and saved after)")
    s.add_argument("--judge-concurrency", type=int, default=8, help="parallel LLM-judge calls")
    if hasattr(bench, "add_arguments"):
        bench.add_arguments(p)
    return p


def pass_at_k(n, c, k):
    """Unbiased pass@k of one item with n samples, c correct."""
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(n):
    ks, k = [], 1
    while k <= n:
        ks.append(k)
        k *= 2
    if ks[-1] != n:
        ks.append(n)
    return ks


def choose_judge(bench, args):
    """('rule', None) or ('llm', LLMJudge); UsageError when the asked judge cannot be had."""
    want = args.judge
    has_rule = bench.rule_judge is not None
    if want == "rule" and not has_rule:
        raise UsageError(f"{bench.NAME}: there is no rule judge (its answers are free-form); "
                         + llm_judge.missing_message(bench.NAME))
    if want == "llm" or (want is None and (llm_judge.configured() or not has_rule)):
        if not llm_judge.configured():
            raise UsageError(llm_judge.missing_message(f"{bench.NAME} with --judge llm" if want else bench.NAME))
        return "llm", llm_judge.LLMJudge()
    if want is None:
        print(f"{bench.NAME}: {', '.join(llm_judge.ENV_VARS)} not set: using the rule judge", file=sys.stderr)
    return "rule", None


def write_atomic(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=1, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def previous_items(path, bench, samples):
    """{id: item} of an earlier results file (for --resume)."""
    if not os.path.exists(path):
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            old = json.load(f)
    except (OSError, ValueError) as e:
        raise UsageError(f"--resume: {path} is not a results file: {e}") from None
    if old.get("benchmark") != bench.NAME:
        raise UsageError(f"--resume: {path} holds {old.get('benchmark')!r} results, not {bench.NAME!r}")
    return {str(it["id"]): it for it in old.get("items", []) if len(it.get("samples", [])) == samples}


def judge_samples(bench, kind, judge, item, samples, pool):
    """Adds extracted / correct (and the judge's fields) to each sample of one item."""
    futs = []
    for s in samples:
        s["answer_text"] = strip_reasoning(s["response"])
        if kind == "rule":
            s["extracted"], s["correct"] = bench.rule_judge(item, s["response"])
        else:
            futs.append((s, pool.submit(judge.judge, item["question"], s["answer_text"], item["gold"])))
    for s, f in futs:
        ok, fields = f.result()
        s["correct"] = bool(ok)
        s["extracted"] = fields.get("extracted_final_answer")
        s["judge"] = fields
    for s in samples:
        s["verdict"] = "correct" if s["correct"] else "wrong"


def summary_table(r):
    ks = [k for k in r["pass_at_k"]]
    head = ["benchmark", "items", "samples", "judge", "accuracy (pass@1)"] + [f"pass@{k}" for k in ks if k != "1"]
    row = [r["benchmark"], str(r["n_items"]), str(r["n_samples"]), r["judge"]["kind"], f"{r['accuracy']:.4f}"]
    row += [f"{r['pass_at_k'][k]:.4f}" for k in ks if k != "1"]
    for key, val in r.get("skipped", {}).items():
        head.append(f"skipped ({key})")
        row.append(str(val))
    if r.get("calibration_error") is not None:
        head.append("calibration error (%)")
        row.append(f"{r['calibration_error']:.1f}")
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|", "| " + " | ".join(row) + " |"]
    return "\n".join(lines)


def results_of(bench, args, data, kind, judge, model, items, skipped, n_rows, started):
    done = [it for it in items if "samples" in it]
    for it in done:
        c = sum(1 for s in it["samples"] if s["correct"])
        it["n_correct"] = c
        it["pass@1"] = c / len(it["samples"])
    n = args.samples
    p1 = [it["pass@1"] for it in done]
    res = {"benchmark": bench.NAME, "data": os.path.abspath(data),
           "accuracy": sum(p1) / len(p1) if p1 else 0.0, "accuracy_stderr": evalutil.mean_stderr(p1),
           "n_items": len(done), "n_samples": n,
           "pass_at_k": {str(k): (sum(pass_at_k(n, it["n_correct"], k) for it in done) / len(done) if done else 0.0)
                         for k in ks_for(n)},
           "n_rows": n_rows, "skipped": skipped,
           "judge": {"kind": "rule"} if kind == "rule" else judge.describe(),
           "model": model.describe() if model else None,
           "settings": {k: getattr(args, k) for k in ("temperature", "top_p", "max_tokens", "seed", "limit")},
           "time_s": round(time.time() - started, 3)}
    if hasattr(bench, "extra_metrics"):
        res.update(bench.extra_metrics(done))
    res["items"] = [{k: v for k, v in it.items() if not k.startswith("_")} for it in done]
    return res


def run(bench, argv):
    model_client.import_deepinfer()
    from deepinfer.progress import Bar
    args = parser(bench).parse_args(argv)
    if args.samples < 1:
        raise UsageError("--samples must be at least 1")
    if args.limit is not None and args.limit < 1:
        raise UsageError("--limit must be at least 1")
    started = time.time()
    kind, judge = choose_judge(bench, args)
    rows = datafiles.read_rows(args.data)
    items, skipped = bench.load(args.data, rows, args)
    if args.limit is not None:
        items = items[:args.limit]
    if not items:
        raise datafiles.DataError(f"{args.data}: no usable items (skipped: {skipped})")
    out = args.output or f"{bench.NAME}-results.json"
    prev = previous_items(out, bench, args.samples) if args.resume else {}
    todo = []
    for it in items:
        old = prev.get(str(it["id"]))
        if old is not None:
            it.update(old)
        else:
            todo.append(it)
    if prev:
        print(f"{bench.NAME}: --resume: {len(items) - len(todo)} item(s) already in {out}", file=sys.stderr)
    model = model_client.open_model(args) if todo else None
    bar = Bar(len(items), f"{bench.NAME}")
    bar.update(len(items) - len(todo))
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.judge_concurrency)) as pool:
            for b in range(0, len(todo), max(1, args.batch_size)):
                batch = todo[b:b + args.batch_size]
                outs = model.complete([(it["_index"], it["prompt"]) for it in batch])
                for it, samples in zip(batch, outs):
                    judge_samples(bench, kind, judge, it, samples, pool)
                    it["samples"] = samples
                write_atomic(out, results_of(bench, args, args.data, kind, judge, model, items, skipped, len(rows), started))
                bar.update(len(batch))
    finally:
        bar.close()
        if model:
            model.close()
    res = results_of(bench, args, args.data, kind, judge, model, items, skipped, len(rows), started)
    write_atomic(out, res)
    print(summary_table(res))
    print(f"results: {out}")
    return res


def main(bench):
    """Runs a benchmark from the command line with the exit statuses above."""
    evalutil.run(lambda argv: run(bench, argv), fatal=(llm_judge.JudgeError, RuntimeError, OSError))
