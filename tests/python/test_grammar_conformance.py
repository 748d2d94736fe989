"""JSON-Schema-Test-Suite (draft 2020-12) against the grammar engine's JSON Schema front-end.

For every test group whose schema compiles, each instance is serialised the way generation writes
JSON (compact, properties in schema order, integral numbers as integers, UTF-8 unescaped; see
docs/structured-outputs.md) and checked with di_grammar_accepts, with JSON Schema's defaults (not
strict) and the generation bounds off (max_digits = max_string_length = -1, as validation means):
  valid   + accepted -> pass          invalid + rejected -> pass
  valid   + rejected -> skip if the documented generation defaults exclude it (the instance fails
                        the "generation schema": formats asserted, oneOf as anyOf), else FAIL
  invalid + accepted -> skip if the generation defaults admit it (oneOf generated as anyOf), else FAIL
Groups whose schema uses an unsupported keyword (compile error DI_ERR_UNSUPPORTED) count as skipped.
The test fails on any FAIL; the counts are printed (and recorded in docs/structured-outputs.md).
"""
import ctypes
import json
import os
import pathlib
import random
import urllib.parse

import pytest

jsonschema = pytest.importorskip("jsonschema")

ROOT = pathlib.Path(__file__).resolve().parents[2]
SUITE = ROOT / "tests/data/grammar/JSON-Schema-Test-Suite/draft2020-12"
DI_GRAMMAR_JSON_SCHEMA = 2
DI_ERR_UNSUPPORTED = 4


class Options(ctypes.Structure):  # di_grammar_options (src/grammar/grammar.h)
    _fields_ = [(n, ctypes.c_int) for n in ("ignore_unsupported_keywords", "max_whitespace", "max_branches",
                                            "max_elements", "no_cache", "strict", "max_digits",
                                            "max_string_length")] + [
        ("item_separator", ctypes.c_char * 8), ("key_separator", ctypes.c_char * 8), ("root_rule", ctypes.c_char * 32),
        ("indent", ctypes.c_int)]


UNBOUNDED = Options(max_digits=-1, max_string_length=-1)


def load_lib():
    path = os.environ.get("DEEPINFER_LIB")
    if not path or not os.path.exists(path):
        pytest.skip("DEEPINFER_LIB not set")
    lib = ctypes.CDLL(path)
    lib.di_grammar_compile.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p,
                                       ctypes.POINTER(ctypes.c_void_p)]
    lib.di_grammar_compile.restype = ctypes.c_int
    lib.di_grammar_accepts.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.di_grammar_accepts.restype = ctypes.c_int
    lib.di_grammar_free.argtypes = [ctypes.c_void_p]
    lib.di_last_error.restype = ctypes.c_char_p
    return lib


# ---- serialisation the way generation writes it ------------------------------------------------
def pointer(root, ref):
    node = root
    try:
        for tok in ref[1:].split("/")[1:] if ref.startswith("#/") else []:
            tok = urllib.parse.unquote(tok).replace("~1", "/").replace("~0", "~")
            node = node[int(tok)] if isinstance(node, list) else node[tok]
    except (KeyError, IndexError, ValueError, TypeError):
        return None
    return node


def resolve(s, root, depth=0):
    while isinstance(s, dict) and isinstance(s.get("$ref"), str) and s["$ref"].startswith("#") and depth < 50:
        depth += 1
        s = pointer(root, s["$ref"]) if s["$ref"] != "#" else root
    return s


def branches(s, root, depth=0):
    """The schema and the subschemas whose properties generation merges in (allOf/anyOf/oneOf, $ref)."""
    out = []
    s = resolve(s, root)
    if not isinstance(s, dict) or depth > 20:
        return out
    out.append(s)
    if isinstance(s.get("$ref"), str):
        out += branches(resolve({"$ref": s["$ref"]}, root), root, depth + 1)
    for kw in ("allOf", "anyOf", "oneOf"):
        for b in s.get(kw, []) if isinstance(s.get(kw), list) else []:
            out += branches(b, root, depth + 1)
    return out


