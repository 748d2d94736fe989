"""The rule of issue 27: a double from untrusted input (a JSON number, a parsed float) becomes an
integer only through the one range check in src/util/json.c (di_json_int_in, di_double_to_int_in):
a C cast of an out-of-range double to an integer type is undefined behaviour, and the fuzzers found
it more than once. This test scans the parsers' sources for an integer cast whose operand is a
double from input (a cJSON valuedouble, a template float `.u.f`, or a variable declared double in
that file) and fails naming each file and line, so that a new one cannot slip in. A cast the check
guards on the line itself, or one proved safe, is marked with the comment `int-cast: checked`
followed by the reason."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# the directories whose code reads untrusted input (configs, headers, requests, templates,
# grammars, tokenizer files, command lines, engine options such as gpu_memory_utilization): every
# directory of src/ with C code (session 13 added src/kv and src/backend's C files); the CUDA kernels
# (.cu) convert their own doubles
SCOPE = ["src/model", "src/arch", "src/server", "src/tokenizer", "src/grammar", "src/chat", "src/cli",
         "src/engine", "src/util", "src/sampler", "src/api", "src/dist", "src/kv", "src/backend"]
HELPER = "src/util/json.c"
INT_TYPES = r"(?:(?:unsigned|signed)\s+)?(?:int|long|long\s+long|short|char|size_t|ssize_t|ptrdiff_t|" \
            r"u?int(?:8|16|32|64)_t|intptr_t|uintptr_t|unsigned)"
CAST = re.compile(r"\(\s*" + INT_TYPES + r"\s*\)\s*")
ROUND = re.compile(r"\b(?:l|ll)(?:rint|round)f?\s*\(")
DOUBLE_DECL = re.compile(r"\bdouble\s+([A-Za-z_]\w*(?:\s*(?:=[^,;]*)?,\s*[A-Za-z_]\w*)*)")
MARK = "int-cast: checked"


def operand(text, i):
    """The primary expression starting at text[i]: a parenthesised group or a name chain."""
    if i < len(text) and text[i] == "(":
        depth = 0
        for j in range(i, len(text)):
            depth += text[j] == "("
            depth -= text[j] == ")"
            if depth == 0:
                return text[i:j + 1]
        return text[i:]
    m = re.match(r"[A-Za-z_][\w]*(?:(?:->|\.)[A-Za-z_]\w*|\[[^\]]*\])*(?:\s*\([^;]*?\))?", text[i:])
    return m.group(0) if m else ""


def blank_literals(src):
    """src with comments and string/char literals replaced by spaces (newlines kept), so braces in
    them do not confuse the function split; the `int-cast: checked` marks are kept."""
    def keep_newlines(m):
        t = m.group(0)
        if MARK in t:
            return " " + MARK + " " + "\n" * t.count("\n")
        return re.sub(r"[^\n]", " ", t)
    return re.sub(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', keep_newlines, src, flags=re.S)


def functions(src):
    """(first line, last line, text) of each top-level brace block with the declarations before it."""
    out, depth, start, line, start_line = [], 0, 0, 1, 1
    for i, ch in enumerate(src):
        if ch == "\n":
            line += 1
        elif ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                out.append((start_line, line, src[start:i + 1]))
                start, start_line = i + 1, line
        elif ch == ";" and depth == 0:
            start, start_line = i + 1, line
    return out


def double_names(src):
    names = set()
    for m in DOUBLE_DECL.finditer(src):
        for part in m.group(1).split(","):
            n = part.split("=")[0].strip()
            if re.fullmatch(r"[A-Za-z_]\w*", n):
                names.add(n)
    return names


def violations():
    out = []
    for top in SCOPE:
        for dirpath, _, files in os.walk(os.path.join(ROOT, top)):
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                rel = os.path.relpath(path, ROOT)
                if rel == HELPER:
                    continue
                src = blank_literals(open(path, encoding="utf-8", errors="replace").read())
                scopes = [(a, b, double_names(t)) for a, b, t in functions(src)]
                for ln, line in enumerate(src.split("\n"), 1):
                    names = set().union(*[n for a, b, n in scopes if a <= ln <= b])
                    name_re = re.compile(r"\b(?:%s)\b" % "|".join(sorted(names))) if names else None
                    if MARK in line:
                        continue
                    for m in CAST.finditer(line):
                        op = operand(line, m.end())
                        if "valuedouble" in op or re.search(r"\.u\.f\b", op) or (name_re and name_re.search(
                                re.sub(r"\(\s*" + INT_TYPES + r"\s*\)", "", op))):
                            out.append("%s:%d: %s" % (rel, ln, " ".join(line.split())))
                            break
                    else:
                        for m in ROUND.finditer(line):
                            op = operand(line, m.end() - 1)
                            if "valuedouble" in op or (name_re and name_re.search(op)):
                                out.append("%s:%d: %s" % (rel, ln, " ".join(line.split())))
                                break
    return out


def test_no_unchecked_double_to_integer_cast():
    bad = violations()
    assert not bad, ("double-to-integer conversions outside the range check of src/util/json.c "
                     "(use di_json_int_in / di_double_to_int_in, see util/json.h):\n" + "\n".join(bad))


def test_scope_is_every_c_directory_of_src():
    # a new directory of C code under src/ must be scanned (or named here with its reason)
    tops = {"src/" + d for d in os.listdir(os.path.join(ROOT, "src"))
            if any(f.endswith((".c", ".h")) for _, _, fs in os.walk(os.path.join(ROOT, "src", d)) for f in fs)}
    assert tops <= set(SCOPE), "not scanned: " + ", ".join(sorted(tops - set(SCOPE)))


def test_rule_catches_the_issue_27_finding():
    # the rule must be able to fail: the original V4 config line is one of its violations
    line = "  r->original_max_pos = (int64_t)omax;"
    names = double_names("double omax = -1;")
    m = CAST.search(line)
    assert m and re.search(r"\b(?:%s)\b" % "|".join(names), operand(line, m.end()))
    line = "    ids[i] = (int32_t)v->valuedouble;"
    assert "valuedouble" in operand(line, CAST.search(line).end())


if __name__ == "__main__":
    print("\n".join(violations()))
