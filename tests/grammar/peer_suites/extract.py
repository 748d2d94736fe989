#!/usr/bin/env python3
"""Extracts the grammar peers' own test cases from their PyPI source distributions into small JSON
files under tests/data/grammar/peer_suites/, which tests/python/test_grammar_peer_suites.py replays
against DeepInfer's engine (issue 23: "take what the peers take").

Pinned sources (download once with pip, e.g. `pip download --no-binary :all: --no-deps
llama-cpp-python==0.3.36`; pip may fail later building metadata, the .tar.gz is what is needed):
  llama-cpp-python 0.3.36  vendor/llama.cpp/tests/test-grammar-integration.cpp (test_grammar /
                           test_schema calls: grammar or schema, passing and failing strings; the
                           left-recursion and missing-rule failures) and test-json-schema-to-grammar.cpp
                           (only whether each schema compiles: the rest compares GBNF text)
  llguidance 1.9.1         parser/tests/*.rs: lark_str_test_many / lark_ok / lark_err_test /
                           json_test_many / json_err_test / json_schema_check with literal
                           arguments, rstest `#[case]` lists resolved where the call uses them
  xgrammar 0.2.9           tests/python/*.py, run under pytest against a recording stand-in of the
                           xgrammar module (peer_suites/xgrammar_recorder.py): each grammar built and
                           each accept-string check with the value the test asserts
Static extraction: a case whose arguments are computed (loops, variables, format!) is not
extracted; the counts of what was found are printed.

  python3 tests/grammar/peer_suites/extract.py --llama SDIST.tar.gz --llguidance SDIST.tar.gz \
      --xgrammar SDIST.tar.gz [--out tests/data/grammar/peer_suites]
(--xgrammar RECORDED.json reuses the output of xgrammar_recorder.py, which takes ~8 minutes.)

Case format (one list per suite file): {"id", "kind": "gbnf"|"lark"|"regex"|"json_schema",
"grammar", "options" (strict, any_whitespace, ...), "valid": [...], "invalid": [...],
"compiles": true|false|null}. An input is a string, or (llama.cpp's token tests) a list of pieces,
each a string or {"token": id}. llguidance's "FINAL_REJECT:x" (a prefix that is not a full match)
is stored as an invalid "x".
"""
import argparse
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]


# ---- C++ / Rust token streams ---------------------------------------------------------------------
CPP_ESC = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\", '"': '"', "'": "'", "0": "\0", "a": "\a", "b": "\b",
           "f": "\f", "v": "\v", "?": "?", "e": "\x1b"}


def unescape(body, rust):
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        e = body[i + 1]
        i += 2
        if e == "x":
            m = re.match(r"[0-9a-fA-F]{1,2}", body[i:])
            out.append(chr(int(m.group(0), 16)))
            i += len(m.group(0))
        elif e == "u" and rust and body[i] == "{":
            j = body.index("}", i)
            out.append(chr(int(body[i + 1:j], 16)))
            i = j + 1
        elif e == "u":
            out.append(chr(int(body[i:i + 4], 16)))
            i += 4
        elif e == "U":
            out.append(chr(int(body[i:i + 8], 16)))
            i += 8
        elif e == "\n" and rust:  # Rust: a backslash-newline skips the newline and leading spaces
            while i < len(body) and body[i] in " \t\n\r":
                i += 1
        else:
            out.append(CPP_ESC.get(e, e))
    return "".join(out)