def strict_equal(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(strict_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(strict_equal(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def canonical(inst, schema, root):
    bs = branches(schema, root) if schema is not None else []
    for b in bs:  # an enum/const literal: generation writes the literal's own key order
        cands = ([b["const"]] if "const" in b else []) + (b["enum"] if isinstance(b.get("enum"), list) else [])
        for c in cands:
            if strict_equal(c, inst):
                return canonical(c, None, root)
    if isinstance(inst, float) and inst.is_integer():
        return int(inst)
    if isinstance(inst, list):
        out = []
        for i, x in enumerate(inst):
            sub = None
            for b in bs:
                pi = b.get("prefixItems")
                if isinstance(pi, list) and i < len(pi):
                    sub = pi[i]
                    break
                if "items" in b and not isinstance(pi, list) or (isinstance(pi, list) and "items" in b):
                    sub = b["items"]
                    break
            out.append(canonical(x, sub, root))
        return out
    if isinstance(inst, dict):
        order = []
        for b in bs:
            for k in b.get("properties", {}) if isinstance(b.get("properties"), dict) else []:
                if k not in order:
                    order.append(k)
        dep_props, dep_req = [], []  # dependent*: a present trigger's names follow (generation's order)
        for b in bs:
            for kw in ("dependentRequired", "dependentSchemas", "dependencies"):
                for trig, d in (b.get(kw) or {}).items() if isinstance(b.get(kw), dict) else []:
                    if trig not in inst:
                        continue
                    dep_req.append(trig)
                    if isinstance(d, list):
                        dep_req += d
                    else:
                        for db in branches(d, root):
                            dep_props += list(db.get("properties", {})) if isinstance(db.get("properties"), dict) else []
                            dep_req += db.get("required", []) if isinstance(db.get("required"), list) else []
        order += [k for k in dep_props if k not in order]
        for b in bs:
            for k in b.get("required", []) if isinstance(b.get("required"), list) else []:
                if k not in order:
                    order.append(k)
        order += [k for k in dep_req if k not in order]
        keys = [k for k in order if k in inst] + [k for k in inst if k not in order]
        out = {}
        for k in keys:
            sub = None
            for b in bs:
                if isinstance(b.get("properties"), dict) and k in b["properties"]:
                    sub = b["properties"][k]
                    break
            if sub is None:
                for b in bs:
                    if isinstance(b.get("additionalProperties"), (dict, bool)):
                        sub = b["additionalProperties"]
                        break
            out[k] = canonical(inst[k], sub if isinstance(sub, dict) else None, root)
        return out
    return inst


def serialize(inst, schema):
    return json.dumps(canonical(inst, schema, schema), separators=(",", ":"), ensure_ascii=False)


# ---- the generation schema: validation semantics with the documented generation defaults ------
SCHEMA_MAP = ("properties", "$defs", "definitions", "dependentSchemas", "patternProperties")
SCHEMA_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties")
SCHEMA_LIST = ("allOf", "anyOf", "oneOf", "prefixItems")


def generation_schema(s):
    if not isinstance(s, dict):
        return s
    out = {}
    for k, v in s.items():
        if k in SCHEMA_MAP and isinstance(v, dict):
            out[k] = {n: generation_schema(x) for n, x in v.items()}
        elif k in SCHEMA_ONE:
            out[k] = generation_schema(v)
        elif k in SCHEMA_LIST and isinstance(v, list):
            out["anyOf" if k == "oneOf" else k] = [generation_schema(x) for x in v]
        else:
            out[k] = v
    return out


def gen_valid(schema, inst):
    v = jsonschema.Draft202012Validator(generation_schema(schema),
                                        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
    try:
        return v.is_valid(inst)
    except Exception:  # unresolvable refs and the like: not decidable here
        return None


# The suite's count in issue 23 (1,556 cases): every top-level file plus these six format files.
BASE_FORMATS = ("date-time", "date", "email", "ipv4", "time", "uuid")
# Formats generation asserts (docs/structured-outputs.md): a valid-by-annotation instance of
# format.json that the format rejects is a documented generation default, not a failure.
ASSERTED_FORMATS = BASE_FORMATS + ("ipv6", "hostname", "uri", "uri-reference", "uri-template", "duration",
                                   "json-pointer", "relative-json-pointer")
# What a regex cannot check (docs/structured-outputs.md, "Formats"): each listed case is a known
# wrong answer, counted apart; any other disagreement in these files fails.
KNOWN_FORMAT_DEVIATIONS = {
    ("hostname.json", "exceeds maximum overall length (256)"),  # 253-character total not checked
    ("hostname.json", 'contains "--" in the 3rd and 4th position'),
}
PUNYCODE_PREFIX = "xn--"  # hostname.json: validity of Punycode (A-label) contents is not checked


def is_known_deviation(fname, desc, data):
    if (fname, desc) in KNOWN_FORMAT_DEVIATIONS:
        return True
    return fname == "hostname.json" and isinstance(data, str) and PUNYCODE_PREFIX in data.lower()


def run_suite(lib):
    files = sorted(SUITE.glob("*.json")) + sorted((SUITE / "optional/format").glob("*.json"))
    totals = {"pass": 0, "skip": 0, "fail": 0, "deviation": 0}
    base = {"pass": 0, "skip": 0, "fail": 0, "deviation": 0}
    per_file = {}
    failures = []
    for f in files:
        counts = {"pass": 0, "skip": 0, "fail": 0, "deviation": 0}
        is_format_file = f.parent.name == "format"
        for group in json.loads(f.read_text()):
            schema = group["schema"]
            src = json.dumps(schema).encode()
            g = ctypes.c_void_p()
            st = lib.di_grammar_compile(DI_GRAMMAR_JSON_SCHEMA, src, len(src), ctypes.byref(UNBOUNDED),
                                        ctypes.byref(g))
            err = lib.di_last_error().decode(errors="replace") if st else ""
            for t in group["tests"]:
                if st == DI_ERR_UNSUPPORTED:
                    counts["skip"] += 1
                    continue
                text = serialize(t["data"], schema)
                if st != 0:
                    accepted = False  # e.g. "no JSON value satisfies the schema"
                else:
                    b = text.encode()
                    accepted = bool(lib.di_grammar_accepts(g, b, len(b)))
                if accepted == t["valid"]:
                    counts["pass"] += 1
                    continue
                if is_format_file:  # judged by the suite alone (jsonschema lacks most format checkers)
                    if is_known_deviation(f.name, t["description"], t["data"]):
                        counts["deviation"] += 1
                        continue
                elif (f.name == "format.json" and t["valid"] and isinstance(schema, dict)
                      and schema.get("format") in ASSERTED_FORMATS):
                    counts["skip"] += 1  # formats are asserted in generation
                    continue
                else:
                    gv = gen_valid(schema, t["data"])
                    if t["valid"] and gv is False:
                        counts["skip"] += 1  # excluded by the generation defaults
                        continue
                    if not t["valid"] and gv is True:
                        counts["skip"] += 1  # admitted by the generation defaults (oneOf as anyOf)
                        continue
                counts["fail"] += 1
                failures.append(f"{f.name}: {group['description']} / {t['description']}: {text} "
                                f"(valid={t['valid']}, accepted={accepted}{', compile: ' + err if st else ''})")
            if st == 0:
                lib.di_grammar_free(g)
        per_file[f.name] = counts
        in_base = not is_format_file or f.stem in BASE_FORMATS
        for k in totals:
            totals[k] += counts[k]
            if in_base:
                base[k] += counts[k]
    return totals, base, per_file, failures


def report(totals, base, per_file):
    for name, c in per_file.items():
        print(f"{name:32s} pass {c['pass']:4d}  skip {c['skip']:4d}  fail {c['fail']:4d}  deviation {c['deviation']:3d}")
    print(f"SUITE (the 1,556 cases: top level + 6 formats) pass {base['pass']} skip {base['skip']} fail {base['fail']}")
    print(f"ALL (with 8 more format files) pass {totals['pass']} skip {totals['skip']} fail {totals['fail']} "
          f"known deviations {totals['deviation']}")


def test_json_schema_test_suite():
    lib = load_lib()
    totals, base, per_file, failures = run_suite(lib)
    report(totals, base, per_file)
    assert sum(base.values()) == 1556
    assert base["pass"] >= 1100  # issue 23: at least 1,100 of the 1,556
    assert not failures, "\n".join(failures[:40])


if __name__ == "__main__":
    lib = load_lib()
    totals, base, per_file, failures = run_suite(lib)
    report(totals, base, per_file)
    print("\n".join(failures))


def test_leap_seconds_every_local_minute():
    """RFC 3339 5.7: a leap second is 23:59:60 UTC, i.e. local time minus offset. For every local
    minute, the time formats take :60 exactly with its offsets (the two valid ones, computed here
    independently of json_formats.c's trie) and refuse their neighbours, a zero offset and Z, and
    a spread of other offsets; date-time alike on a sample."""
    lib = load_lib()

    def compile_format(fmt):
        g = ctypes.c_void_p()
        src = json.dumps({"type": "string", "format": fmt}).encode()
        assert lib.di_grammar_compile(2, src, len(src), ctypes.byref(UNBOUNDED), ctypes.byref(g)) == 0, \
            lib.di_last_error()
        return g

    def off_text(o):  # minutes east of UTC
        return "%s%02d:%02d" % ("-" if o < 0 else "+", abs(o) // 60, abs(o) % 60)

    def valid(local, o, z=False):  # the UTC minute is 23:59 (o = 0 for Z)
        return (local - (0 if z else o)) % 1440 == 1439

    time_g, dt_g = compile_format("time"), compile_format("date-time")
    rng = random.Random(23)
    checks = wrong = 0
    try:
        for local in range(1440):
            hhmm = "%02d:%02d" % (local // 60, local % 60)
            good = [o for o in (local - 1439, local + 1) if -1439 <= o <= 1439]
            offsets = set(good) | {0} | {o + d for o in good for d in (-1, 1, -60, 60)}
            offsets |= {rng.randint(-1439, 1439) for _ in range(6)}
            cases = [(off_text(o), valid(local, o)) for o in offsets if -1439 <= o <= 1439]
            cases += [("Z", valid(local, 0, True)), ("-00:00", valid(local, 0))]
            for off, ok in cases:
                for frac in ("", ".5"):
                    s = ('"%s:60%s%s"' % (hhmm, frac, off)).encode()
                    checks += 1
                    wrong += bool(lib.di_grammar_accepts(time_g, s, len(s))) != ok
                s = ('"%s:59%s"' % (hhmm, off)).encode()  # an ordinary second: every offset
                checks += 1
                wrong += not lib.di_grammar_accepts(time_g, s, len(s))
            if local % 7 == 0:
                for off, ok in cases:
                    s = ('"2016-12-31T%s:60%s"' % (hhmm, off)).encode()
                    checks += 1
                    wrong += bool(lib.di_grammar_accepts(dt_g, s, len(s))) != ok
    finally:
        lib.di_grammar_free(time_g)
        lib.di_grammar_free(dt_g)
    print("\nleap seconds: %d checks, %d wrong" % (checks, wrong))
    assert checks > 50000 and wrong == 0
    # the trie's ~15,000 elements count against max_elements like any other rule's
    small, g = Options(max_digits=-1, max_string_length=-1, max_elements=4000), ctypes.c_void_p()
    src = b'{"type": "string", "format": "time"}'
    assert lib.di_grammar_compile(2, src, len(src), ctypes.byref(small), ctypes.byref(g)) != 0
    assert b"max_elements" in lib.di_last_error()
