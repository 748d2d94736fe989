#!/usr/bin/env python3
"""Grammar benchmark: DeepInfer (bench_grammar) vs XGrammar and llguidance (pip), same tokenizer,
same schema, same token sequences, one thread each.

Generates N documents valid for bench/grammar/schema_order.json (compact, keys in schema order,
the way DeepInfer generation writes JSON) and N "any JSON object" documents, tokenizes them once
with the Hugging Face tokenizer, then for each engine and each document: compiles the grammar
afresh (compile time), and replays the tokens, timing each mask computation (then accepting the
token; EOS at the end). Reports median / p99 / max of the per-token mask time (wall clock, and
the thread's CPU time, since on a loaded machine the wall clock counts preemption) and the compile
median. Python engines are timed around their mask call (includes ~1 us of Python overhead).

  python3 bench/grammar_compare.py --bench build/bench_grammar \
      --tokenizer tests/data/tokenizers/deepseek-v3 [--docs 30] [--out /tmp/gbench]

With --suite CASES (the output of bench/grammar_suite_cases.py: a few hundred distinct schemas of
the peers' test suites, one valid instance each) it replays those instead: every engine compiles
each schema afresh and replays its instance's tokens (the Hugging Face tokenizer's, for all
engines alike; DeepInfer through build/bench_grammar_suite --ids --times). Reported twice: over
the cases each engine replayed, and over the cases all of them replayed (same tokens, same cases).
XGrammar runs in strict mode where the case says so; llguidance has no such mode (its grammar is
then the looser JSON Schema default, which the instance satisfies as well).

The peers: `pip install --no-deps --target DIR xgrammar==0.2.9 apache-tvm-ffi llguidance==1.9.1`, then
PYTHONPATH=DIR. XGrammar runs without torch (see import_xgrammar). The first lines printed state the
versions, the CPU and the cores this process may use, then the load average before and after the run.

llama.cpp (optional, engine "llamacpp"): `pip download llama-cpp-python --no-binary :all: --no-deps`,
build `vendor/llama.cpp` (`cmake -B build -DLLAMA_CURL=OFF -DGGML_OPENMP=OFF && cmake --build build
--target llama`), compile bench/grammar_llama.cpp against it, make a vocab-only GGUF with
`convert_hf_to_gguf.py DIR --vocab-only` (DIR: a DeepSeek-V3 config.json + the tokenizer files), then
pass --llama-harness BIN --llama-vocab VOCAB.gguf --llama-src SDIST_DIR (its llama_cpp/llama_grammar.py
converts the schema to GBNF; that converter drops minimum/maximum and the email format).
"""
import argparse
import json
import os
import pathlib
import random
import statistics
import string
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCHEMA = ROOT / "bench/grammar/schema_order.json"

WORDS = ("the quick brown fox jumps over lazy dog order shipping delivery fragile handle with care please "
         "call before arriving leave at the door gift wrap invoice attached thank you café naïve résumé 東京 "
         "priority customer requested express").split()


def rand_text(rng, lo, hi):
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def order_doc(rng):
    hexs = "0123456789abcdef"
    uid = "-".join("".join(rng.choice(hexs) for _ in range(n)) for n in (8, 4, 4, 4, 12))
    name = rng.choice(["Ada", "Grace", "Linus", "Zoë", "José", "Mei"]) + " " + rng.choice(
        ["Lovelace", "Hopper", "Torvalds", "García", "Nakamura"])
    cust = {"name": name[:40], "email": name.split()[0].lower().replace("ë", "e").replace("é", "e") + "@example.com"}
    if rng.random() < 0.7:
        cust["age"] = rng.randint(18, 120)
    items = []
    for _ in range(rng.randint(1, 4)):
        it = {"sku": "".join(rng.choice(string.ascii_uppercase) for _ in range(3)) + "-%04d" % rng.randint(0, 9999),
              "quantity": rng.randint(1, 100), "price": round(rng.uniform(0.5, 500), 2)}
        if rng.random() < 0.5:
            it["tags"] = [rng.choice(WORDS) for _ in range(rng.randint(0, 3))]
        items.append(it)
    doc = {"id": uid, "customer": cust, "items": items,
           "status": rng.choice(["pending", "shipped", "delivered", "cancelled"]),
           "created": "2024-%02d-%02dT%02d:%02d:%02dZ" % (rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23),
                                                        rng.randint(0, 59), rng.randint(0, 59))}
    if rng.random() < 0.6:
        doc["notes"] = rand_text(rng, 3, 25) if rng.random() < 0.8 else None
    if rng.random() < 0.5:
        doc["priority"] = rng.random() < 0.5
    return doc