def tokens(src, rust):
    """(kind, value) pairs: 's' string, 'i' identifier, 'n' number, 'p' punctuation."""
    toks, i, n = [], 0, len(src)
    while i < n:
        c = src[i]
        if c.isspace():
            i += 1
        elif src.startswith("//", i):
            i = src.find("\n", i)
            i = n if i < 0 else i
        elif src.startswith("/*", i):
            i = src.find("*/", i) + 2
        elif not rust and src.startswith('R"', i):
            j = src.index("(", i)
            delim = src[i + 2:j]
            end = src.index(")" + delim + '"', j)
            toks.append(("s", src[j + 1:end]))
            i = end + len(delim) + 2
        elif rust and re.match(r'r#*"', src[i:]):
            m = re.match(r'r(#*)"', src[i:])
            close = '"' + m.group(1)
            end = src.index(close, i + len(m.group(0)))
            toks.append(("s", src[i + len(m.group(0)):end]))
            i = end + len(close)
        elif c == '"' or (rust and src.startswith('b"', i)):
            j = i + (2 if c == "b" else 1)
            while src[j] != '"':
                j += 2 if src[j] == "\\" else 1
            toks.append(("s", unescape(src[i + (2 if c == "b" else 1):j], rust)))
            i = j + 1
        elif c == "'" and not rust:
            j = src.index("'", i + 1 + (src[i + 1] == "\\"))
            toks.append(("n", src[i:j + 1]))
            i = j + 1
        elif c.isalpha() or c == "_":
            m = re.match(r"[A-Za-z_][A-Za-z0-9_]*", src[i:])
            toks.append(("i", m.group(0)))
            i += len(m.group(0))
        elif c.isdigit() or (c == "-" and i + 1 < n and src[i + 1].isdigit() and toks and toks[-1][1] in "([{,:"):
            m = re.match(r"-?[0-9][0-9_.eE+\-]*[a-z0-9]*", src[i:])
            toks.append(("n", m.group(0)))
            i += len(m.group(0))
        else:
            two = src[i:i + 2]
            if two in ("::", "=>", "->", "=="):
                toks.append(("p", two))
                i += 2
            else:
                toks.append(("p", c))
                i += 1
    return toks


class Unresolved(Exception):
    pass


class Stream:
    def __init__(self, toks, pos=0, env=None):
        self.t, self.i, self.env = toks, pos, env or {}

    def peek(self, k=0):
        return self.t[self.i + k] if self.i + k < len(self.t) else ("p", "")

    def take(self, val=None):
        tok = self.peek()
        if val is not None and tok[1] != val:
            raise Unresolved("expected %r, got %r" % (val, tok))
        self.i += 1
        return tok

    def skip_balanced(self):
        """Skips one bracketed group starting at an opening bracket; returns its token slice."""
        pairs = {"(": ")", "[": "]", "{": "}"}
        start, depth = self.i, 0
        while True:
            k, v = self.take()
            if k == "p" and v in pairs:
                depth += 1
            elif k == "p" and v in pairs.values():
                depth -= 1
                if depth == 0:
                    return self.t[start:self.i]


# ---- llama.cpp ------------------------------------------------------------------------------------
def cpp_expr(s):
    """A C++ argument: string literals (adjacent ones concatenated), token(N), `+`, brace lists."""
    if s.peek()[1] == "{":
        s.take("{")
        items = []
        while s.peek()[1] != "}":
            items.append(cpp_expr(s))
            if s.peek()[1] == ",":
                s.take(",")
        s.take("}")
        return items
    pieces = []
    while True:
        k, v = s.peek()
        if k == "s":
            while s.peek()[0] == "s":
                pieces.append(s.take()[1])
        elif k == "i" and v == "token":
            s.take()
            s.take("(")
            pieces.append({"token": int(s.take()[1])})
            s.take(")")
        elif k == "i" and v in s.env:
            s.take()
            pieces.extend(s.env[v])
        else:
            raise Unresolved("cannot evaluate %r" % (v,))
        if s.peek()[1] != "+":
            break
        s.take("+")
    merged = []
    for p in pieces:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        else:
            merged.append(p)
    return merged


def as_input(pieces):
    return pieces[0] if len(pieces) == 1 and isinstance(pieces[0], str) else ("" if not pieces else pieces)


