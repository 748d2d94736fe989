"""What the eval/ drivers share: the command line (--model, --tasks, --limit, --output, ...), reading a
JSONL task file with errors that name the line, the standard error of a mean, and writing results.
The drivers import it as a sibling module (python3 eval/<driver>.py puts eval/ on sys.path).
"""
import argparse
import json
import math
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class TaskError(Exception):
    """A task file that cannot be used; the message names the file and line."""


def import_deepinfer():
    """The deepinfer package: installed, else the repository's python/ folder."""
    try:
        import deepinfer  # noqa: F401
    except ImportError:
        sys.path.insert(0, os.path.join(ROOT, "python"))
    import deepinfer
    return deepinfer


def parser(description):
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--model", default=None,
                   help="model folder (default: $DEEPINFER_HF_MODEL_DIR, else the shipped models/default)")
    p.add_argument("--tasks", required=True, help="task file")
    p.add_argument("--limit", type=int, default=None, help="use only the first N items")
    p.add_argument("--output", default=None, help="write the full results (metrics and every item) to this JSON file")
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    p.add_argument("--accelerator", default=None, help="cpu or cuda (default: $DEEPINFER_ACCELERATOR, else cpu)")
    return p


def make_llm(args):
    deepinfer = import_deepinfer()
    return deepinfer.LLM(args.model, threads=args.threads, accelerator=args.accelerator)


def read_jsonl(path, limit=None):
    """[(line_number, object)] of the non-blank lines, at most `limit` of them."""
    items = []
    try:
        with open(path, encoding="utf-8") as f:
            for no, line in enumerate(f, 1):
                if limit is not None and len(items) >= limit:
                    break
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except ValueError as e:
                    raise TaskError(f"{path}:{no}: not JSON: {e}") from None
                if not isinstance(obj, dict):
                    raise TaskError(f"{path}:{no}: each line must be a JSON object")
                items.append((no, obj))
    except OSError as e:
        raise TaskError(f"{path}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise TaskError(f"{path}: not UTF-8 text ({e})") from None
    if not items:
        raise TaskError(f"{path}: no items")
    return items


def field(path, no, obj, key, types, default=None, required=True):
    """obj[key] checked against `types` (a type or tuple); a TaskError naming the line otherwise."""
    if key not in obj:
        if required:
            raise TaskError(f"{path}:{no}: missing \"{key}\"")
        return default
    v = obj[key]
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(v, allowed) or (isinstance(v, bool) and bool not in allowed):  # bool is an int
        raise TaskError(f"{path}:{no}: \"{key}\" has the wrong type ({type(v).__name__})")
    return v


def mean(xs):
    return sum(xs) / len(xs) if xs else None


def mean_stderr(xs):
    """Standard error of the mean: sample standard deviation (n - 1) / sqrt(n), as
    lm-evaluation-harness reports it; None for fewer than two values."""
    n = len(xs)
    if n < 2:
        return None
    m = sum(xs) / n
    var = sum((x - m) ** 2 for x in xs) / (n - 1)
    return math.sqrt(var / n)


def finish(args, results, started):
    """Adds timing, writes the full results to --output, prints the summary (everything but the
    items) as JSON on stdout."""
    results["time_s"] = round(time.time() - started, 3)
    if args.output:
        with open(args.output, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=1, ensure_ascii=False)
            f.write("\n")
    summary = {k: v for k, v in results.items() if k != "items"}
    print(json.dumps(summary, indent=1, ensure_ascii=False))


def run(main, fatal=()):
    """Runs a driver's main(argv), turning task-file problems (TaskError) and library errors (and the
    exception types in `fatal`) into an exit status 2 / 1 with a one-line message."""
    try:
        main(sys.argv[1:])
    except TaskError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    except fatal as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except Exception as e:  # the library's errors (DeepInferError) and bad model folders
        if type(e).__name__ not in ("DeepInferError", "FileNotFoundError", "ValueError"):
            raise
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
