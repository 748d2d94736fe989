"""Rule-based answer extraction and judging for AIME (an integer) and GPQA (a letter A-D), and the
clean-up every judge sees first (reasoning removed).

AIME: the content of the LAST \\boxed{...} (or \\fbox{...}; braces matched, so \\boxed{\\frac{1}{2}} is
read whole), else the last "answer" line ("Final answer: 042", "The answer is $42$."). The content must
be one integer once LaTeX dressing is removed ($, \\text{}, spaces, thousands commas, a trailing
period, a leading "x ="): "042" reads as 42, "\\frac{1}{2}" or "12 or 13" as no answer (wrong).

GPQA: the letter of the last "answer is (C)" / "Answer: C" / \\boxed{C}; else a reply that is just the
letter ("C", "(C).") or a last line starting "(C)". A capital letter inside prose ("A good first
step ...") is never read as a choice: the letter must stand alone (a word boundary after it).
"""
import re

_THINK_CLOSE = re.compile(r"</think>", re.I)
_THINK_BLOCK = re.compile(r"<think>.*?</think>", re.I | re.S)


def strip_reasoning(text):
    """The reply without its reasoning: everything up to the last </think> goes (a template may open
    <think> in the prompt, so a lone closing tag counts); an unclosed <think> drops the rest."""
    text = text or ""
    m = None
    for m in _THINK_CLOSE.finditer(text):
        pass
    if m is not None:
        return text[m.end():].strip()
    text = _THINK_BLOCK.sub("", text)
    i = text.lower().find("<think>")
    if i >= 0:
        text = text[:i]
    return text.strip()


def last_boxed(text):
    """Content of the last \\boxed{...} or \\fbox{...} with nested braces, or None."""
    best = None
    for m in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i = 1, m.end()
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth == 0:
            best = text[m.end():i - 1]
    return best


_ANSWER_LINE = re.compile(r"(?:final\s+answer|answer)\s*(?:is|:|=)?\s*[:\s]*(.+)", re.I)


def _as_integer(s):
    if s is None:
        return None
    s = s.strip()
    s = re.sub(r"\\(?:text|textbf|mathrm|mathbf)\s*\{([^{}]*)\}", r"\1", s)
    s = s.replace("$", "").replace("\\!", "").replace("\\,", "").replace("**", "")
    s = re.sub(r"\^\s*\{?\\circ\}?", "", s)
    s = s.strip().rstrip(".").strip()
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)
    s = s.replace(" ", "")
    if re.fullmatch(r"[+-]?\d{1,3}(,\d{3})+", s):
        s = s.replace(",", "")
    if re.fullmatch(r"[+-]?\d+", s):
        return int(s)
    return None


def extract_integer(text):
    """The AIME answer of a reply (an int) or None."""
    text = strip_reasoning(text)
    boxed = last_boxed(text)
    if boxed is not None:
        return _as_integer(boxed)
    for line in reversed(text.splitlines()):
        m = _ANSWER_LINE.search(line)
        if m:
            v = _as_integer(m.group(1))
            if v is None:  # "The answer is 42 because ..." reads the first integer after "answer is"
                n = re.match(r"\s*\$?\s*([+-]?\d[\d,]*)\b", m.group(1))
                v = _as_integer(n.group(1)) if n else None
            if v is not None:
                return v
    return None


def parse_gold_integer(value):
    """The reference answer of an AIME row as an int (datasets store "033", "204" or 204)."""
    v = _as_integer(str(value))
    if v is None:
        raise ValueError(f"the reference answer {value!r} is not an integer")
    return v


_LETTER_PATTERNS = [
    re.compile(r"answer\s*(?:is|:)?\s*(?:option\s*)?[:\s]*\**\(?\s*([A-D])\s*\)?\**(?![A-Za-z0-9])", re.I),
    re.compile(r"\\boxed\s*\{\s*(?:\\text\{\s*)?\(?([A-D])\)?\s*\}?\s*\}"),
]


def extract_letter(text, letters="ABCD"):
    """The GPQA choice of a reply ('A'..'D') or None."""
    text = strip_reasoning(text)
    best = None
    for pat in _LETTER_PATTERNS:
        for m in pat.finditer(text):
            letter = m.group(1)
            if letter in letters and (best is None or m.start() >= best[0]):
                best = (m.start(), letter)
    if best:
        return best[1]
    whole = re.fullmatch(r"\s*\**\(?([A-D])\)?\**\.?\s*", text)
    if whole and whole.group(1) in letters:
        return whole.group(1)
    lines = [l for l in text.splitlines() if l.strip()]
    if lines:
        m = re.match(r"\s*\(([A-D])\)", lines[-1])
        if m and m.group(1) in letters:
            return m.group(1)
    return None