def extract_llama(tar_path):
    with tarfile.open(tar_path) as tf:
        def member(suffix):
            m = next(x for x in tf.getmembers() if x.name.endswith(suffix))
            return tf.extractfile(m).read().decode("utf-8")
        integ = member("tests/test-grammar-integration.cpp")
        j2g = member("tests/test-json-schema-to-grammar.cpp")
    cases, skipped = [], 0
    toks = tokens(integ, False)
    env = {}
    for i, (k, v) in enumerate(toks):
        # const std::string NAME = <string expr>;  (used by the failure tests)
        if k == "i" and v == "string" and i >= 2 and toks[i - 1][1] == "::" and toks[i + 1][0] == "i" and toks[i + 2][1] == "=":
            try:
                env[toks[i + 1][1]] = cpp_expr(Stream(toks, i + 3, env))
            except Unresolved:
                pass
        if k == "i" and v in ("test_grammar", "test_schema") and toks[i + 1][1] == "(" and toks[i - 1][1] != "void":
            s = Stream(toks, i + 2, env)
            try:
                name = as_input(cpp_expr(s))
                s.take(",")
                src = as_input(cpp_expr(s))
                s.take(",")
                passing = [as_input(x) for x in cpp_expr(s)]
                s.take(",")
                failing = [as_input(x) for x in cpp_expr(s)]
            except Unresolved:
                skipped += 1
                continue
            cases.append({"id": "test-grammar-integration/%s/%s" % (v, name), "kind": "gbnf" if v == "test_grammar" else "json_schema",
                          "grammar": src, "options": {}, "valid": passing, "invalid": failing, "compiles": True})
        if k == "i" and v == "test_build_grammar_fails" and toks[i + 1][1] == "(" and toks[i - 1][1] != "bool":
            s = Stream(toks, i + 2, env)
            try:
                src = as_input(cpp_expr(s))
            except Unresolved:
                skipped += 1
                continue
            cases.append({"id": "test-grammar-integration/build_fails/%d" % len(cases), "kind": "gbnf", "grammar": src,
                          "options": {}, "valid": [], "invalid": [], "compiles": False})
    # missing root / missing reference: asserted through the parser, same meaning (no grammar)
    for name in ("test_failure_missing_root", "test_failure_missing_reference"):
        body = integ[integ.index("static void %s" % name):]
        src = cpp_expr(Stream(tokens(body[body.index("grammar_str =") + len("grammar_str ="):], False)))
        cases.append({"id": "test-grammar-integration/%s" % name, "kind": "gbnf", "grammar": as_input(src),
                      "options": {}, "valid": [], "invalid": [], "compiles": False})
    toks = tokens(j2g, False)
    for i, (k, v) in enumerate(toks):
        if k == "i" and v == "test" and toks[i + 1][1] == "(" and toks[i + 2][1] == "{":
            s = Stream(toks, i + 3)
            try:
                status = s.take()[1]
                s.take(",")
                name = as_input(cpp_expr(s))
                s.take(",")
                schema = as_input(cpp_expr(s))
            except Unresolved:
                skipped += 1
                continue
            cases.append({"id": "test-json-schema-to-grammar/%s" % name, "kind": "json_schema", "grammar": schema,
                          "options": {}, "valid": [], "invalid": [], "compiles": status == "SUCCESS"})
    return cases, skipped


# ---- llguidance -----------------------------------------------------------------------------------
def rust_json(tok_slice, env):
    """The tokens of json!( ... ) (parentheses included) as a JSON value, or Unresolved."""
    out = []
    for k, v in tok_slice[1:-1]:
        if k == "i" and v in env and not isinstance(env[v], bool):
            out.append(json.dumps(unjson(env[v])))
        elif k == "s":
            out.append(json.dumps(v))
        elif k == "n":
            out.append(v.replace("_", ""))
        elif k == "i" and v in ("true", "false", "null"):
            out.append(v)
        elif k == "p" and v in "{}[],:":
            out.append(v)
        elif k == "p" and v == "-":
            out.append(v)
        else:
            raise Unresolved("json! with %r" % v)
    text = re.sub(r",\s*([}\]])", r"\1", " ".join(out))
    try:
        return json.loads(text)
    except ValueError as e:
        raise Unresolved(str(e))


def rust_value(s):
    """A literal argument: a string, &[...] of strings or json! values, json!(...), a bound name."""
    while s.peek()[1] == "&":
        s.take()
    k, v = s.peek()
    if k == "s":
        s.take()
        while s.peek()[0] == "s":
            v += s.take()[1]
        return v
    if k == "i" and v == "json" and s.peek(1)[1] == "!":
        s.take()
        s.take("!")
        return ("json", rust_json(s.skip_balanced(), s.env))
    if k == "i" and v in ("true", "false"):
        s.take()
        return v == "true"
    if k == "p" and v == "[":
        s.take("[")
        items = []
        while s.peek()[1] != "]":
            items.append(rust_value(s))
            if s.peek()[1] == ",":
                s.take(",")
        s.take("]")
        return items
    if k == "i" and v in s.env:
        s.take()
        return s.env[v]
    raise Unresolved("argument %r" % (v,))