def any_value(rng, depth):
    r = rng.random()
    if depth > 3 or r < 0.35:
        return rng.choice([rng.randint(-1000, 100000), round(rng.uniform(-10, 10), 3), rand_text(rng, 1, 6), True,
                           None])
    if r < 0.6:
        return [any_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(WORDS) + str(i): any_value(rng, depth + 1) for i in range(rng.randint(0, 4))}


def any_doc(rng):
    return {rng.choice(WORDS) + str(i): any_value(rng, 1) for i in range(rng.randint(1, 6))}


def dumps(d):
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False)


def stats(ts):
    ts = sorted(ts)
    p = lambda q: ts[min(len(ts) - 1, int(q * (len(ts) - 1) + 0.5))]
    return {"median": p(0.5), "p99": p(0.99), "max": ts[-1], "mean": statistics.fmean(ts), "n": len(ts)}


def import_xgrammar():
    """xgrammar, and whether torch is there. XGrammar imports torch at module level only for type
    names and its torch helpers; its mask call takes any DLPack tensor (a numpy int32 array too).
    Without torch (this VM has none: the PyPI wheel is the CUDA build), a stand-in module answers
    those names while xgrammar imports and is removed right after, and the bitmask is numpy."""
    try:
        import torch  # noqa: F401
        import xgrammar as xgr
        return xgr, True
    except ImportError:
        pass
    import types
    import tvm_ffi  # noqa: F401  (imported first: it treats torch as optional and must not see the stand-in)

    class _TypeNames(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {"__init__": lambda self, *a, **k: None})

    sys.modules["torch"] = _TypeNames("torch")
    try:
        import xgrammar as xgr
    finally:
        del sys.modules["torch"]
    return xgr, False


def run_xgrammar(hf_tok, eos, grammar_src, is_any, docs_ids):
    xgr, have_torch = import_xgrammar()
    info = xgr.TokenizerInfo.from_huggingface(hf_tok, vocab_size=len(hf_tok), stop_token_ids=[eos])
    comp = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    if have_torch:
        bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    else:
        import numpy
        bitmask = numpy.full(xgr.get_bitmask_shape(1, info.vocab_size), -1, dtype=numpy.int32)
    masks, cpus, compiles = [], [], []
    for ids in docs_ids:
        t0 = time.perf_counter()
        cg = comp.compile_json_schema(grammar_src, any_whitespace=False, separators=(",", ":"),
                                      strict_mode=not is_any)
        compiles.append((time.perf_counter() - t0) * 1e3)
        m = xgr.GrammarMatcher(cg)
        for tid in list(ids) + [eos]:
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            m.fill_next_token_bitmask(bitmask)
            masks.append((time.perf_counter_ns() - t0) / 1e3)
            cpus.append((time.thread_time_ns() - c0) / 1e3)
            if not m.accept_token(tid):
                raise RuntimeError("xgrammar rejected token %d" % tid)
    return dict(stats(masks), cpu=stats(cpus)), statistics.median(compiles)


def run_llguidance(hf_tok, eos, grammar_src, is_any, docs_ids):
    import llguidance
    import llguidance.hf
    import llguidance.numpy
    lltok = llguidance.hf.from_tokenizer(hf_tok, n_vocab=len(hf_tok), eos_token=eos)
    bitmask = llguidance.numpy.allocate_token_bitmask(1, lltok.vocab_size)
    schema = json.loads(grammar_src)
    masks, cpus, compiles = [], [], []
    for ids in docs_ids:
        t0 = time.perf_counter()
        grm = llguidance.LLMatcher.grammar_from_json_schema(schema, defaults={"whitespace_flexible": False})
        m = llguidance.LLMatcher(lltok, grm)
        compiles.append((time.perf_counter() - t0) * 1e3)
        if m.is_error():
            raise RuntimeError(m.get_error())
        for tid in list(ids) + [eos]:
            t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
            llguidance.numpy.fill_next_token_bitmask(m, bitmask, 0)
            masks.append((time.perf_counter_ns() - t0) / 1e3)
            cpus.append((time.thread_time_ns() - c0) / 1e3)
            if not m.consume_token(tid):
                raise RuntimeError("llguidance rejected token %d: %s" % (tid, m.get_error()))
    return dict(stats(masks), cpu=stats(cpus)), statistics.median(compiles)


