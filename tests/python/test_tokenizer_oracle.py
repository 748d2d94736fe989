"""Tokenizer against the Hugging Face `tokenizers` library (the Rust implementation, from PyPI) on
10,000+ seeded random strings per family: encode (with and without special tokens), decode (with
and without skipping specials, plus transformers' clean-up where tokenizer_config.json asks), the
streaming detokenizer, invalid UTF-8 input, and the raw (non-JSONL) CLI modes.
Needs DEEPINFER_CLI (the deepinfer binary); the fixtures live in tests/data/tokenizers."""
import json
import lzma
import os
import random
import shutil
import subprocess
import unicodedata
import zlib
from pathlib import Path

import pytest

tokenizers = pytest.importorskip("tokenizers")

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "tokenizers"
CLI = os.environ.get("DEEPINFER_CLI")
FAMILIES = ["deepseek-v3", "llama3", "qwen3", "gpt4o", "llama2"]
N_TEXTS = 10000

pytestmark = pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI is not set")


@pytest.fixture(scope="module")
def tokdirs(tmp_path_factory):
    out = {}
    for fam in FAMILIES:
        src = DATA / fam
        if (src / "tokenizer.json").exists():
            out[fam] = src
            continue
        d = tmp_path_factory.mktemp(fam)
        with lzma.open(src / "tokenizer.json.xz") as f:
            (d / "tokenizer.json").write_bytes(f.read())
        shutil.copy(src / "tokenizer_config.json", d / "tokenizer_config.json")
        out[fam] = d
    return out


WORDS = ("the quick brown fox jumps over lazy dog Hello World don't I'm we're they've she'll he'd "
         "It's THE CAT'S DON'T naïve café résumé Zürich straße Ελληνικά Русский язык привет мир "
         "العربية مرحبا עברית हिन्दी नमस्ते ไทย สวัสดี 한국어 안녕하세요 日本語 こんにちは カタカナ "
         "中文 你好世界 汉字 Tiếng Việt Türkçe İstanbul ǅemal Ⅻ ½ ² ٣٤٥ ０１２ ＡＢＣ ﬁ ﬀ ℌ ㈱ ㍻").split()
CODE = ["def f(x):\n    return x ** 2\n", "for (int i = 0; i < n; i++) {\n\tsum += a[i];\n}",
        "<div class=\"a\">&nbsp;</div>", "SELECT * FROM t WHERE id=42;", "x=>x+1", "#include <stdio.h>",
        "if __name__ == '__main__':", "{\"key\": [1, 2.5e-3, null]}", "a_b-c.d/e\\f", "$HOME/~user",
        "fn main() -> Result<(), Box<dyn Error>>", "    \n\n    pass", "@decorator\n", "`code` **bold**"]
EMOJI = ["😀", "👍🏽", "👨‍👩‍👧‍👦", "🇫🇷", "❤️", "🤖", "✨", "🧑🏿‍💻", "☃", "🏳️‍🌈", "\U0001F9EA", "🫠"]
SPACES = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n ", "\u00a0", "\u3000", "\u2009", "\u2028",
          "\u0085", "\u200b", "\ufeff", " " * 17, "\t\t\n", "\n" * 5, " \t \t", "\u180e"]
MARKS = ["e\u0301", "a\u0308", "o\u0302\u0323", "\u1100\u1161\u11a8", "A\u030a", "n\u0303", "\u0915\u093c",
         "i\u0307", "\u0301", "ﾊﾟ", "ｶﾞ"]


def rand_cp(rng):
    while True:
        r = rng.random()
        if r < 0.5:
            cp = rng.randint(0x20, 0x2FFF)
        elif r < 0.8:
            cp = rng.randint(0x3000, 0xFFFD)
        else:  # emoji and CJK extension B: old enough that every library's tables agree
            cp = rng.randint(0x1F300, 0x1F64F) if rng.random() < 0.5 else rng.randint(0x20000, 0x2A6D6)
        # assigned in Python's Unicode (14): characters added later may be classified differently
        # by PCRE2's tables (Unicode 15) and Oniguruma's; that difference is documented, not tested
        # (and no random combining marks: HF's NFC tables are older than Unicode 14, so marks added
        # since get another combining class there; common marks come from MARKS)
        if unicodedata.category(chr(cp)) not in ("Cn", "Cs") and not unicodedata.combining(chr(cp)):
            return chr(cp)


