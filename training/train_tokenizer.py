#!/usr/bin/env python3
"""Trains the default model's byte-level BPE tokenizer (Hugging Face `tokenizers`) on the corpus.

The pre-tokenizer chain (digit split, CJK split, word/punctuation regex, byte-level mapping without the
regex) has the same shape as DeepSeek-V3's tokenizer, so an engine that runs DeepSeek-V3's tokenizer
runs this one. Special tokens come first (ids 0-4). Writes tokenizer.json and tokenizer_config.json
(with the Jinja chat template) into --out.

Usage: python3 training/train_tokenizer.py [--corpus .carry/corpus] [--out models/default] [--vocab 8192]
"""
import argparse, json, os
from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS, PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
SPECIALS = [BOS, EOS, PAD, USER, ASSISTANT]

# DeepSeek-V3 format: BOS, the system prompt as plain text, then <｜User｜>question<｜Assistant｜>answer<EOS>;
# tools, tool calls (DeepSeek-V3 markup) and tool outputs as in training/chat_template.jinja (the served template).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "chat_template.jinja"), encoding="utf-8") as _f:
    CHAT_TEMPLATE = _f.read().removesuffix("\n")

WORD_RE = (r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|"
           r" ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def texts(path, limit_chars):
    n = 0
    with open(path) as f:
        for line in f:
            t = json.loads(line)["text"]
            n += len(t)
            yield t
            if n >= limit_chars:
                return


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=".carry/corpus")
    ap.add_argument("--out", default="models/default")
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--limit-chars", type=int, default=60_000_000)
    a = ap.parse_args()

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"\p{N}{1,3}"), behavior="isolated"),
        pre_tokenizers.Split(Regex("[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"), behavior="isolated"),
        pre_tokenizers.Split(Regex(WORD_RE), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, min_frequency=2, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts(os.path.join(a.corpus, "train.jsonl"), a.limit_chars), trainer=trainer)
    # encode(..., add_special_tokens=True) prepends BOS, matching add_bos_token below.
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B",
                                                       special_tokens=[(BOS, 0)])
    for i, s in enumerate(SPECIALS):
        assert tok.token_to_id(s) == i, (s, tok.token_to_id(s))
    os.makedirs(a.out, exist_ok=True)
    tok.save(os.path.join(a.out, "tokenizer.json"))
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": True,
        "add_eos_token": False,
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    }
    with open(os.path.join(a.out, "tokenizer_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
        f.write("\n")
    print("vocab", tok.get_vocab_size())
    sample = "The quick brown fox jumps over the lazy dog. In 1984, 12345 items cost $3.50!"
    enc = tok.encode(sample)
    print(len(enc.ids), enc.tokens)
    print(repr(tok.decode(enc.ids, skip_special_tokens=True)))


if __name__ == "__main__":
    main()
