"""`deepinfer grammar ... --check`: exit 0 when stdin is accepted whole, 1 when not, 2 with a
message (and a position) when the grammar is malformed. Needs no model."""
import os
import subprocess

import pytest

CLI = os.environ.get("DEEPINFER_CLI")
pytestmark = pytest.mark.skipif(not CLI or not os.path.exists(CLI), reason="DEEPINFER_CLI not set")


def check(args, stdin):
    r = subprocess.run([CLI, "grammar", *args, "--check"], input=stdin.encode() if isinstance(stdin, str) else stdin,
                       capture_output=True, timeout=30)
    return r.returncode, r.stderr.decode(errors="replace")


def test_regex(tmp_path):
    assert check(["--regex", r"\d{3}-\d{4}"], "555-1234")[0] == 0
    assert check(["--regex", r"\d{3}-\d{4}"], "555-1234\n")[0] == 1  # stdin is taken verbatim
    rc, err = check(["--regex", "a(b"], "")
    assert rc == 2 and "offset 1" in err


def test_json_schema(tmp_path):
    f = tmp_path / "s.json"
    f.write_text('{"type":"object","properties":{"n":{"type":"integer","minimum":1}},"required":["n"]}')
    assert check(["--json-schema", str(f)], '{"n":5}')[0] == 0
    assert check(["--json-schema", str(f)], '{"n":0}')[0] == 1
    assert check(["--json-schema", str(f)], '{"n": 5}')[0] == 1  # compact by default
    assert check(["--json-schema", str(f), "--max-whitespace", "2"], '{"n": 5}')[0] == 0
    f.write_text('{"type":"object","properties":{"n":{"type":"array","contains":{"type":"integer"},"maxContains":1}}}')
    rc, err = check(["--json-schema", str(f)], "{}")
    assert rc == 2 and "maxContains" in err and "#/properties/n" in err
    assert check(["--json-schema", str(f), "--ignore-unsupported"], '{"n":[1]}')[0] == 0
    # issue 23: JSON Schema's defaults, --strict, generation bounds
    f.write_text('{"type":"object","properties":{"n":{"type":"integer"}}}')
    assert check(["--json-schema", str(f)], '{"n":1,"x":[]}')[0] == 0
    assert check(["--json-schema", str(f), "--strict"], '{"n":1,"x":[]}')[0] == 1
    assert check(["--json-schema", str(f)], '{"n":12345678901234567}')[0] == 1
    assert check(["--json-schema", str(f), "--no-generation-bounds"], '{"n":12345678901234567}')[0] == 0
    assert check(["--json-schema", str(f), "--max-digits", "2"], '{"n":123}')[0] == 1
    assert check(["--json-schema", str(f), "--max-digits", "0"], '{}')[0] == 2
    # the string bound reaches strings under a pattern or format too (the matcher's counter, session 16)
    f.write_text('{"type":"string","pattern":"^x+$"}')
    assert check(["--json-schema", str(f)], '"' + "x" * 4096 + '"')[0] == 0
    assert check(["--json-schema", str(f)], '"' + "x" * 4097 + '"')[0] == 1
    assert check(["--json-schema", str(f), "--max-string-length", "5"], '"xxxxx"')[0] == 0
    assert check(["--json-schema", str(f), "--max-string-length", "5"], '"xxxxxx"')[0] == 1
    assert check(["--json-schema", str(f), "--no-generation-bounds"], '"' + "x" * 5000 + '"')[0] == 0
    f.write_text('{"type":"string","format":"email"}')
    assert check(["--json-schema", str(f), "--max-string-length", "8"], '"abc@d.ef"')[0] == 0
    assert check(["--json-schema", str(f), "--max-string-length", "8"], '"abcd@d.ef"')[0] == 1
    f.write_text('{"type": "object",')
    rc, err = check(["--json-schema", str(f)], "{}")
    assert rc == 2 and "json schema" in err
    # exact separators (XGrammar's any_whitespace=False)
    f.write_text('{"type":"object","properties":{"n":{"type":"array"}},"required":["n"],"additionalProperties":false}')
    seps = ["--item-separator", ", ", "--key-separator", ": "]
    assert check(["--json-schema", str(f), *seps], '{"n": [1, 2]}')[0] == 0
    assert check(["--json-schema", str(f), *seps], '{"n":[1,2]}')[0] == 1
    rc, err = check(["--json-schema", str(f), "--item-separator", ";"], "{}")
    assert rc == 2 and "item_separator" in err
    # XGrammar's indent layout (separators "," / ": " unless given; a bare {"type": "array"} on one
    # line with ", ", as XGrammar's basic array)
    assert check(["--json-schema", str(f), "--indent", "2"], '{\n  "n": [1, [2, 3]]\n}')[0] == 0
    assert check(["--json-schema", str(f), "--indent", "2"], '{\n  "n": []\n}')[0] == 0
    assert check(["--json-schema", str(f), "--indent", "2"], '{"n": [1]}')[0] == 1
    f.write_text('{"type":"object","properties":{"n":{"type":"array","items":{}}},"required":["n"]}')
    assert check(["--json-schema", str(f), "--indent", "2"], '{\n  "n": [\n    1,\n    [2, 3]\n  ]\n}')[0] == 0
    assert check(["--json-schema", str(f), "--indent", "3", "--key-separator", ":"],
                 '{\n   "n":[\n      1\n   ]\n}')[0] == 0
    assert check(["--json-schema", str(f), "--indent", "2"], '{\n  "n": [\n    1\n    ]\n}')[0] == 1
    for bad in ("0", "17", "x", "2x"):
        rc, err = check(["--json-schema", str(f), "--indent", bad], "{}")
        assert rc == 2 and "--indent" in err
    rc, err = check(["--json-schema", str(f), "--indent", "2", "--max-whitespace", "1"], "{}")
    assert rc == 2 and "max_whitespace" in err