def gen_texts(seed, specials, n=N_TEXTS):
    rng = random.Random(seed)
    texts = []
    for i in range(n):
        parts = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.30:
                w = rng.choice(WORDS)
                parts.append(w.upper() if rng.random() < 0.1 else w)
            elif r < 0.40:
                parts.append(rng.choice(CODE))
            elif r < 0.48:
                parts.append(rng.choice(EMOJI))
            elif r < 0.60:
                parts.append(rng.choice(SPACES))
            elif r < 0.68:
                parts.append(str(rng.randint(0, 10 ** rng.randint(1, 12))))
            elif r < 0.74:
                parts.append(rng.choice(MARKS))
            elif r < 0.80 and specials:
                s = rng.choice(specials)
                parts.append(rng.choice(["", " ", "\n"]) + s + rng.choice(["", " ", "\n", "x"]))
            elif r < 0.90:
                parts.append("".join(rand_cp(rng) for _ in range(rng.randint(1, 6))))
            else:
                parts.append(rng.choice("!?.,;:'\"()[]{}<>-_=+*/\\|@#$%^&~`") * rng.randint(1, 4))
            if rng.random() < 0.5:
                parts.append(rng.choice([" ", "", "\n", ", "]))
        t = "".join(parts)
        texts.append(t.replace("\x00", ""))
    texts[:6] = ["", " ", "\n", "Hello world", " " * 300 + "x", "a" * 3000]
    return texts


def cleanup(s):
    # transformers' PreTrainedTokenizerBase.clean_up_tokenization
    return (s.replace(" .", ".").replace(" ?", "?").replace(" !", "!").replace(" ,", ",")
            .replace(" ' ", "'").replace(" n't", "n't").replace(" 'm", "'m").replace(" 's", "'s")
            .replace(" 've", "'ve").replace(" 're", "'re"))


def run_cli(args, data):
    p = subprocess.run([CLI] + args, input=data, capture_output=True, timeout=300)
    assert p.returncode == 0, p.stderr.decode(errors="replace")[:2000]
    return p.stdout


def cli_jsonl(args, objs, key):
    data = "".join(json.dumps(o) + "\n" for o in objs).encode()
    out = run_cli(args + ["--jsonl"], data).decode().split("\n")[:-1]  # not splitlines: U+2028 is text
    assert len(out) == len(objs)
    return [json.loads(line)[key] for line in out]


