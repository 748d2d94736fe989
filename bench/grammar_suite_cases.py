#!/usr/bin/env python3
"""Writes the peer suites' JSON-schema cases as benchmark input for bench_grammar_suite: one line
per distinct schema that the suite expects to compile and that has a valid instance, as
{"id", "schema", "strict", "doc"}: the first valid instance written compactly (the way DeepInfer
generates JSON; bench_grammar_suite skips a case whose rewritten instance the grammar rejects). Data: tests/data/grammar/peer_suites/ (llguidance
1.9.1 and XGrammar 0.2.9 test cases, extracted by tests/grammar/peer_suites/extract.py).

  python3 bench/grammar_suite_cases.py [--max 300] > /tmp/suite_cases.jsonl
"""
import argparse
import json
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--max", type=int, default=300)
    a = ap.parse_args()
    seen, out = set(), []
    for suite in ("llguidance", "xgrammar"):
        data = json.loads((ROOT / "tests/data/grammar/peer_suites" / (suite + ".json")).read_text())
        for c in data["cases"]:
            if c["kind"] != "json_schema" or not c.get("compiles") or not c.get("valid"):
                continue
            strict = bool(c.get("options", {}).get("strict"))
            key = (json.dumps(json.loads(c["grammar"]), sort_keys=True), strict)
            if key in seen:
                continue
            try:
                doc = json.dumps(json.loads(c["valid"][0]), separators=(",", ":"), ensure_ascii=False)
            except ValueError:
                continue
            seen.add(key)
            out.append({"id": suite + ":" + c["id"], "schema": c["grammar"], "strict": strict, "doc": doc})
    # spread the pick over both suites in file order
    step = max(1, len(out) // a.max)
    for c in out[::step][:a.max]:
        print(json.dumps(c, ensure_ascii=False))


if __name__ == "__main__":
    main()
