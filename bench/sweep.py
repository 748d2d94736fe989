#!/usr/bin/env python3
"""Throughput/latency Pareto sweep of `deepinfer serve` (or the engine in-process), with other engines'
points in the same plots. bench/run_sweep.sh is the front door; this is what it runs.

One server for the whole sweep, started as users start it (`deepinfer serve MODEL --port 0 ...`), its
KV pool sized for the largest point (--num-kv-blocks: every sequence of the largest concurrency or
prefill batch holds its prompt and output at once, plus 10 %), max-num-seqs and max-connections as
large as the largest point. Then:
  - a decode sweep over --concurrency (aggregate output tok/s against per-user tok/s),
  - a prefill sweep over --prompt-lens x --prefill-batches (prefill tok/s against TTFT),
measured by bench/sweep_measure.py; each --compare server is measured by the same client, and
llama.cpp's llama-batched-bench output (--llama-batched-bench FILE) is read as a further engine.
Writes into --out: decode.csv, prefill.csv (an `engine` column), sweep.json (the rows plus the
machine, the commit, the settings, the server command and its start-up time) and decode.png /
prefill.png (bench/sweep_plot.py; matplotlib from bench/requirements.txt, checked before the sweep
starts unless --no-plots).
"""
import argparse
import csv
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "python"))
import llama_batched_bench  # noqa: E402
import sweep_measure  # noqa: E402
import sweep_plot  # noqa: E402

BLOCK = 64  # DI_KV_BLOCK_SIZE (src/backend/backend.h)


def int_list(s):
    try:
        return [int(x) for x in s.replace(" ", "").split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {s!r}") from None


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=os.path.join(ROOT, "models", "default"),
                   help="model folder, or a config.json file (a shape for --load-format dummy)")
    p.add_argument("--accelerator", default="cpu")
    p.add_argument("--load-format", default="auto")
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens of the decode sweep")
    p.add_argument("--output-len", type=int, default=128, help="output tokens of the decode sweep")
    p.add_argument("--concurrency", type=int_list, default=int_list("1,2,4,8,16,32,64,128,256,512"))
    p.add_argument("--prompt-lens", type=int_list, default=int_list("128,512,2048,8192"))
    p.add_argument("--prefill-batches", type=int_list, default=int_list("1,4,16"))
    p.add_argument("--rounds", type=int, default=2, help="requests per client at each decode point")
    p.add_argument("--out", default="sweep-out")
    p.add_argument("--compare", action="append", default=[], metavar="[LABEL=]URL",
                   help="an OpenAI-compatible server measured the same way (repeatable)")
    p.add_argument("--compare-model", default=None, help="the model name sent to --compare servers")
    p.add_argument("--llama-batched-bench", action="append", default=[], metavar="[LABEL=]FILE",
                   help="llama-batched-bench output to plot as another engine (repeatable)")
    p.add_argument("--in-process", action="store_true", help="the engine through the Python binding, no server")
    p.add_argument("--no-deepinfer", action="store_true", help="measure only the --compare / llama.cpp engines")
    p.add_argument("--deepinfer", default=os.environ.get("DEEPINFER_CLI", os.path.join(ROOT, "build", "deepinfer")),
                   help="the deepinfer executable (default: $DEEPINFER_CLI, else build/deepinfer)")
    p.add_argument("--serve-args", default="", help="more `deepinfer serve` flags (one string)")
    p.add_argument("--num-kv-blocks", type=int, default=None, help="override the KV sizing")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--vocab", type=int, default=None, help="prompt ids are drawn below this (default: the model's)")
    p.add_argument("--client-procs", type=int, default=min(8, os.cpu_count() or 1),
                   help="client processes the decode clients are spread over")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument("--no-plots", action="store_true", help="CSV and JSON only (no matplotlib needed)")
    p.add_argument("--replot", metavar="DIR", default=None,
                   help="measure nothing: draw the plots from DIR/sweep.json into --out (default DIR)")
    return p.parse_args(argv)


def labeled(spec, default):
    m = re.match(r"^([A-Za-z0-9_.\- ()]+)=(.+)$", spec)
    if m and "://" not in m.group(1):
        return m.group(1), m.group(2)
    return default, spec


def model_dir_of(path, tmp):
    """A folder for a config.json file given as --model (the dummy shapes in bench/configs)."""
    if os.path.isfile(path):
        d = os.path.join(tmp, "model")
        os.makedirs(d, exist_ok=True)
        shutil.copy(path, os.path.join(d, "config.json"))
        return d
    return path


def model_config(d):
    try:
        with open(os.path.join(d, "config.json")) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise SystemExit(f"sweep: {d}: no readable config.json ({e})")


def kv_blocks(args):
    need = [c * math.ceil((args.prompt_len + args.output_len + 1) / BLOCK) for c in args.concurrency]
    need += [b * math.ceil((L + 1) / BLOCK) for L in args.prompt_lens for b in args.prefill_batches]
    return int(max(need + [1]) * 1.1) + 16


def machine():
    info = {"host": platform.node(), "os": platform.platform(), "python": platform.python_version(),
            "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.+)", f.read())
            info["cpu"] = m.group(1).strip() if m else None
        with open("/proc/meminfo") as f:
            m = re.search(r"MemTotal:\s*(\d+) kB", f.read())
            info["memory_gib"] = round(int(m.group(1)) / 2 ** 20, 1) if m else None
    except OSError:
        pass
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True, timeout=20)
        if r.returncode == 0:
            info["gpus"] = [l.strip() for l in r.stdout.splitlines() if l.strip()]
    except (OSError, subprocess.SubprocessError):
        pass
    return info