def run_llamacpp(harness, vocab, sdist, src, ids_path, out_dir, name):
    import importlib.util
    spec = importlib.util.spec_from_file_location("llama_grammar", os.path.join(sdist, "llama_cpp/llama_grammar.py"))
    lg = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lg)
    schema = json.loads(src)
    order = []
    def collect(s):  # every property name in schema order, so the GBNF keeps the schema's order
        if isinstance(s, dict):
            for k, v in s.get("properties", {}).items():
                if k not in order:
                    order.append(k)
                collect(v)
            collect(s.get("items"))
    collect(schema)
    gpath = os.path.join(out_dir, name + ".gbnf")
    with open(gpath, "w") as f:
        f.write(lg.json_schema_to_gbnf(src, prop_order=order))
    out = subprocess.run([harness, vocab, gpath, ids_path], capture_output=True, check=True).stdout
    out = out.decode(errors="replace")  # llama.cpp logs raw token bytes
    res = {}
    for line in out.splitlines():
        if line.startswith("mask us:"):
            f = line.split()
            res["median"], res["p99"], res["max"] = float(f[3]), float(f[7]), float(f[9])
        if line.startswith("compile ms:"):
            res["compile"] = float(line.split()[3])
    return res


def run_deepinfer(bench, tok_dir, schema_path, docs_path, ids_path, extra=()):
    args = [bench, "--tokenizer", tok_dir, "--docs", docs_path, "--ids", ids_path] + list(extra)
    args += ["--json"] if schema_path is None else ["--schema", schema_path]
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    res = {}
    for line in out.splitlines():
        if line.startswith("mask us:"):
            f = line.split()
            res["median"], res["p99"], res["max"] = float(f[3]), float(f[7]), float(f[9])
        if line.startswith("mask cpu us:"):
            f = line.split()
            res["cpu"] = {"median": float(f[4]), "p99": float(f[8])}
        if line.startswith("first document mask cpu us:"):
            f = line.split()
            res["first_cpu"] = {"median": float(f[6]), "p99": float(f[10]), "max": float(f[12])}
        if line.startswith("compile ms:"):
            res["compile"] = float(line.split()[3])
    return res, out


def run_peer_case(eng, hf_tok, eos, schema, strict, ids, state):
    """One suite case on a peer: (compile ms, [(cpu us, wall us) per mask]), or None when the peer
    refuses the schema or rejects a token of the instance."""
    if eng == "xgrammar":
        if "xgr" not in state:
            xgr, have_torch = import_xgrammar()
            info = xgr.TokenizerInfo.from_huggingface(hf_tok, vocab_size=len(hf_tok), stop_token_ids=[eos])
            import numpy
            state["xgr"] = (xgr, xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False),
                            numpy.full(xgr.get_bitmask_shape(1, info.vocab_size), -1, dtype=numpy.int32))
        xgr, comp, bitmask = state["xgr"]
        try:
            t0 = time.perf_counter()
            cg = comp.compile_json_schema(schema, any_whitespace=False, separators=(",", ":"), strict_mode=strict)
            m = xgr.GrammarMatcher(cg)
            ct = (time.perf_counter() - t0) * 1e3
        except Exception:
            return None
        fill, accept = (lambda: m.fill_next_token_bitmask(bitmask)), m.accept_token
    else:
        import llguidance
        import llguidance.hf
        import llguidance.numpy
        if "llg" not in state:
            lltok = llguidance.hf.from_tokenizer(hf_tok, n_vocab=len(hf_tok), eos_token=eos)
            state["llg"] = (lltok, llguidance.numpy.allocate_token_bitmask(1, lltok.vocab_size))
        lltok, bitmask = state["llg"]
        try:
            t0 = time.perf_counter()
            grm = llguidance.LLMatcher.grammar_from_json_schema(json.loads(schema),
                                                                 defaults={"whitespace_flexible": False})
            m = llguidance.LLMatcher(lltok, grm)
            ct = (time.perf_counter() - t0) * 1e3
        except Exception:
            return None
        if m.is_error():
            return None
        fill, accept = (lambda: llguidance.numpy.fill_next_token_bitmask(m, bitmask, 0)), m.consume_token
    times = []
    for tid in list(ids) + [eos]:
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        fill()
        times.append(((time.thread_time_ns() - c0) / 1e3, (time.perf_counter_ns() - t0) / 1e3))
        if not accept(tid):
            return None
    return ct, times


