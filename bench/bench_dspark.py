#!/usr/bin/env python3
"""Speculative decoding: plain vs MTP vs DSpark (fixed k = 1..5 and the confidence schedule), at
batch 1 and 16 (--batches), greedy (every config) and temperature 1 (plain, mtp, dspark k=3 and
scheduled), with the shipped model and drafter, on the CPU or CUDA (--accelerator). Prints a markdown
table (generated tokens/s over the whole run, acceptance, mean accepted length, acceptance per draft
position (accepted at j / drafted at j), ECE, engine steps with ms per step split into the time blocked
in the backend's wait and the host's time (drafting included), warm-up included) and checks that greedy outputs equal plain decoding's. --quick: plain, mtp k=3, dspark
fixed k=5 and scheduled only. --configs NAME,NAME: only those rows; --device-steps 0,1: every DSpark row
with DEEPINFER_DSPARK_DEVICE_STEPS at each value (the rows with 1 are labeled "+dev"); --graph-propose 0,1: every
DSpark row with DEEPINFER_DSPARK_GRAPH_PROPOSE at each value (the rows with 0 are labeled "eager": proposals after
the step; the "in-step" column counts the steps that proposed inside their CUDA graph). "scheduled k=5 startup": the
confidence schedule from a step-time profile measured per graph bucket at startup (speculative_config "profile":
"startup"; the LLM's creation, which runs it, is not timed).

Usage: DEEPINFER_LIB=build/libdeepinfer.so PYTHONPATH=python python3 bench/bench_dspark.py \
    [--model models/default] [--tokens 128] [--threads 2] [--batches 1,16] [--accelerator cuda] \
    [--temperatures 0,1] [--num-kv-blocks N] [--quick]
"""
import argparse
import os
import time

from deepinfer import LLM, SamplingParams

PROMPTS = ["The history of the city", "The sea is", "Once upon a time", "This program is free software",
           "In the beginning", "The function returns", "A long time ago in a", "Copyright (C) 2004",
           "The quick brown fox", "What does it mean", "The package provides", "It was the best of",
           "The manual page", "Debian is", "The river", "The library"]


def run(model, spec, batch, temperature, tokens, threads, accelerator=None, num_kv_blocks=None, device_steps=None,
        graph_propose=None):
    if device_steps is not None:
        os.environ["DEEPINFER_DSPARK_DEVICE_STEPS"] = device_steps
    if graph_propose is not None:
        os.environ["DEEPINFER_DSPARK_GRAPH_PROPOSE"] = graph_propose
    else:
        os.environ.pop("DEEPINFER_DSPARK_GRAPH_PROPOSE", None)
    llm = LLM(model, threads=threads, speculative_config=spec, quiet=True, accelerator=accelerator,
              num_kv_blocks=num_kv_blocks)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(batch)]
    sp = [SamplingParams(temperature=temperature, max_tokens=tokens, ignore_eos=True, seed=i) for i in range(batch)]
    # warm-up with the whole batch: the CUDA graphs of its step sizes are captured here, not timed
    llm.generate(prompts, [SamplingParams(temperature=temperature, max_tokens=8, ignore_eos=True, seed=i)
                           for i in range(batch)])
    t0 = time.perf_counter()
    outs = llm.generate(prompts, sp)
    dt = time.perf_counter() - t0
    st = llm.get_speculative_stats()
    es = llm.get_stats()  # cumulative (the warm-up included): steps, time blocked in the backend, host time
    st["engine"] = {k: es[k] for k in ("steps", "backend_wait_s", "host_time_s")}
    llm.close()
    ids = [list(o.outputs[0].token_ids) for o in outs]
    return sum(len(i) for i in ids) / dt, st, ids


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="models/default")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,16")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--accelerator", default=None)
    ap.add_argument("--num-kv-blocks", type=int, default=None)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--configs", default=None)
    ap.add_argument("--device-steps", default=None)
    ap.add_argument("--graph-propose", default=None)
    a = ap.parse_args()
    configs = [("plain", None), ("mtp k=3", {"method": "mtp", "num_speculative_tokens": 3})]
    configs += [(f"dspark fixed k={k}", {"method": "dspark", "num_speculative_tokens": k, "schedule": "fixed"})
                for k in range(1, 6)]
    configs += [("dspark scheduled k=5", {"method": "dspark", "num_speculative_tokens": 5})]
    configs += [("dspark scheduled k=5 startup", {"method": "dspark", "num_speculative_tokens": 5, "profile": "startup"})]
    if a.quick:
        configs = [c for c in configs if c[0] in ("plain", "mtp k=3", "dspark fixed k=5", "dspark scheduled k=5",
                                                  "dspark scheduled k=5 startup")]
    if a.configs:
        configs = [c for c in configs if c[0] in a.configs.split(",")]
    configs = [(n, s, None, None) for n, s in configs]
    if a.device_steps:
        configs = [(n + (" +dev" if d == "1" else ""), s, d, None) for n, s, _, _ in configs
                   for d in (a.device_steps.split(",") if s and s.get("method") == "dspark" else [None])]
    if a.graph_propose:
        configs = [(n + (" eager" if g == "0" else ""), s, d, g) for n, s, d, _ in configs
                   for g in (a.graph_propose.split(",") if s and s.get("method") == "dspark" else [None])]
    print("| batch | T | config | tok/s | vs plain | accepted / drafted | mean accepted length | acceptance per position "
          "| ECE | steps | ms/step (wait + host) | in-step (missed) | greedy == plain |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for batch in (int(b) for b in a.batches.split(",")):
        for temperature in (float(t) for t in a.temperatures.split(",")):
            base, ref = None, None
            for name, spec, dev, gp in configs:
                if temperature > 0 and name.replace(" +dev", "").replace(" eager", "") not in (
                        "plain", "mtp k=3", "dspark fixed k=3", "dspark fixed k=5", "dspark scheduled k=5"):
                    continue
                try:
                    tps, st, ids = run(a.model, spec, batch, temperature, a.tokens, a.threads, a.accelerator,
                                       a.num_kv_blocks, dev, gp)
                except Exception as ex:  # one config's failure (e.g. mtp on a backend without it) is a row
                    print(f"| {batch} | {temperature:g} | {name} | failed: {ex} |", flush=True)
                    continue
                if spec is None:
                    base, ref = tps, ids
                same = "yes" if ids == ref else ("n/a" if temperature > 0 else "NO")
                acc = f"{st['accepted_tokens']} / {st['drafted_tokens']}" if spec else "-"
                mal = f"{st['mean_accepted_length']:.2f}" if spec else "-"
                ece = f"{st['calibration']['ece']:.3f}" if spec and spec.get("method") == "dspark" else "-"
                pos = " ".join(f"{x / d:.2f}" if d else "-" for x, d in zip(st["accepted_per_position"],
                                                                            st["drafted_per_position"])) if spec else "-"
                en = st["engine"]
                n = max(en["steps"], 1)
                stp = (f"{en['steps']} | {1e3 * (en['backend_wait_s'] + en['host_time_s']) / n:.3f} "
                       f"({1e3 * en['backend_wait_s'] / n:.3f} + {1e3 * en['host_time_s'] / n:.3f})")
                ins = f"{st['proposals_in_step']} ({st['proposals_missed']})" if spec else "-"
                print(f"| {batch} | {temperature:g} | {name} | {tps:.0f} | {tps / base:.2f}x | {acc} | {mal} | {pos} | {ece} | {stp} | "
                      f"{ins} | {same if spec else '-'} |", flush=True)


if __name__ == "__main__":
    main()