def first_mismatch(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare(name, texts, ref, got):
    bad = [i for i in range(len(ref)) if ref[i] != got[i]]
    if bad:
        msgs = []
        for i in bad[:5]:
            k = first_mismatch(ref[i], got[i])
            msgs.append(f"{name} #{i} text={texts[i]!r:.200}: HF {ref[i]!r:.300} vs ours {got[i]!r:.300} (first diff at {k})")
        pytest.fail(f"{len(bad)}/{len(ref)} mismatches\n" + "\n".join(msgs))


@pytest.mark.parametrize("fam", FAMILIES)
def test_oracle(fam, tokdirs):
    d = tokdirs[fam]
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    clean = bool(cfg.get("clean_up_tokenization_spaces", False))
    added = json.loads((d / "tokenizer.json").read_text())["added_tokens"]
    specials = [a["content"] for a in added][:64]
    seed = zlib.crc32(fam.encode()) + int(os.environ.get("DI_TOK_SEED", "0"))  # (str hash() is salted)
    texts = gen_texts(seed, specials)
    args = ["--tokenizer", str(d)]

    ref = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    got = cli_jsonl(["tokenize"] + args, [{"text": t} for t in texts], "ids")
    compare(f"{fam} encode", texts, ref, got)

    sub = texts[:1000]
    ref_sp = [e.ids for e in tok.encode_batch(sub, add_special_tokens=True)]
    got_sp = cli_jsonl(["tokenize", "--add-special-tokens"] + args, [{"text": t} for t in sub], "ids")
    compare(f"{fam} encode+specials", sub, ref_sp, got_sp)

    # decode: the oracle's ids, plus random id sequences (split UTF-8, byte tokens, specials)
    rng = random.Random(11)
    vocab = tok.get_vocab_size(with_added_tokens=True)
    ids_lists = ref[:4000] + [[rng.randrange(vocab) for _ in range(rng.randint(0, 40))] for _ in range(2000)]
    valid = [[i for i in ids if tok.id_to_token(i) is not None] for ids in ids_lists]
    for skip in (False, True):
        ref_dec = tok.decode_batch(valid, skip_special_tokens=skip)
        if clean:
            ref_dec = [cleanup(s) for s in ref_dec]
        flags = ["--skip-special-tokens"] if skip else []
        got_dec = cli_jsonl(["detokenize"] + flags + args, [{"ids": v} for v in valid], "text")
        compare(f"{fam} decode skip={skip}", valid, ref_dec, got_dec)
        got_stream = cli_jsonl(["detokenize", "--stream"] + flags + args, [{"ids": v} for v in valid], "text")
        compare(f"{fam} stream skip={skip}", valid, ref_dec, got_stream)


@pytest.mark.parametrize("fam", ["deepseek-v3", "llama2"])
def test_raw_modes_and_invalid_utf8(fam, tokdirs):
    d = tokdirs[fam]
    tok = tokenizers.Tokenizer.from_file(str(d / "tokenizer.json"))
    args = ["--tokenizer", str(d)]
    # stdin is taken verbatim: the trailing newline and NUL bytes are text
    for text in ["Hello world\n", "a\x00b\n\n", "  x  ", ""]:
        got = json.loads(run_cli(["tokenize"] + args, text.encode()))
        assert got == tok.encode(text, add_special_tokens=False).ids, text
    # policy: each maximal invalid UTF-8 subsequence reads as U+FFFD (Python's errors="replace")
    for raw in [b"abc\xff\xfe def", b"\xe4\xbd", b"x\xed\xa0\x80y", b"\xf0\x9f\x98", b"ok \xc3\x28 \x80\x80"]:
        got = json.loads(run_cli(["tokenize"] + args, raw))
        assert got == tok.encode(raw.decode("utf-8", "replace"), add_special_tokens=False).ids, raw
    ids = tok.encode("Hello 世界 😀\n", add_special_tokens=False).ids
    out = run_cli(["detokenize"] + args, json.dumps(ids).encode())
    assert out.decode() == tok.decode(ids)
    p = subprocess.run([CLI, "detokenize"] + args, input=b"[1, 2, 99999999]", capture_output=True)
    assert p.returncode != 0 and b"outside the vocab" in p.stderr
    p = subprocess.run([CLI, "tokenize", "--tokenizer", str(ROOT / "tests")], input=b"x", capture_output=True)
    assert p.returncode != 0 and b"tokenizer.json" in p.stderr


def _bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


@pytest.mark.skipif(not os.environ.get("DEEPINFER_LIB"), reason="DEEPINFER_LIB is not set")
@pytest.mark.parametrize("fam", FAMILIES)
def test_token_bytes_and_facts(fam, tokdirs):
    """di_tokenizer_token_bytes (what the grammar engine masks with) for every id, through ctypes."""
    import ctypes as C
    lib = C.CDLL(os.environ["DEEPINFER_LIB"])
    lib.di_tokenizer_load.argtypes = [C.c_char_p, C.POINTER(C.c_void_p)]
    lib.di_tokenizer_token_bytes.argtypes = [C.c_void_p, C.c_int32, C.POINTER(C.c_size_t)]
    lib.di_tokenizer_token_bytes.restype = C.POINTER(C.c_char)
    lib.di_tokenizer_vocab_size.argtypes = [C.c_void_p]
    lib.di_tokenizer_is_special.argtypes = [C.c_void_p, C.c_int32]
    lib.di_tokenizer_bos_id.argtypes = [C.c_void_p]
    lib.di_tokenizer_add_bos.argtypes = [C.c_void_p]
    lib.di_tokenizer_free.argtypes = [C.c_void_p]
    h = C.c_void_p()
    assert lib.di_tokenizer_load(str(tokdirs[fam]).encode(), C.byref(h)) == 0
    tok = tokenizers.Tokenizer.from_file(str(tokdirs[fam] / "tokenizer.json"))
    cfg = json.loads((tokdirs[fam] / "tokenizer_config.json").read_text())
    added = {a["id"]: a for a in json.loads((tokdirs[fam] / "tokenizer.json").read_text())["added_tokens"]}
    vs = lib.di_tokenizer_vocab_size(h)
    assert vs == max(tok.get_vocab(with_added_tokens=True).values()) + 1
    bl = fam != "llama2"
    inv = _bytes_to_unicode()
    n = C.c_size_t()
    bad = []
    ids = sorted(set(range(min(vs, 2000))) | set(range(0, vs, 5)) | set(added))  # (all ids: too slow in ctypes)
    for i in ids:
        s = tok.id_to_token(i)
        p = lib.di_tokenizer_token_bytes(h, i, C.byref(n))
        got = None if not p else C.string_at(p, n.value)
        if s is None:
            exp = None
        elif i in added and added[i]["special"]:
            exp = added[i]["content"].encode()
        elif bl:
            exp = bytes(inv[c] for c in s) if all(c in inv for c in s) else s.encode()
        elif len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
            exp = bytes([int(s[3:5], 16)])
        else:
            exp = s.replace("\u2581", " ").encode()
        if got != exp:
            bad.append((i, s, exp, got))
        assert bool(lib.di_tokenizer_is_special(h, i)) == (i in added and added[i]["special"])
    assert not bad, bad[:5]
    bos = cfg.get("bos_token")
    bos = bos["content"] if isinstance(bos, dict) else bos
    assert lib.di_tokenizer_bos_id(h) == (tok.token_to_id(bos) if bos else -1)
    assert lib.di_tokenizer_add_bos(h) == int(bool(cfg.get("add_bos_token", False)))
    lib.di_tokenizer_free(h)
