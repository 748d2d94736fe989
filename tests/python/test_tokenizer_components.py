"""Every tokenizer.json component DeepInfer implements, against the Hugging Face `tokenizers`
library: small BPE models are trained here, then dressed with each normalizer, pre-tokenizer (every
Split behavior, inverted or not), decoder, post-processor and added-token flag, written to
tokenizer.json, and compared on seeded random text (encode with/without specials, decode with/
without skipping specials, streaming). Needs DEEPINFER_CLI."""
import copy
import json
import os
import random

import pytest

tokenizers = pytest.importorskip("tokenizers")
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers  # noqa: E402

from test_tokenizer_oracle import CLI, cli_jsonl, compare, gen_texts  # noqa: E402

pytestmark = pytest.mark.skipif(not CLI, reason="DEEPINFER_CLI is not set")
N = 1000

ADDED = [
    {"content": "<lst>", "lstrip": True, "rstrip": False, "single_word": False, "normalized": False, "special": True},
    {"content": "[rs]", "lstrip": False, "rstrip": True, "single_word": False, "normalized": False, "special": False},
    {"content": "word", "lstrip": False, "rstrip": False, "single_word": True, "normalized": False, "special": False},
    {"content": "NoRM", "lstrip": False, "rstrip": False, "single_word": False, "normalized": True, "special": False},
    {"content": "<both>", "lstrip": True, "rstrip": True, "single_word": False, "normalized": True, "special": True},
    {"content": "<s>", "lstrip": False, "rstrip": False, "single_word": False, "normalized": False, "special": True},
]
ADDED_TEXTS = ["<lst>", "[rs]", "word", "NoRM", "norm", "<both>", "<s>", "words", "a word!", "sword"]


def train(pre, corpus):
    tok = Tokenizer(models.BPE(unk_token="<unk>" if pre != "bytelevel" else None))
    if pre == "bytelevel":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        alphabet = []
    tr = trainers.BpeTrainer(vocab_size=1500, special_tokens=["<unk>"] if pre != "bytelevel" else [],
                             initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator(corpus, tr)
    d = json.loads(tok.to_str())
    if pre != "bytelevel":  # SentencePiece style: byte-fallback tokens <0x00>..<0xFF>
        vocab = d["model"]["vocab"]
        for b in range(256):
            vocab.setdefault("<0x%02X>" % b, len(vocab))
    return d


@pytest.fixture(scope="module")
def bases():
    corpus = gen_texts(99, ADDED_TEXTS, n=3000)
    return {"bytelevel": train("bytelevel", corpus), "meta": train("meta", corpus)}


def j(obj):
    return json.loads(obj.to_str()) if hasattr(obj, "to_str") else json.loads(json.dumps(obj))


def sub(o):  # serialized form of a component built with the Python API
    t = Tokenizer(models.BPE())
    if isinstance(o, normalizers.Normalizer):
        t.normalizer = o
        return json.loads(t.to_str())["normalizer"]
    if isinstance(o, pre_tokenizers.PreTokenizer):
        t.pre_tokenizer = o
        return json.loads(t.to_str())["pre_tokenizer"]
    if isinstance(o, decoders.Decoder):
        t.decoder = o
        return json.loads(t.to_str())["decoder"]
    t.post_processor = o
    return json.loads(t.to_str())["post_processor"]


BL = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
BEHAVIORS = ["removed", "isolated", "merged_with_previous", "merged_with_next", "contiguous"]


def configs():
    out = []
    for beh in BEHAVIORS:
        for inv in (False, True):
            out.append((f"split-{beh}-{'inv' if inv else 'fwd'}", "bytelevel", {
                "pre_tokenizer": sub(pre_tokenizers.Sequence([
                    pre_tokenizers.Split(tokenizers.Regex(r"\s+|\p{N}|[.,!?]+"), beh, invert=inv), BL])),
                "decoder": sub(decoders.ByteLevel())}))
    out.append(("split-string", "bytelevel", {
        "pre_tokenizer": sub(pre_tokenizers.Sequence([pre_tokenizers.Split(" ", "merged_with_next"), BL])),
        "decoder": sub(decoders.ByteLevel())}))
    out.append(("bytelevel-regex-prefix+nfkc-lower-strip-replace", "bytelevel", {
        "normalizer": sub(normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip(),
                                                normalizers.Replace(tokenizers.Regex(r"\d+"), "#")])),
        "pre_tokenizer": sub(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True)),
        "decoder": sub(decoders.ByteLevel()),
        "post_processor": sub(tokenizers.processors.ByteLevel())}))
    out.append(("digits-whitespace+template", "bytelevel", {
        "normalizer": sub(normalizers.NFD()),
        "pre_tokenizer": sub(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                      pre_tokenizers.Digits(individual_digits=False), BL])),
        "decoder": sub(decoders.ByteLevel()),
        "post_processor": sub(tokenizers.processors.TemplateProcessing(
            single="<s> $A <lst>", special_tokens=[("<s>", 0), ("<lst>", 1)]))}))
    for scheme in ("always", "first", "never"):
        for split in (True, False):
            out.append((f"metaspace-{scheme}-{split}", "meta", {
                "normalizer": sub(normalizers.NFKD()) if split else None,
                "pre_tokenizer": sub(pre_tokenizers.Metaspace(prepend_scheme=scheme, split=split)),
                "decoder": sub(decoders.Sequence([decoders.ByteFallback(),
                                                  decoders.Metaspace(prepend_scheme=scheme, split=split)])),
                "model_extra": {"byte_fallback": True, "fuse_unk": False}}))
    out.append(("llama2-style", "meta", {
        "normalizer": sub(normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])),
        "pre_tokenizer": None,
        "decoder": sub(decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                          decoders.Strip(" ", 1, 0)])),
        "model_extra": {"byte_fallback": True, "fuse_unk": True}}))
    out.append(("whitespace-unk-fuse", "meta", {
        "pre_tokenizer": sub(pre_tokenizers.Whitespace()),
        "decoder": sub(decoders.Sequence([decoders.Strip("▁", 0, 1), decoders.Fuse()])),  # (start > 0 can panic HF)
        "model_extra": {"byte_fallback": False, "fuse_unk": True}}))
    out.append(("whitespacesplit-unk-nofuse-lowercase", "meta", {
        "normalizer": sub(normalizers.Lowercase()),
        "pre_tokenizer": sub(pre_tokenizers.WhitespaceSplit()),
        "decoder": None,
        "model_extra": {"byte_fallback": False, "fuse_unk": False}}))
    return out