def unjson(x):
    return x[1] if isinstance(x, tuple) else x


def extract_llguidance(tar_path):
    cases, skipped = [], 0
    with tarfile.open(tar_path) as tf:
        members = sorted((m for m in tf.getmembers() if re.search(r"/parser/tests/test_[a-z_]+\.rs$", m.name)),
                         key=lambda m: m.name)
        files = [(pathlib.Path(m.name).name, tf.extractfile(m).read().decode("utf-8")) for m in members]
    for fname, src in files:
        toks = tokens(src, True)
        # split into functions, with the rstest cases of each
        i = 0
        cases_attr = []
        glob = {}  # static ref NAME: Value = json!(...);
        for j, (k, v) in enumerate(toks):
            if k == "i" and v == "ref" and toks[j - 1][1] == "static" and toks[j + 2][1] == ":":
                e = [t[1] for t in toks[j:j + 12]].index("=")
                try:
                    glob[toks[j + 1][1]] = rust_value(Stream(toks, j + e + 1, glob))
                except Unresolved:
                    pass
        while i < len(toks):
            k, v = toks[i]
            if k == "p" and v == "#" and toks[i + 1][1] == "[":
                s = Stream(toks, i + 1)
                attr = s.skip_balanced()
                if len(attr) > 3 and attr[1][1] == "case":
                    try:
                        a = Stream(attr, [t[1] for t in attr].index("(") + 1, glob)
                        vals = [rust_value(a)]
                        while a.peek()[1] == ",":
                            a.take(",")
                            if a.peek()[1] != ")":
                                vals.append(rust_value(a))
                        cases_attr.append(vals)
                    except (Unresolved, ValueError):
                        cases_attr.append(None)
                i = s.i
                continue
            if k == "i" and v == "fn" and toks[i + 1][0] == "i":
                fname_fn = toks[i + 1][1]
                s = Stream(toks, i + 2)
                params = s.skip_balanced()
                while s.peek()[1] != "{":
                    s.take()
                body = s.skip_balanced()
                names = [t[1] for t in params]
                case_params = [names[j + 2] for j in range(len(names) - 2) if names[j] == "case" and names[j + 1] == "]"]
                found, miss = extract_rust_fn(fname, fname_fn, body, case_params, cases_attr, glob)
                cases.extend(found)
                skipped += miss
                cases_attr = []
                i = s.i
                continue
            i += 1
    return cases, skipped


