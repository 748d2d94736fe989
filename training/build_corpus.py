#!/usr/bin/env python3
"""Builds the training corpus of the default model from Debian packages, reproducibly.

Downloads a fixed list of packages with `apt-get download`, extracts them with `dpkg-deb -x`, turns each
source into plain-text documents, cleans and deduplicates them (paragraph-level exact dedup), and writes
`train.jsonl` / `val.jsonl` (one {"src", "text"} per line; ~1% of documents held out by a hash of their
id) plus `stats.json` into the output folder. Licences of the sources: training/LICENSES.md.

Usage: python3 training/build_corpus.py [--work DIR] [--out DIR]   (defaults: .carry/debs, .carry/corpus)
"""
import argparse, glob, gzip, hashlib, html, html.parser, json, os, re, subprocess, sys, unicodedata, zlib

# Package -> what we take from it. Versions are whatever Debian bookworm serves; stats.json records them.
PACKAGES = ["bible-kjv", "bible-kjv-text", "fortunes", "fortunes-min", "dict-gcide", "dict-devil",
            "wordnet-base", "jargon-text", "debian-handbook", "debian-reference-en", "gnu-standards",
            "doc-debian", "python3.11-doc", "libpython3.11-stdlib", "manpages", "perl-doc"]

# Upper bounds (characters) per source, so that prose dominates: code and man pages are capped low.
CAPS = {"kjv": 5_000_000, "fortunes": 3_000_000, "gcide": 9_000_000, "devil": 1_000_000,
        "wordnet": 6_000_000, "jargon": 2_000_000, "handbook": 6_000_000, "debref": 2_000_000,
        "gnu": 1_000_000, "docdebian": 500_000, "pydoc": 9_000_000, "pysrc": 3_000_000, "man": 1_500_000,
        "perldoc": 5_000_000}


def sh(cmd, **kw):
    return subprocess.run(cmd, check=True, **kw)


def fetch(work):
    os.makedirs(work, exist_ok=True)
    x = os.path.join(work, "x")
    have = {os.path.basename(p).split("_")[0] for p in glob.glob(os.path.join(work, "*.deb"))}
    need = [p for p in PACKAGES if p not in have]
    if need:
        sh(["apt-get", "download"] + need, cwd=work)
    versions = {}
    for deb in sorted(glob.glob(os.path.join(work, "*.deb"))):
        name, ver = os.path.basename(deb).split("_")[:2]
        if name not in PACKAGES:
            continue
        versions[name] = ver.replace("%3a", ":")
        dst = os.path.join(x, name)
        if not os.path.isdir(dst):
            os.makedirs(dst)
            sh(["dpkg-deb", "-x", deb, dst])
    return x, versions


def read(path):
    op = gzip.open if path.endswith(".gz") or path.endswith(".dz") else open
    with op(path, "rb") as f:
        return f.read().decode("utf-8", "replace")


# ---------------------------------------------------------------- sources: each yields (doc_id, text)

def src_kjv(x):
    out = subprocess.run([f"{x}/bible-kjv/usr/bin/bible", "-p", f"{x}/bible-kjv-text/usr/lib",
                          "gen1:1-rev22:21"], check=True, capture_output=True, env={"COLUMNS": "100000"}).stdout
    text = out.decode("utf-8", "replace")
    # Chapters start with a "Book N" line; verses are "  N text" possibly wrapped.
    for chap in re.split(r"\n(?=[1-3]? ?[A-Z][A-Za-z ]+ \d+\n)", text):
        lines = chap.strip().split("\n")
        if len(lines) < 2:
            continue
        title, body = lines[0].strip(), " ".join(l.strip() for l in lines[1:])
        verses = [v.strip() for v in re.split(r"\s*\b\d+ (?=[A-Z\[])", body) if v.strip()]
        yield "kjv:" + title, title + "\n\n" + " ".join(verses)


def src_fortunes(x):
    skip = {"ascii-art", "translate-me", "zippy", "knghtbrd"}
    files = sorted(glob.glob(f"{x}/fortunes/usr/share/games/fortunes/*") +
                   glob.glob(f"{x}/fortunes-min/usr/share/games/fortunes/*"))
    for path in files:
        name = os.path.basename(path)
        if "." in name or name in skip or os.path.isdir(path):
            continue
        items = [c.strip("\n") for c in re.split(r"\n%\n", read(path)) if c.strip()]
        for i in range(0, len(items), 40):
            yield f"fortunes:{name}:{i}", "\n\n".join(items[i:i + 40])