def commit():
    def git(*a):
        r = subprocess.run(["git", "-C", ROOT, *a], capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else None
    head = git("rev-parse", "HEAD")
    return {"commit": head, "dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if head else None}


class Server:
    """`deepinfer serve` on a free loopback port, stopped with SIGTERM at the end."""

    def __init__(self, args, model_dir, blocks, max_seqs, log_path):
        self.cmd = [args.deepinfer, "serve", model_dir, "--host", "127.0.0.1", "--port", "0",
                    "--load-format", args.load_format, "--accelerator", args.accelerator,
                    "--max-num-seqs", str(max_seqs), "--num-kv-blocks", str(blocks),
                    "--max-connections", str(max_seqs + 64), "--disable-log-requests"]
        if args.threads:
            self.cmd += ["--threads", str(args.threads)]
        self.cmd += args.serve_args.split()
        self.log_path = log_path
        self.log = open(log_path, "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self.log)
        self.url = None
        while time.monotonic() - t0 < args.startup_timeout:
            if self.proc.poll() is not None:
                break
            with open(log_path) as f:
                m = re.search(r"listening on (http://\S+)", f.read())
            if m:
                self.url = m.group(1)
                break
            time.sleep(0.1)
        self.startup_s = round(time.monotonic() - t0, 2)
        if not self.url:
            self.stop()
            with open(log_path) as f:
                tail = f.read()[-2000:]
            raise SystemExit(f"sweep: the server did not start ({' '.join(self.cmd)}):\n{tail}")

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def write_csv(path, rows):
    keys = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def save(results, out):
    """decode.csv, prefill.csv and sweep.json as they stand (rewritten after every point, so a run
    cut short by a time limit keeps what it measured)."""
    write_csv(os.path.join(out, "decode.csv"), results["decode"])
    write_csv(os.path.join(out, "prefill.csv"), results["prefill"])
    tmp = os.path.join(out, "sweep.json.tmp")
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
        f.write("\n")
    os.replace(tmp, os.path.join(out, "sweep.json"))


def sweep_engine(name, bar, decode_fn, prefill_fn, args, results):
    for c in args.concurrency:
        row = {"engine": name, **decode_fn(c)}
        results["decode"].append(row)
        save(results, args.out)
        bar.update(1, f"{name} c={c}: {row['output_tok_s']} tok/s")
    for L in args.prompt_lens:
        for b in args.prefill_batches:
            row = {"engine": name, **prefill_fn(L, b)}
            results["prefill"].append(row)
            save(results, args.out)
            bar.update(1, f"{name} prefill {L}x{b}: {row['prefill_tok_s']} tok/s")


def plots(results, out):
    """decode.png and prefill.png in `out` from a results dict (sweep.json's contents)."""
    def series(kind):
        d = {}
        for r in results[kind]:
            d.setdefault(r["engine"], []).append(r)
        return d
    st = results["settings"]
    where = ", ".join(results["machine"].get("gpus") or [results["machine"].get("cpu") or ""])
    title = (f"{os.path.basename(os.path.normpath(st['model']))} ({st['accelerator']}, {st['load_format']} weights) on "
             f"{where}; commit {(results['commit'] or '?')[:10]}")
    sweep_plot.decode_plot(os.path.join(out, "decode.png"), series("decode"),
                           f"prompt {st['prompt_len']} + output {st['output_len']} tokens; " + title)
    sweep_plot.prefill_plot(os.path.join(out, "prefill.png"), series("prefill"), title)


def main(argv):
    args = parse_args(argv)
    if not args.no_plots:
        try:
            sweep_plot._plt()
        except sweep_plot.PlotUnavailable as e:
            raise SystemExit(f"sweep: {e} (or --no-plots for CSV and JSON only)")
    if args.replot:
        try:
            with open(os.path.join(args.replot, "sweep.json")) as f:
                results = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"sweep: --replot: {e}")
        out = args.out if args.out != "sweep-out" else args.replot
        os.makedirs(out, exist_ok=True)
        plots(results, out)
        print(f"sweep: wrote {out}/decode.png, prefill.png")
        return
    from deepinfer.progress import Bar
    os.makedirs(args.out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="di-sweep-")
    model_dir = model_dir_of(args.model, tmp)
    cfg = model_config(model_dir)
    ctx = int(cfg.get("max_position_embeddings") or 1 << 30)
    vocab = args.vocab or int(cfg.get("vocab_size") or 8000)
    if args.prompt_len + args.output_len > ctx:
        raise SystemExit(f"sweep: --prompt-len + --output-len ({args.prompt_len + args.output_len}) exceed the "
                         f"model's context ({ctx})")
    dropped = [L for L in args.prompt_lens if L + 1 > ctx]
    if dropped:
        print(f"sweep: prompt lengths {dropped} do not fit the model's context ({ctx}): left out", file=sys.stderr)
        args.prompt_lens = [L for L in args.prompt_lens if L + 1 <= ctx]
    blocks = args.num_kv_blocks or kv_blocks(args)
    max_seqs = max(args.concurrency + args.prefill_batches + [1])
    results = {"machine": machine(), **commit(), "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
               "settings": {k: v for k, v in vars(args).items()}, "model_type": cfg.get("model_type"),
               "num_kv_blocks": blocks, "max_num_seqs": max_seqs, "decode": [], "prefill": [], "engines": {}}
    compares = [labeled(s, f"compare{i + 1}" if len(args.compare) > 1 else "compare") for i, s in enumerate(args.compare)]
    llamas = [labeled(s, "llama.cpp") for s in args.llama_batched_bench]
    n_points = len(args.concurrency) + len(args.prompt_lens) * len(args.prefill_batches)
    bar = Bar(n_points * ((0 if args.no_deepinfer else 1) + len(compares)), "sweep")
    try:
        if not args.no_deepinfer and args.in_process:
            import deepinfer
            llm = deepinfer.LLM(model_dir, max_num_seqs=max_seqs, num_kv_blocks=blocks, load_format=args.load_format,
                                accelerator=args.accelerator, threads=args.threads, quiet=True)
            ip = sweep_measure.InProcess(llm, vocab)
            ip.decode_point(1, 8, 4, 1)  # warm-up
            results["engines"]["deepinfer"] = {"kind": "in-process", "model": model_dir}
            sweep_engine("deepinfer", bar, lambda c: ip.decode_point(c, args.prompt_len, args.output_len, args.rounds),
                         lambda L, b: ip.prefill_point(L, b), args, results)
            llm.close()
        elif not args.no_deepinfer:
            srv = Server(args, model_dir, blocks, max_seqs, os.path.join(args.out, "serve.log"))
            try:
                t = sweep_measure.Target(srv.url)
                sweep_measure.decode_point(t, 1, 8, 4, 1, vocab, 1)  # warm-up
                results["engines"]["deepinfer"] = {"kind": "server", "command": srv.cmd, "startup_s": srv.startup_s}
                save(results, args.out)
                sweep_engine("deepinfer", bar,
                             lambda c: sweep_measure.decode_point(t, c, args.prompt_len, args.output_len, args.rounds,
                                                                  vocab, args.client_procs),
                             lambda L, b: sweep_measure.prefill_point(t, L, b, vocab, args.client_procs), args, results)
            finally:
                srv.stop()
        for name, url in compares:
            t = sweep_measure.Target(url, args.compare_model, os.environ.get("COMPARE_API_KEY"))
            sweep_measure.decode_point(t, 1, 8, 4, 1, vocab, 1)
            results["engines"][name] = {"kind": "server", "base_url": url, "model": args.compare_model}
            sweep_engine(name, bar,
                         lambda c: sweep_measure.decode_point(t, c, args.prompt_len, args.output_len, args.rounds,
                                                              vocab, args.client_procs),
                         lambda L, b: sweep_measure.prefill_point(t, L, b, vocab, args.client_procs), args, results)
    finally:
        bar.close()
        shutil.rmtree(tmp, ignore_errors=True)
    for name, path in llamas:
        try:
            with open(path, encoding="utf-8") as f:
                dec, pre = llama_batched_bench.parse(f.read())
        except OSError as e:
            raise SystemExit(f"sweep: --llama-batched-bench {path}: {e.strerror or e}")
        if not dec and not pre:
            raise SystemExit(f"sweep: --llama-batched-bench {path}: no llama-batched-bench table rows in it")
        results["engines"][name] = {"kind": "llama-batched-bench", "file": os.path.abspath(path)}
        results["decode"] += [{"engine": name, **r} for r in dec]
        results["prefill"] += [{"engine": name, **r} for r in pre]
    save(results, args.out)
    if not args.no_plots:
        plots(results, args.out)
    print(f"sweep: wrote {args.out}/decode.csv, prefill.csv, sweep.json" + ("" if args.no_plots else ", decode.png, prefill.png"))


if __name__ == "__main__":
    main(sys.argv[1:])