def test_ebnf(tmp_path):
    f = tmp_path / "g.gbnf"
    f.write_text('root ::= "(" root ")" | "x"\n')
    assert check(["--grammar", str(f)], "((x))")[0] == 0
    assert check(["--grammar", str(f)], "((x)")[0] == 1
    f.write_text('root ::= "a" b\n')
    rc, err = check(["--grammar", str(f)], "a")
    assert rc == 2 and "line 1, column 14" in err and "'b'" in err
    rc, _ = check(["--grammar", str(tmp_path / "missing.gbnf")], "")
    assert rc == 2


def test_lark(tmp_path):
    lark = 'start: expr\nexpr: expr "+" NUMBER | NUMBER\n%import common.NUMBER\n%import common.WS\n%ignore WS\n'
    f = tmp_path / "g.lark"
    f.write_text(lark)
    assert check(["--grammar", str(f)], "1 + 2.5")[0] == 0  # .lark: Lark by default
    assert check(["--grammar", str(f)], "1 +")[0] == 1
    g = tmp_path / "g.txt"
    g.write_text(lark)
    assert check(["--grammar", str(g)], "1")[0] == 2  # not GBNF
    assert check(["--grammar", str(g), "--grammar-syntax", "lark"], "1+2")[0] == 0
    assert check(["--grammar", str(f), "--grammar-syntax", "gbnf"], "1")[0] == 2
    rc, err = check(["--grammar", str(f), "--grammar-syntax", "peg"], "1")
    assert rc == 2 and "gbnf or lark" in err
    f.write_text('start: a\na: b "x"\nb: a | "y"\n')
    rc, err = check(["--grammar", str(f)], "yx")
    assert rc == 2 and "left-recursive" in err


def test_json_object():
    assert check(["--json"], '{"a":[1,true,null]}')[0] == 0
    assert check(["--json"], "[1]")[0] == 1
    assert check(["--json"], b'{"a":"\xff"}')[0] == 1  # invalid UTF-8 inside a string


def test_usage():
    r = subprocess.run([CLI, "grammar", "--check"], capture_output=True, timeout=30)
    assert r.returncode == 2
    r = subprocess.run([CLI, "grammar", "--help"], capture_output=True, timeout=30)
    assert r.returncode == 0 and b"--json-schema" in r.stdout
