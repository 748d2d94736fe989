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
    f.write_text('{"type":"object","properties":{"n":{"type":"integer","multipleOf":2}}}')
    rc, err = check(["--json-schema", str(f)], "{}")
    assert rc == 2 and "multipleOf" in err and "#/properties/n" in err
    assert check(["--json-schema", str(f), "--ignore-unsupported"], '{"n":3}')[0] == 0
    f.write_text('{"type": "object",')
    rc, err = check(["--json-schema", str(f)], "{}")
    assert rc == 2 and "json schema" in err


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


def test_json_object():
    assert check(["--json"], '{"a":[1,true,null]}')[0] == 0
    assert check(["--json"], "[1]")[0] == 1
    assert check(["--json"], b'{"a":"\xff"}')[0] == 1  # invalid UTF-8 inside a string


def test_usage():
    r = subprocess.run([CLI, "grammar", "--check"], capture_output=True, timeout=30)
    assert r.returncode == 2
    r = subprocess.run([CLI, "grammar", "--help"], capture_output=True, timeout=30)
    assert r.returncode == 0 and b"--json-schema" in r.stdout