CONFIGS = configs()


@pytest.mark.parametrize("name,base,parts", CONFIGS, ids=[c[0] for c in CONFIGS])
def test_component(name, base, parts, bases, tmp_path):
    d = copy.deepcopy(bases[base])
    for k in ("normalizer", "pre_tokenizer", "decoder", "post_processor"):
        if k in parts:
            d[k] = parts[k]
    d["model"].update(parts.get("model_extra", {}))
    vocab = d["model"]["vocab"]
    added, fresh = [], 0
    for a in ADDED:  # ids as HF assigns them: the vocab's, else the next free one
        a = dict(a)
        if a["content"] in vocab:
            a["id"] = vocab[a["content"]]
        else:
            a["id"] = len(vocab) + fresh
            fresh += 1
        added.append(a)
    d["added_tokens"] = added
    if d.get("post_processor") and d["post_processor"].get("type") == "TemplateProcessing":
        for k, v in d["post_processor"]["special_tokens"].items():
            v["ids"] = [next(a["id"] for a in added if a["content"] == k)]
    text = json.dumps(d, ensure_ascii=False)
    (tmp_path / "tokenizer.json").write_text(text, encoding="utf-8")
    tok = Tokenizer.from_str(text)
    texts = gen_texts(len(name) * 7919 + sum(map(ord, name)), ADDED_TEXTS, n=N)
    args = ["--tokenizer", str(tmp_path)]
    for add in (False, True):
        ref = [e.ids for e in tok.encode_batch(texts, add_special_tokens=add)]
        got = cli_jsonl(["tokenize"] + (["--add-special-tokens"] if add else []) + args,
                        [{"text": t} for t in texts], "ids")
        compare(f"{name} encode add={add}", texts, ref, got)
    rng = random.Random(5)
    vs = tok.get_vocab_size(with_added_tokens=True)
    ids_lists = ref[:600] + [[rng.randrange(vs) for _ in range(rng.randint(0, 30))] for _ in range(400)]
    ids_lists = [[i for i in ids if tok.id_to_token(i) is not None] for ids in ids_lists]
    for skip in (False, True):
        ref_dec = tok.decode_batch(ids_lists, skip_special_tokens=skip)
        flags = ["--skip-special-tokens"] if skip else []
        got = cli_jsonl(["detokenize"] + flags + args, [{"ids": v} for v in ids_lists], "text")
        compare(f"{name} decode skip={skip}", ids_lists, ref_dec, got)
        got = cli_jsonl(["detokenize", "--stream"] + flags + args, [{"ids": v} for v in ids_lists], "text")
        compare(f"{name} stream skip={skip}", ids_lists, ref_dec, got)
