#!/usr/bin/env python3
"""The peers' own pass rates on all three extracted suites (issue 23's aim compares ours against
llguidance's on every suite's JSON-schema and Lark checks and against XGrammar's on the GBNF and
regex ones, so the peers must be run on each other's suites too). One-off, not run by CI:

  PYTHONPATH=PEERS DEEPINFER_LIB=build/libdeepinfer.so python3 tests/grammar/peer_suites/peer_rates.py [--list OUTCOME|all]

PEERS: `pip install --no-deps --target PEERS xgrammar==0.2.9 apache-tvm-ffi llguidance==1.9.1` (+
numpy; XGrammar is imported without torch as bench/grammar_compare.py does). Prints one table per
engine (DeepInfer, XGrammar, llguidance) in the replay's format, from the same data and the same
rules as tests/python/test_grammar_peer_suites.py (its Runner, outcomes, JSON re-serialisation of a
valid input in generation order), generation bounds off. How each peer gets a case:
- XGrammar: Grammar.from_ebnf / from_regex / from_lark / from_json_schema (any_whitespace,
  separators, indent, strict_mode as the case gives them; strict_mode off when it gives none, as
  for DeepInfer) / builtin_json_grammar; a string is accepted when GrammarMatcher.accept_string takes
  it and the matcher can terminate (what its testing._is_grammar_accept_string does).
- llguidance: LLMatcher over a byte tokenizer (one token per byte, an EOS), grammar_from_lark /
  _regex / _json_schema (XGrammar's any_whitespace=False as whitespace_flexible off with its
  separators, else llguidance's defaults), GBNF through its gbnf_to_lark; a string is accepted when
  all its bytes are consumed without error and the matcher is accepting.
llama.cpp's token-piece inputs (`<[id]>` tests) have no byte spelling for the peers: counted refused.
"""
import collections
import json
import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests/python"))
sys.path.insert(0, str(ROOT / "bench"))
import test_grammar_peer_suites as ps  # noqa: E402


class PeerRunner(ps.Runner):
    """The replay's Runner with another engine behind compile / accepts_bytes / free."""

    def __init__(self):
        self.bounds = False

    def accepts_pieces(self, g, pieces):
        raise TokenPieces()

    def run_case(self, case):
        try:
            return super().run_case(case)
        except TokenPieces:
            return [("refused", "token pieces")] * max(1, len(case["valid"]) + len(case["invalid"]))

    def free(self, g):
        pass


class TokenPieces(Exception):
    pass


def json_seps(o):
    """XGrammar's separators for a case (None: any whitespace)."""
    if o.get("any_whitespace") is False or o.get("separators"):
        if "indent" in o:
            return (",", ":")
        return tuple(o.get("separators") or (", ", ": "))
    return None


class XGrammarRunner(PeerRunner):
    def __init__(self):
        super().__init__()
        import transformers  # noqa: F401  (before the torch stand-in, as bench/grammar_compare.py imports it)
        from grammar_compare import import_xgrammar
        self.xgr, _ = import_xgrammar()
        self.compiler = self.xgr.GrammarCompiler(self.xgr.TokenizerInfo([]), cache_enabled=False)

    def compile(self, case):
        x, o, src = self.xgr, case["options"], case["grammar"]
        try:
            k = case["kind"]
            if k == "gbnf":
                g = x.Grammar.from_ebnf(src, root_rule_name=o.get("root", "root"))
            elif k == "regex":
                g = x.Grammar.from_regex(src)
            elif k == "lark":
                g = x.Grammar.from_lark(src)
            elif k == "json_any":
                g = x.Grammar.builtin_json_grammar()
            else:
                kw = {"any_whitespace": o.get("any_whitespace", True), "strict_mode": bool(o.get("strict"))}
                for name in ("indent", "separators"):
                    if o.get(name) is not None:
                        kw[name] = tuple(o[name]) if name == "separators" else o[name]
                g = x.Grammar.from_json_schema(src, **kw)
            return self.compiler.compile_grammar(g), None
        except Exception as e:  # noqa: BLE001  (XGrammar raises RuntimeError / ValueError / its own)
            return None, str(e)[:200]

    def accepts_bytes(self, g, b):
        try:
            s = b.decode("utf-8")
        except UnicodeDecodeError:
            return False  # XGrammar's accept_string takes text
        m = self.xgr.GrammarMatcher(g, terminate_without_stop_token=True)
        return bool(m.accept_string(s)) and m.is_terminated()


class ByteTokenizer:
    """256 one-byte tokens and an EOS (id 256), for llguidance's TokenizerWrapper."""
    eos_token_id = 256
    bos_token_id = None
    tokens = [bytes([i]) for i in range(256)] + [b"<eos>"]
    special_token_ids = [256]

    def __call__(self, s):
        return list(s if isinstance(s, bytes) else s.encode("utf-8"))


class LLGuidanceRunner(PeerRunner):
    def __init__(self):
        super().__init__()
        import llguidance
        from llguidance.gbnf_to_lark import any_to_lark
        self.llg, self.any_to_lark = llguidance, any_to_lark
        self.tok = llguidance.LLTokenizer(llguidance.TokenizerWrapper(ByteTokenizer()))

    def compile(self, case):
        M, o, src, k = self.llg.LLMatcher, case["options"], case["grammar"], case["kind"]
        try:
            if k == "gbnf":
                if o.get("root", "root") != "root":
                    return None, "root rule other than root"
                g = M.grammar_from_lark(self.any_to_lark(src))
            elif k == "regex":
                g = M.grammar_from_regex(src)
            elif k == "lark":
                g = M.grammar_from_lark(src)
            else:
                seps = json_seps(o)
                opts = {} if seps is None else {"whitespace_flexible": False, "item_separator": seps[0],
                                                "key_separator": seps[1]}
                g = M.grammar_from_json_schema('{"type": "object"}' if k == "json_any" else src, defaults=opts)
        except Exception as e:  # noqa: BLE001
            return None, str(e)[:200]
        m = M(self.tok, g, log_level=0)
        if m.is_error():
            return None, m.get_error()[:200]
        return m, None

    def accepts_bytes(self, g, b):
        m = g.deep_copy()
        return bool(m.consume_tokens(list(b))) and not m.is_error() and m.is_accepting()


def main():
    rows = {}
    lib = ps.load_lib() if os.environ.get("DEEPINFER_LIB") else None
    engines = [("DeepInfer", None)] if lib else []
    engines += [("XGrammar 0.2.9", XGrammarRunner), ("llguidance 1.9.1", LLGuidanceRunner)]
    want = sys.argv[sys.argv.index("--list") + 1] if "--list" in sys.argv else None
    for name, cls in engines:
        table, details = ps.run_all(lib, bounds=False, runner=cls() if cls else None)
        rows[name] = table
        print("\n%s\n%s" % (name, ps.format_table(table)), flush=True)
        for d in details if want else ():
            if want in ("all", d[2]):
                print(name, repr(d)[:300])
    # side by side: pass rate per (suite, kind)
    keys = sorted(set(k for t in rows.values() for k in t))
    print("\n| suite | kind | checks | " + " | ".join(rows) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in rows) + " |")
    for key in keys:
        n = max(sum(t[key].values()) for t in rows.values())
        cells = ["%d (%.1f%%)" % (t[key]["pass"], 100.0 * t[key]["pass"] / max(n, 1)) for t in rows.values()]
        print("| %s | %s | %d | %s |" % (key[0], key[1], n, " | ".join(cells)))


if __name__ == "__main__":
    main()