def src_dict(path, name):
    """dictd .dict.dz: entries separated by blank lines before a new headword line at column 0."""
    body = read(path)
    entries = re.split(r"\n\n(?=\S)", body)
    group = []
    for e in entries:
        if (e.startswith("00-") or "00-database" in e[:40] or "Begin file" in e[:80]
                or re.search(r"Free Software Foundation|\* \* \* \*|GCIDE|[Rr]edistribute|General Public|WARRANTY|notice shown", e)):
            continue
        e = re.sub(r"\s*\[(?:1913 Webster|WordNet[^\]]*|PJC|Webster 1913 Suppl\.|[^\]]{0,20}\+PJC)\]", "", e)
        e = re.sub(r" ?\\[^\\\n]{1,80}\\", "", e)  # pronunciation \Ap`o*phleg"ma*tism\
        e = re.sub(r"\{([^}]*)\}", r"\1", e)  # cross references {word}
        e = re.sub(r"[ \t]+\n", "\n", e).strip()
        if len(e) < 30 or not re.search(r"[a-z]{3}", e):
            continue
        group.append(e)
        if len(group) == 50:
            yield f"{name}:{len(group)}:{hashlib.md5(group[0].encode()).hexdigest()[:8]}", "\n\n".join(group)
            group = []
    if group:
        yield f"{name}:end", "\n\n".join(group)


WN_POS = {"n": "noun", "v": "verb", "a": "adjective", "s": "adjective", "r": "adverb"}


def wordnet_glosses(x):
    """(lemma, pos, gloss) from WordNet data.* files."""
    for part in ("noun", "verb", "adj", "adv"):
        for line in open(f"{x}/wordnet-base/usr/share/wordnet/data.{part}", encoding="utf-8", errors="replace"):
            if line.startswith("  ") or "|" not in line:
                continue
            head, gloss = line.split("|", 1)
            f = head.split()
            pos, nw = f[2], int(f[3], 16)
            words = [f[4 + 2 * i].replace("_", " ") for i in range(nw)]
            words = [re.sub(r"\([a-z]+\)$", "", w) for w in words]
            yield words, WN_POS.get(pos, pos), gloss.strip()


def src_wordnet(x):
    group = []
    for words, pos, gloss in wordnet_glosses(x):
        line = f"{words[0]} ({pos}): {gloss}"
        if len(words) > 1:
            line += " Also called: " + ", ".join(words[1:4]) + "."
        group.append(line)
        if len(group) == 60:
            yield f"wordnet:{words[0]}:{pos}", "\n".join(group)
            group = []


class _HTMLText(html.parser.HTMLParser):
    BLOCK = {"p", "div", "br", "li", "h1", "h2", "h3", "h4", "h5", "pre", "tr", "dt", "dd", "table", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts, self.skip = [], 0

    def handle_starttag(self, tag, attrs):
        if tag in ("script", "style", "head"):
            self.skip += 1
        elif tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag):
        if tag in ("script", "style", "head"):
            self.skip = max(0, self.skip - 1)
        elif tag in self.BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data):
        if not self.skip:
            self.parts.append(data)


def html_to_text(s):
    p = _HTMLText()
    p.feed(s)
    paras = []
    for para in re.split(r"\n\s*\n", "".join(p.parts)):
        para = re.sub(r"[ \t]*\n[ \t]*", "\n", para).strip()
        if not para:
            continue
        # Reflow prose paragraphs; keep preformatted-looking ones (many short lines) as they are.
        lines = para.split("\n")
        if len(lines) > 1 and sum(len(l) for l in lines) / len(lines) > 40:
            para = " ".join(lines)
        paras.append(re.sub(r"[ \t]{2,}", " ", para))
    return "\n\n".join(paras)


def src_handbook(x):
    for path in sorted(glob.glob(f"{x}/debian-handbook/usr/share/doc/debian-handbook/html/en-US/*.html")):
        yield "handbook:" + os.path.basename(path), html_to_text(read(path))


