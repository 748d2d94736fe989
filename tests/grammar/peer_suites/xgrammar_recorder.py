#!/usr/bin/env python3
"""Runs XGrammar's own tests/python under pytest against a recording stand-in of the xgrammar
module, to extract its grammar cases (extract.py calls this; one-off, not run by CI).

  python3 xgrammar_recorder.py XGRAMMAR_SDIST/tests/python OUT.json

The stand-in records every grammar a test builds (Grammar.from_ebnf / from_lark / from_regex /
from_json_schema / builtin_json_grammar, with their options) and every
testing._is_grammar_accept_string(grammar, input) check together with the value the test expects,
which is read off how the test uses the result: `assert check(...)` (True), `assert not check(...)`
(False, from the source line of the assert), `check(...) == expected` (the compared value). The
check answers what the test expects, so the test runs on to its next check. A grammar built inside
`pytest.raises` is recorded as one that must not compile (pytest reports "DID NOT RAISE"). Everything
else of the xgrammar API (tokenizers, matchers, bitmasks) and the heavy imports (torch,
transformers) are inert mocks: tests that need them record nothing useful and are ignored.
"""
import importlib.abc
import importlib.machinery
import json
import linecache
import os
import re
import signal
import sys
import types
from unittest import mock

import pytest

CASES = []        # one per grammar built
PER_TEST_S = 5    # tests whose mocked parts loop (tokenizer-heavy ones) are cut off
# the test files about grammars (the others test tokenizers, structural tags, kernels, serialisation)
FILES = ("test_grammar_matcher_basic.py", "test_grammar_matcher_ebnf.py", "test_grammar_matcher_json.py",
         "test_grammar_matcher_json_schema.py", "test_grammar_matcher_regex.py", "test_grammar_matcher_bounded_string.py",
         "test_grammar_parser.py", "test_lark.py", "test_json_schema_converter.py", "test_json_schema_direct_converter.py",
         "test_json_schema_excludes.py", "test_regex_converter.py", "test_max_chars.py", "test_recursion_depth.py",
         "test_grammar_union_concat.py")
CURRENT = {"test": None, "grammars": []}


class Rec:
    def __init__(self, kind, src, options):
        self.case = {"id": "%s#%d" % (CURRENT["test"], len(CURRENT["grammars"])), "kind": kind, "grammar": src,
                     "options": options, "valid": [], "invalid": [], "compiles": True}
        CASES.append(self.case)
        CURRENT["grammars"].append(self.case)

    def __str__(self):
        return self.case["grammar"]


def schema_text(schema):
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        return json.dumps(schema)
    if hasattr(schema, "model_json_schema"):
        return json.dumps(schema.model_json_schema())
    raise TypeError("schema of type %s" % type(schema))


class Grammar:
    @staticmethod
    def from_ebnf(src, root_rule_name="root", **kw):
        return Rec("gbnf", src, {"root": root_rule_name} if root_rule_name != "root" else {})

    @staticmethod
    def from_lark(src, **kw):
        return Rec("lark", src, {})

    @staticmethod
    def from_regex(src, print_converted_ebnf=False, **kw):
        return Rec("regex", src, {})

    @staticmethod
    def from_json_schema(schema, any_whitespace=True, indent=None, separators=None, strict_mode=True,
                         max_whitespace_cnt=None, **kw):
        opts = {"any_whitespace": bool(any_whitespace), "strict": bool(strict_mode)}
        if indent is not None:
            opts["indent"] = indent
        if separators is not None:
            opts["separators"] = list(separators)
        return Rec("json_schema", schema_text(schema), opts)

    @staticmethod
    def builtin_json_grammar():
        return Rec("json_any", "", {})

    def __getattr__(self, name):
        return mock.MagicMock()


class Probe:
    """The result of one accept check; records the expectation when the test looks at it."""

    def __init__(self, case, text):
        self.case, self.text, self.done = case, text, False

    def record(self, expected):
        if not self.done and self.case is not None:
            (self.case["valid"] if expected else self.case["invalid"]).append(self.text)
        self.done = True

    def __bool__(self):
        frame = sys._getframe(1)
        line = ""  # the line of the check (an assert may span lines: nearest one above naming it)
        for n in range(frame.f_lineno, frame.f_lineno - 3, -1):
            line = linecache.getline(frame.f_code.co_filename, n)
            if "_is_grammar_accept_string" in line or "assert" in line:
                break
        negated = re.search(r"\bnot\s+(xgr\.testing\.)?_is_grammar_accept_string|\bassert\s+not\b", line) is not None
        self.record(not negated)
        return not negated

    def __eq__(self, other):
        if isinstance(other, bool):
            self.record(other)
            return True
        return NotImplemented

    __hash__ = object.__hash__


def is_grammar_accept_string(grammar, text, *a, **kw):
    if isinstance(grammar, str):
        grammar = Rec("gbnf", grammar, {})
    case = grammar.case if isinstance(grammar, Rec) else None
    if isinstance(text, bytes):
        text = text.decode("utf-8", "surrogateescape")
    return Probe(case, text)


class StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        m = mock.MagicMock(name="%s.%s" % (self.__name__, name))
        setattr(self, name, m)
        return m


class StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    ROOTS = ("torch", "transformers", "sentencepiece", "tiktoken", "mlx", "mlx_lm", "triton", "vllm", "sglang",
             "tvm_ffi", "huggingface_hub", "xgrammar")

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in self.ROOTS and name not in sys.modules:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def install():
    sys.meta_path.insert(0, StubFinder())
    xgr = StubModule("xgrammar")
    xgr.__path__ = []
    xgr.Grammar = Grammar
    testing = StubModule("xgrammar.testing")
    testing._is_grammar_accept_string = is_grammar_accept_string
    xgr.testing = testing
    sys.modules["xgrammar"] = xgr
    sys.modules["xgrammar.testing"] = testing


class TestTimeout(Exception):
    pass


def on_alarm(signum, frame):
    raise TestTimeout("test ran past %d s (a mocked API looping)" % PER_TEST_S)


class Plugin:
    def pytest_runtest_setup(self, item):
        CURRENT["test"] = "%s::%s" % (item.fspath.basename, item.name)
        CURRENT["grammars"] = []

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_call(self, item):  # the time limit covers the test body only
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(PER_TEST_S)
        try:
            yield
        finally:
            signal.alarm(0)

    def pytest_runtest_makereport(self, item, call):
        if call.when == "call" and call.excinfo is not None and "DID NOT RAISE" in str(call.excinfo.value):
            if CURRENT["grammars"]:
                g = CURRENT["grammars"][-1]
                g["compiles"] = False
                g["valid"], g["invalid"] = [], []


def main():
    test_dir, out = sys.argv[1], sys.argv[2]
    install()
    sys.path.insert(0, test_dir)
    files = [os.path.join(test_dir, f) for f in FILES if os.path.exists(os.path.join(test_dir, f))]
    pytest.main(files + ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--continue-on-collection-errors",
                 "-W", "ignore", "--rootdir", test_dir], plugins=[Plugin()])
    # keep grammars the test could build and check (a grammar without checks: compile-only)
    cases = [c for c in CASES if (c["kind"] != "json_any" or c["valid"] or c["invalid"]) and isinstance(c["grammar"], str)
             and all(isinstance(x, str) for x in c["valid"] + c["invalid"])]
    seen, unique = set(), []
    for c in cases:
        key = json.dumps([c["kind"], c["grammar"], c["options"], c["valid"], c["invalid"], c["compiles"]], default=str)
        if key not in seen:
            seen.add(key)
            unique.append(c)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(unique, f, ensure_ascii=False, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
