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
Then the same rates over the "comparable" checks: EXCLUDED (with the reason for each) left out for
every engine alike.
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


# Checks left out of the "comparable" rates (for every engine alike): the peer's expectation breaks
# JSON Schema / RFC 3339 / ECMA-262 with the u flag, the check is not GBNF (the aim is
# XGrammar's rate on the GBNF-compatible cases; llama.cpp's GBNF refuses left recursion, as the issue
# keeps), or the extraction recorded something no grammar engine can pass. (case id prefix, reason)
# (case id, the one input or None for every check of the case, reason); an id ending in "*" is a prefix
EXCLUDED = [
    ("test-grammar-integration/test_schema/min 0", "100000000000000000000000000000000",
     "a 16-digit integer bound: JSON Schema has none"),
    ("test-grammar-integration/test_schema/min 2", "12345678900000000", "the same"),
    ("test-grammar-integration/test_schema/min+max items", "1", "minItems without type: 1 is valid JSON Schema"),
    ("test-grammar-integration/test_schema/object properties",
     '{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue", "direction":"NW"}',
     "no additionalProperties: an extra property is valid"),
    ("test-json-schema-to-grammar/regexp with escaped hyphen outside a character class", None,
     "\\- outside a class: an ECMA-262 u-flag error"),
    ("test_json_string_format.rs/regex_accepts_but_invalid_*", None,
     "asserts llguidance's regex takes invalid RFC 3339 dates / leap seconds (2021-02-29, 22:59:60Z)"),
    ("test_lark.rs/test_json_pattern_properties/0", None, "llguidance refuses overlapping patternProperties (valid)"),
    ("test_lark.rs/test_json_pattern_properties/1", None, "the same"),
    ("test_lark.rs/test_json_pattern_properties/2", None, "the same, across allOf"),
    ("test_lark.rs/test_json_min_max_properties/0", None, "llguidance refuses maxProperties beside properties (valid)"),
    ("test_lark.rs/test_json_min_max_properties/1", None, "llguidance refuses minProperties beside properties (valid)"),
    ("test_lark.rs/test_json_general_unicode_escapes_are_opt_in/0", '"\\u00e9"',
     "llguidance writes no \\u escape of a printable character by default: \"\\u00e9\" is valid JSON"),
    ("test_lark.rs/test_lark_syntax_perc/3", None, "llguidance refuses %json {\"if\": {}} (valid JSON Schema)"),
    ("test_lark.rs/test_lark_syntax_general/26", None, "token ids past the byte tokenizer this runner gives llguidance"),
    ("test_lark.rs/test_lark_syntax_general/34", None, "the same"),
    ("test_lark.rs/test_lark_syntax_general/35", None, "the same"),
    ("test_regex_converter.py::test_null_character[*", None, "XGrammar refuses a NUL in a regex (valid ECMA-262)"),
    ("test_grammar_matcher_basic.py::test_batch_rollback_size_mismatch#0", None,
     "recorder artefact: the test raises on matcher API misuse, not on the grammar"),
    ("test_grammar_matcher_basic.py::test_override_stop_tokens_out_of_range_raises#0", None, "the same"),
    ("test_grammar_matcher_basic.py::test_batch_fill_next_token_bitmask_terminated_matcher_raises#0", None, "the same"),
    ("test_grammar_matcher_ebnf.py::test_predict_complete#0", None, "left recursion: an error in llama.cpp's GBNF"),
    ("test_grammar_parser.py::test_e2e_json_grammar#0", None, "XGrammar's lookahead assertions (= ...): not GBNF"),
    ("test_grammar_parser.py::test_e2e_to_string_roundtrip#0", None, "the same"),
    ("test_json_schema_converter.py::test_uri_template_format['-False]#1", "\"'\"",
     "an apostrophe in a uri-template: the JSON-Schema-Test-Suite counts it valid"),
    ("test_json_schema_direct_converter.py::test_direct_converter_formatting_and_any_order#*", None,
     "XGrammar's exact indentation and max_whitespace_cnt: not modelled"),
]
for k in range(1, len(EXCLUDED)):  # "the same": the reason of the entry above
    if EXCLUDED[k][2] == "the same":
        EXCLUDED[k] = (EXCLUDED[k][0], EXCLUDED[k][1], EXCLUDED[k - 1][2])
EBNF_ATTRS = "XGrammar's EBNF rule attributes (name[lazy] ::=): not GBNF"


def excluded(suite, case, inp=None):
    """The reason a check (input inp; None: the case as a whole) is left out of the comparable rates."""
    for cid, one, why in EXCLUDED:
        hit = case["id"].startswith(cid[:-1]) if cid.endswith("*") else case["id"] == cid
        if hit and (one is None or inp == one):
            return why
    if suite == "xgrammar" and case["kind"] == "gbnf" and any(
            line.split("::=")[0].strip().endswith("]") for line in case["grammar"].splitlines() if "::=" in line):
        return EBNF_ATTRS
    return None


def comparable(runner_cls, lib):
    """{(suite, kind): [pass, checks]} over the checks not excluded."""
    r = runner_cls() if runner_cls else ps.Runner(lib, False)
    out = collections.defaultdict(lambda: [0, 0])
    for suite in ps.SUITES:
        for case in json.loads((ps.DATA / (suite + ".json")).read_text(encoding="utf-8"))["cases"]:
            if excluded(suite, case):
                continue
            inputs = case["valid"] + case["invalid"] if case["compiles"] is not False else []
            for k, (outcome, _) in enumerate(r.run_case(case)):
                if k < len(inputs) and excluded(suite, case, inputs[k]):
                    continue
                key = (suite, ps.kind_group(case))
                out[key][0] += outcome == "pass"
                out[key][1] += 1
    if runner_cls is None:
        lib.di_grammar_vocab_free(r.vocab)
    return out


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
    print("\nexcluded from the comparable rates (every engine alike):")
    for suite in ps.SUITES:
        n = collections.Counter()
        for case in json.loads((ps.DATA / (suite + ".json")).read_text(encoding="utf-8"))["cases"]:
            why = excluded(suite, case)
            if why:
                n[(ps.kind_group(case), why)] += max(1, len(case["valid"]) + len(case["invalid"]))
                continue
            for inp in case["valid"] + case["invalid"]:
                why = excluded(suite, case, inp)
                if why:
                    n[(ps.kind_group(case), why)] += 1
        for (kind, why), k in sorted(n.items()):
            print("  %s %s: %d checks: %s" % (suite, kind, k, why))
    comp = {name: comparable(cls, lib) for name, cls in engines}
    print("\n| suite | kind | comparable checks | " + " | ".join(comp) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in comp) + " |")
    for key in sorted(set(k for t in comp.values() for k in t)):
        n = max(t[key][1] for t in comp.values())
        print("| %s | %s | %d | %s |" % (key[0], key[1], n, " | ".join(
            "%d (%.1f%%)" % (t[key][0], 100.0 * t[key][0] / max(n, 1)) for t in comp.values())))
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