def src_debref(x):
    text = read(f"{x}/debian-reference-en/usr/share/debian-reference/debian-reference.en.txt.gz")
    for i, chunk in enumerate(re.split(r"\n(?=Chapter \d+\. )", text)):
        yield f"debref:{i}", chunk


def src_text_files(paths, name):
    for path in paths:
        yield f"{name}:{os.path.basename(path)}", read(path)


def rst_clean(s):
    s = re.sub(r":[a-z:]+:`~?([^`<]*?)(?: <[^>]*>)?`", r"\1", s)  # :func:`x` -> x
    s = re.sub(r"``([^`]*)``", r"\1", s)
    s = re.sub(r"`([^`<]*?)(?: <[^>]*>)?`_+", r"\1", s)
    s = re.sub(r"^\.\. (?:index|highlight|toctree|sectionauthor|moduleauthor|versionadded|versionchanged|"
               r"testsetup|testcleanup|only|include|_[^:]*):.*(?:\n[ \t]+.*)*", "", s, flags=re.M)
    s = re.sub(r"^([=\-~^\"'*#+]{3,})$", "", s, flags=re.M)
    return s


def src_pydoc(x):
    root = f"{x}/python3.11-doc/usr/share/doc/python3.11/html/_sources"
    for path in sorted(glob.glob(f"{root}/**/*.rst.txt", recursive=True)):
        rel = os.path.relpath(path, root)
        if rel.startswith(("whatsnew/changelog", "c-api/")):
            continue
        yield "pydoc:" + rel, rst_clean(read(path))


def src_pysrc(x):
    root = f"{x}/libpython3.11-stdlib/usr/lib/python3.11"
    for path in sorted(glob.glob(f"{root}/**/*.py", recursive=True)):
        rel = os.path.relpath(path, root)
        if "/test" in rel or rel.startswith(("test", "lib2to3", "idlelib", "pydoc_data", "encodings")):
            continue
        if os.path.isfile(path) and not os.path.islink(path):
            yield "pysrc:" + rel, read(path)


def troff_to_text(s):
    out = []
    for line in s.split("\n"):
        if line.startswith(('.\\"', "'\\\"", ".TH", ".ad", ".nh", ".ds", ".de", ".ie", ".el", ".if", ".so")):
            continue
        m = re.match(r"^\.(B|I|BR|IR|RB|RI|BI|IB|SM|SB)\s+(.*)$", line)
        if m:
            line = m.group(2).replace('"', "")
        elif re.match(r"^\.(SH|SS)\s", line):
            line = "\n" + line[4:].replace('"', "") + "\n"
        elif line.startswith("."):
            out.append("\n")
            continue
        line = re.sub(r"\\f[BIRPC(]?[A-Z]?[BIRP]?", "", line)
        line = re.sub(r"\\\(em|\\\(en", "-", line)
        line = re.sub(r"\\\([a-z]{2}", "", line)
        line = line.replace("\\-", "-").replace("\\&", "").replace("\\e", "\\").replace("\\ ", " ")
        out.append(line)
    text = "\n".join(out)
    paras = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if p.strip()]
    return "\n\n".join(paras)


def src_man(x):
    for path in sorted(glob.glob(f"{x}/manpages/usr/share/man/man*/*.gz")):
        t = read(path)
        if len(t) < 400 or t.startswith(".so"):
            continue
        yield "man:" + os.path.basename(path), troff_to_text(t)


def pod_clean(s):
    out = []
    for line in s.split("\n"):
        if line.startswith("="):
            m = re.match(r"=head\d\s+(.*)|=item\s+(.*)", line)
            if m:
                out.append("\n" + (m.group(1) or m.group(2)).strip("* ") + "\n")
            continue
        out.append(line)
    s = "\n".join(out)
    for _ in range(3):  # nested formatting codes: B<C<x>>
        s = re.sub(r"[XZ]<[^<>]*>", "", s)
        s = re.sub(r"L<(?:[^<>|]*\|)?([^<>]*)>", r"\1", s)
        s = re.sub(r"[BCIFSE]<+\s*([^<>]*?)\s*>+", r"\1", s)
    return s


