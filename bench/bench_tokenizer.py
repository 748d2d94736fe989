#!/usr/bin/env python3
"""Tokenizer benchmark against Hugging Face `tokenizers` in the same run (not a test).

Builds a seeded ~10 MB mixed corpus (Python standard-library source: English docstrings and code;
Chinese, Japanese, Korean, Russian, Arabic text from character ranges; numbers, whitespace runs,
emoji), then for each tokenizer measures single-thread encode throughput of DeepInfer (the
bench_tokenizer binary) and of HF tokenizers (RAYON_NUM_THREADS=1, one encode call per document),
checks both produce the same ids (checksum), and reports load times.

  python3 bench/bench_tokenizer.py --bin build/bench_tokenizer [--mb 10] [--tok DIR ...]
"""
import argparse
import json
import lzma
import os
import random
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import tokenizers  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def make_corpus(mb, seed=1234):
    rng = random.Random(seed)
    src = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    texts = [p.read_text(errors="replace") for p in src[:400]]
    ranges = {"zh": (0x4E00, 0x9FA5), "ja": (0x3041, 0x30FF), "ko": (0xAC00, 0xD7A3), "ru": (0x0430, 0x044F),
              "ar": (0x0621, 0x064A)}
    emoji = ["😀", "👍🏽", "🎉", "🚀", "❤️", "🤖", "👨‍👩‍👧"]
    docs, total = [], 0
    while total < mb * 1_000_000:
        r = rng.random()
        if r < 0.55:  # code with docstrings and comments
            t = rng.choice(texts)
            a = rng.randrange(max(1, len(t) - 4000))
            doc = t[a:a + rng.randint(500, 4000)]
        elif r < 0.85:  # other scripts, words of 1-6 characters
            lo, hi = ranges[rng.choice(list(ranges))]
            words = ["".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(50, 400))]
            doc = rng.choice([" ", "", "，"]).join(words)
        else:  # numbers, whitespace runs, emoji, punctuation
            parts = []
            for _ in range(rng.randint(50, 300)):
                k = rng.random()
                parts.append(str(rng.randint(0, 10 ** 9)) if k < 0.3 else " " * rng.randint(1, 12) if k < 0.5
                             else rng.choice(emoji) if k < 0.7 else rng.choice(["\n", "\n\n", "\t", "...", "!?", "---"]))
            doc = "".join(parts)
        doc = doc.replace("\x1e", " ")
        docs.append(doc)
        total += len(doc.encode())
    return docs


def hf_run(path, docs, repeats):
    t0 = time.perf_counter()
    tok = tokenizers.Tokenizer.from_file(str(path))
    load = time.perf_counter() - t0
    best, ids_all = 1e9, None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = [tok.encode(d, add_special_tokens=False).ids for d in docs]
        best = min(best, time.perf_counter() - t0)
        ids_all = out
    s = 0xcbf29ce484222325
    for ids in ids_all:
        for i in ids:
            s = ((s ^ i) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return load, best, sum(map(len, ids_all)), "%016x" % s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tok", nargs="*", default=["deepseek-v3", "llama3", "qwen3", "gpt4o", "llama2"])
    a = ap.parse_args()
    docs = make_corpus(a.mb)
    work = Path(tempfile.mkdtemp())
    corpus = work / "corpus.txt"
    corpus.write_bytes("\x1e".join(docs).encode())
    nbytes = corpus.stat().st_size
    print(f"corpus: {nbytes / 1e6:.1f} MB, {len(docs)} documents; RAYON_NUM_THREADS={os.environ['RAYON_NUM_THREADS']}")
    print(f"{'tokenizer':12} {'DI load ms':>10} {'HF load ms':>10} {'DI MB/s':>8} {'HF MB/s':>8} {'ratio':>6} {'tokens':>10} same-ids")
    for name in a.tok:
        src = ROOT / "tests" / "data" / "tokenizers" / name
        d = work / name
        d.mkdir()
        if (src / "tokenizer.json").exists():
            shutil.copy(src / "tokenizer.json", d)
        else:
            with lzma.open(src / "tokenizer.json.xz") as f:
                (d / "tokenizer.json").write_bytes(f.read())
        shutil.copy(src / "tokenizer_config.json", d)
        p = subprocess.run([a.bin, str(d), str(corpus), str(a.repeats)], capture_output=True, text=True)
        if p.returncode:
            print(name, "failed:", p.stderr)
            continue
        di = json.loads(p.stdout)
        hl, hs, htok, hsum = hf_run(d / "tokenizer.json", docs, a.repeats)
        print(f"{name:12} {di['load_ms']:10.1f} {hl * 1e3:10.1f} {di['mb_per_s']:8.2f} {nbytes / hs / 1e6:8.2f} "
              f"{di['mb_per_s'] / (nbytes / hs / 1e6):6.2f} {di['tokens']:10d} {di['checksum'] == hsum}")
        sys.stdout.flush()
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