def run_suite(a, hf_tok, raw, eos):
    """--suite: the peer-suite schemas on every engine (see the module docstring)."""
    cases = [json.loads(l) for l in open(a.suite) if l.strip()]
    ids = [raw.encode(c["doc"], add_special_tokens=False).ids for c in cases]
    ip, tp = os.path.join(a.out, "suite.ids.txt"), os.path.join(a.out, "suite.times.txt")
    with open(ip, "w") as f:
        f.writelines(" ".join(map(str, x)) + "\n" for x in ids)
    print(run_context())
    print("load average before: " + load_average())
    res = {}  # engine -> {case: (compile ms, [(cpu, wall)])}
    for eng in a.engines.split(","):
        if eng.startswith("deepinfer"):
            suite_bin = os.path.join(os.path.dirname(a.bench), "bench_grammar_suite")
            subprocess.run([suite_bin, "--tokenizer", a.tokenizer, "--cases", a.suite, "--ids", ip, "--times", tp],
                           capture_output=True, check=True)
            per, masks = {}, {}
            for line in open(tp):
                f = line.split()
                if f[0] == "mask":
                    masks.setdefault(int(f[1]), []).append((float(f[2]), float(f[3])))
                elif f[0] == "case" and f[5] == "1":
                    per[int(f[1])] = (float(f[3]), masks.get(int(f[1]), []))
            res["deepinfer"] = per
        elif eng in ("xgrammar", "llguidance"):
            state, per = {}, {}
            for k, c in enumerate(cases):
                r = run_peer_case(eng, hf_tok, eos, c["schema"], bool(c.get("strict")), ids[k], state)
                if r is not None:
                    per[k] = r
            res[eng] = per
    print("load average after: " + load_average())
    common = set(range(len(cases)))
    for per in res.values():
        common &= set(per)
    print("%d cases; replayed by all engines: %d" % (len(cases), len(common)))
    print("| cases | engine | replayed | masks | CPU median us | CPU p99 us | CPU max us | wall p99 us | "
          "compile median ms | compile p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for label, pick in (("each engine's own", None), ("common to all", common)):
        for eng, per in res.items():
            ks = [k for k in per if pick is None or k in pick]
            cpu = [t[0] for k in ks for t in per[k][1]]
            wall = [t[1] for k in ks for t in per[k][1]]
            comp = [per[k][0] for k in ks]
            if not cpu:
                continue
            sc, sw, scomp = stats(cpu), stats(wall), stats(comp)
            print(f"| {label} | {eng} | {len(ks)} | {len(cpu)} | {sc['median']:.1f} | {sc['p99']:.1f} | "
                  f"{sc['max']:.0f} | {sw['p99']:.1f} | {scomp['median']:.3f} | {scomp['p99']:.3f} |")


def run_context():
    """What the issue asks a benchmark table to state: versions, CPU (sweep.py's machine()), threads."""
    import importlib.metadata as md
    from sweep import machine
    vers = []
    for pkg in ("xgrammar", "llguidance"):
        try:
            vers.append("%s %s" % (pkg, md.version(pkg)))
        except md.PackageNotFoundError:
            vers.append("%s not installed" % pkg)
    m = machine()
    return "%s; CPU %s, %d cores visible, this process on cores %s (one thread per engine)" % (
        ", ".join(vers), m.get("cpu") or "?", m["cpus"], sorted(os.sched_getaffinity(0)))


def load_average():
    return " ".join("%.1f" % x for x in os.getloadavg())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json")
    ap.add_argument("--docs", type=int, default=30)
    ap.add_argument("--out", default="/tmp/gbench")
    ap.add_argument("--engines", default="deepinfer,xgrammar,llguidance",
                    help="deepinfer (JSON Schema defaults, generation bounds on), deepinfer-strict (XGrammar's "
                         "strict mode, as the xgrammar row runs), xgrammar, llguidance, llamacpp")
    ap.add_argument("--suite", help="peer-suite cases (bench/grammar_suite_cases.py) instead of the two grammars")
    ap.add_argument("--llama-harness")
    ap.add_argument("--llama-vocab")
    ap.add_argument("--llama-src")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast
    tokjson = os.path.join(a.tokenizer, "tokenizer.json")
    cfg = json.load(open(os.path.join(a.tokenizer, "tokenizer_config.json")))
    eos_tok = cfg.get("eos_token")
    eos_tok = eos_tok["content"] if isinstance(eos_tok, dict) else eos_tok
    hf_tok = PreTrainedTokenizerFast(tokenizer_file=tokjson, eos_token=eos_tok)
    raw = Tokenizer.from_file(tokjson)
    eos = raw.token_to_id(eos_tok)
    if a.suite:
        return run_suite(a, hf_tok, raw, eos)
    rng = random.Random(1234)
    cases = [("schema", SCHEMA.read_text(), [order_doc(rng) for _ in range(a.docs)]),
             ("json-object", '{"type":"object"}', [any_doc(rng) for _ in range(a.docs)])]
    rows = []
    print(run_context())
    print("load average before: " + load_average())
    for name, src, docs in cases:
        texts = [dumps(d) for d in docs]
        ids = [raw.encode(t, add_special_tokens=False).ids for t in texts]
        dp, ip = os.path.join(a.out, name + ".docs.jsonl"), os.path.join(a.out, name + ".ids.txt")
        with open(dp, "w") as f:
            f.writelines(json.dumps(t, ensure_ascii=False) + "\n" for t in texts)
        with open(ip, "w") as f:
            f.writelines(" ".join(map(str, x)) + "\n" for x in ids)
        ntok = sum(len(x) for x in ids)
        for eng in a.engines.split(","):
            try:
                if eng in ("deepinfer", "deepinfer-strict"):
                    r, _ = run_deepinfer(a.bench, a.tokenizer, str(SCHEMA) if name == "schema" else None, dp, ip,
                                         ["--strict"] if eng == "deepinfer-strict" else [])
                    rows.append((name, eng, r["median"], r["p99"], r["max"], r["compile"], ntok, r.get("cpu")))
                    if "first_cpu" in r:  # the first document of the process: nothing classified yet
                        fc = r["first_cpu"]
                        rows.append((name, eng + " (first document, CPU)", fc["median"], fc["p99"], fc["max"],
                                     r["compile"], None, fc))
                elif eng == "xgrammar":
                    s, c = run_xgrammar(hf_tok, eos, src, name != "schema", ids)
                    rows.append((name, eng, s["median"], s["p99"], s["max"], c, ntok, s["cpu"]))
                elif eng == "llamacpp":
                    r = run_llamacpp(a.llama_harness, a.llama_vocab, a.llama_src, src, ip, a.out, name)
                    rows.append((name, eng, r["median"], r["p99"], r["max"], r["compile"], ntok, None))
                elif eng == "llguidance":
                    s, c = run_llguidance(hf_tok, eos, src, name != "schema", ids)
                    rows.append((name, eng, s["median"], s["p99"], s["max"], c, ntok, s["cpu"]))
            except Exception as e:  # an engine missing or failing is reported, not fatal
                print(f"{eng} on {name}: {e}", file=sys.stderr)
    print("load average after: " + load_average())
    print("| grammar | engine | mask median us | mask p99 us | mask max us | CPU median us | CPU p99 us | "
          "compile median ms | tokens |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cpu = r[7] or {}
        fmt = lambda x: "%.1f" % x if x is not None else "-"
        print(f"| {r[0]} | {r[1]} | {r[2]:.1f} | {r[3]:.1f} | {r[4]:.0f} | {fmt(cpu.get('median'))} | "
              f"{fmt(cpu.get('p99'))} | {r[5]:.3f} | {r[6] if r[6] is not None else '-'} |")


if __name__ == "__main__":
    main()