def src_perldoc(x):
    for path in sorted(glob.glob(f"{x}/perl-doc/usr/share/perl/*/pod/*.pod")):
        name = os.path.basename(path)
        if re.match(r"perl5\d+delta|perlhist|perltoc|perlapi|perlintern", name):
            continue
        yield "perldoc:" + name, pod_clean(read(path))


def sources(x):
    gnu = [f"{x}/gnu-standards/usr/share/doc/gnu-standards/{n}.text.gz" for n in ("standards", "maintain")]
    docdeb = sorted(p for p in glob.glob(f"{x}/doc-debian/usr/share/doc/debian/*")
                    if re.search(r"(social-contract|constitution|mailing-lists|debian-manifesto|bug-)", p)
                    and not p.endswith(".html"))
    return [
        ("kjv", src_kjv(x)),
        ("fortunes", src_fortunes(x)),
        ("gcide", src_dict(f"{x}/dict-gcide/usr/share/dictd/gcide.dict.dz", "gcide")),
        ("devil", src_dict(f"{x}/dict-devil/usr/share/dictd/devil.dict.dz", "devil")),
        ("wordnet", src_wordnet(x)),
        ("jargon", src_text_files([f"{x}/jargon-text/usr/share/doc/jargon-text/jargon.txt.gz"], "jargon")),
        ("handbook", src_handbook(x)),
        ("debref", src_debref(x)),
        ("gnu", src_text_files(gnu, "gnu")),
        ("docdebian", src_text_files(docdeb, "docdebian")),
        ("pydoc", src_pydoc(x)),
        ("pysrc", src_pysrc(x)),
        ("man", src_man(x)),
        ("perldoc", src_perldoc(x)),
    ]


# ---------------------------------------------------------------- cleaning

_CTRL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def clean(text):
    text = unicodedata.normalize("NFC", text).replace("\r\n", "\n").replace("\t", "    ")
    text = _CTRL.sub("", text)
    text = re.sub(r"[ ]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text)
    return text.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", default=".carry/debs")
    ap.add_argument("--out", default=".carry/corpus")
    ap.add_argument("--val-frac", type=float, default=0.01)
    a = ap.parse_args()
    x, versions = fetch(a.work)
    os.makedirs(a.out, exist_ok=True)
    seen = set()
    stats = {"packages": versions, "sources": {}}
    with open(os.path.join(a.out, "train.jsonl"), "w") as ftr, open(os.path.join(a.out, "val.jsonl"), "w") as fva:
        for name, gen in sources(x):
            chars = docs = dropped = 0
            for doc_id, text in gen:
                if chars >= CAPS[name]:
                    break
                # Paragraph-level exact dedup (whitespace-normalised), across all sources.
                keep = []
                for para in clean(text).split("\n\n"):
                    key = hashlib.blake2b(" ".join(para.split()).lower().encode(), digest_size=12).digest()
                    if key in seen and len(para) > 20:
                        dropped += 1
                        continue
                    seen.add(key)
                    keep.append(para)
                # Long documents are cut at paragraph boundaries (~20k chars) so the held-out split is fine-grained.
                pieces, cur = [], []
                for para in keep:
                    cur.append(para)
                    if sum(len(c) for c in cur) > 20000:
                        pieces.append(cur)
                        cur = []
                pieces.append(cur)
                for k, piece in enumerate(pieces):
                    text = "\n\n".join(piece).strip()
                    if len(text) < 200:
                        continue
                    pid = f"{doc_id}#{k}"
                    held = zlib.crc32(pid.encode()) % 10000 < a.val_frac * 10000
                    (fva if held else ftr).write(json.dumps({"src": name, "id": pid, "text": text}) + "\n")
                    chars += len(text)
                    docs += 1
            stats["sources"][name] = {"docs": docs, "chars": chars, "dup_paragraphs_dropped": dropped}
            print(f"{name:10s} docs {docs:6d} chars {chars:10d} dup-paras {dropped}", flush=True)
    stats["total_chars"] = sum(s["chars"] for s in stats["sources"].values())
    json.dump(stats, open(os.path.join(a.out, "stats.json"), "w"), indent=1)
    print("total chars", stats["total_chars"])


if __name__ == "__main__":
    sys.exit(main())