def extract_rust_fn(fname, fn, body, case_params, case_values, glob):
    out, miss = [], 0
    envs = [dict(glob)]
    if case_params and case_values:
        envs = [dict(glob, **dict(zip(case_params, cv))) for cv in case_values
                if cv is not None and len(cv) == len(case_params)]
        miss += sum(cv is None or len(cv) != len(case_params) for cv in case_values)
    for env in envs:
        env = dict(env)
        for i, (k, v) in enumerate(body):
            if k == "i" and v == "let" and body[i + 1][0] == "i" and body[i + 2][1] == "=":
                try:
                    env[body[i + 1][1]] = rust_value(Stream(body, i + 3, env))
                except Unresolved:
                    env.pop(body[i + 1][1], None)
            if k != "i" or body[i + 1][1] != "(" or (i > 0 and body[i - 1][1] in ("fn", ".")):
                continue
            if v not in ("lark_str_test_many", "lark_str_test_many_quiet", "lark_ok", "lark_err_test",
                         "json_test_many", "json_err_test", "json_schema_check", "lark_str_test"):
                continue
            s = Stream(body, i + 2, env)
            try:
                args = [rust_value(s)]
                while s.peek()[1] == ",":
                    s.take(",")
                    if s.peek()[1] == ")":
                        break
                    args.append(rust_value(s))
            except Unresolved:
                miss += 1
                continue
            cid = "%s/%s/%d" % (fname, fn, len(out))
            if v.startswith("lark_str_test_many"):
                valid = list(args[1])
                invalid = [x[len("FINAL_REJECT:"):] if x.startswith("FINAL_REJECT:") else x for x in args[2]]
                out.append({"id": cid, "kind": "lark", "grammar": args[0], "options": {}, "valid": valid,
                            "invalid": invalid, "compiles": True})
            elif v == "lark_str_test":
                inp = args[2][len("FINAL_REJECT:"):] if args[2].startswith("FINAL_REJECT:") else args[2]
                out.append({"id": cid, "kind": "lark", "grammar": args[0], "options": {},
                            "valid": [inp] if args[1] else [], "invalid": [] if args[1] else [inp], "compiles": True})
            elif v == "lark_ok":
                out.append({"id": cid, "kind": "lark", "grammar": args[0], "options": {}, "valid": [], "invalid": [],
                            "compiles": True})
            elif v == "lark_err_test":
                out.append({"id": cid, "kind": "lark", "grammar": args[0], "options": {}, "valid": [], "invalid": [],
                            "compiles": False, "error": args[1]})
            elif v == "json_err_test":
                out.append({"id": cid, "kind": "json_schema", "grammar": json.dumps(unjson(args[0])), "options": {},
                            "valid": [], "invalid": [], "compiles": False, "error": args[1]})
            elif v == "json_test_many":
                out.append({"id": cid, "kind": "json_schema", "grammar": json.dumps(unjson(args[0])), "options": {},
                            "valid": [json.dumps(unjson(x), separators=(",", ":"), ensure_ascii=False) for x in args[1]],
                            "invalid": [json.dumps(unjson(x), separators=(",", ":"), ensure_ascii=False) for x in args[2]],
                            "compiles": True})
            elif v == "json_schema_check":
                inst = json.dumps(unjson(args[1]), separators=(",", ":"), ensure_ascii=False)
                out.append({"id": cid, "kind": "json_schema", "grammar": json.dumps(unjson(args[0])), "options": {},
                            "valid": [inst] if args[2] else [], "invalid": [] if args[2] else [inst], "compiles": True})
    return out, miss


# ---- XGrammar (through the recorder) --------------------------------------------------------------
PER_TEST_CAP = 200  # test_object_with_property_numbers alone builds 17,733 schemas: evenly sampled


def cap_per_test(cases):
    by_test = {}
    for c in cases:
        by_test.setdefault(c["id"].split("[")[0].rsplit("#", 1)[0], []).append(c)
    out = []
    for group in by_test.values():
        step = max(1, -(-len(group) // PER_TEST_CAP))
        out.extend(group[::step])
    return out


def extract_xgrammar(tar_path):
    if tar_path.endswith(".json"):  # the recorder's output of an earlier run
        return cap_per_test(json.loads(pathlib.Path(tar_path).read_text())), 0
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(tar_path) as tf:
            members = [m for m in tf.getmembers() if "/tests/python/" in m.name and m.name.endswith(".py")]
            tf.extractall(tmp, members=members, filter="data")
        tdir = next(pathlib.Path(tmp).glob("*/tests/python"))
        out = pathlib.Path(tmp) / "cases.json"
        r = subprocess.run([sys.executable, str(HERE / "xgrammar_recorder.py"), str(tdir), str(out)],
                           capture_output=True, text=True, timeout=1800)
        if r.returncode != 0:
            sys.stderr.write(r.stdout[-3000:] + r.stderr[-3000:])
            raise SystemExit("xgrammar recorder failed")
        return cap_per_test(json.loads(out.read_text())), 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--llama")
    ap.add_argument("--llguidance")
    ap.add_argument("--xgrammar")
    ap.add_argument("--out", default=str(ROOT / "tests/data/grammar/peer_suites"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, path, fn in (("llamacpp", a.llama, extract_llama), ("llguidance", a.llguidance, extract_llguidance),
                           ("xgrammar", a.xgrammar, extract_xgrammar)):
        if not path:
            continue
        cases, skipped = fn(path)
        source = pathlib.Path(path).name
        n_inputs = sum(len(c["valid"]) + len(c["invalid"]) + (c["compiles"] is not None) for c in cases)
        with open(os.path.join(a.out, name + ".json"), "w", encoding="utf-8") as f:
            json.dump({"source": source, "cases": cases}, f, ensure_ascii=False, indent=0)
            f.write("\n")
        print("%s: %d grammars, %d checks (%d calls not extracted: computed arguments)" % (name, len(cases), n_inputs,
                                                                                           skipped))


if __name__ == "__main__":
    main()
