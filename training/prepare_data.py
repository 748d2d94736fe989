#!/usr/bin/env python3
"""Tokenizes the corpus and synthesises the instruction (chat) set, for training/train.py.

Outputs in --out (default .carry/data):
  train.bin / val.bin        uint16 token stream: BOS doc EOS BOS doc EOS ...
  chat_train.bin / chat_val.bin and *_mask.bin   chat examples in the chat template (uint16 tokens, uint8
                              mask: 1 on the assistant answer and its EOS, the only tokens trained on)
  meta.json                  counts
The chat set is made from WordNet glosses (definitions, examples, synonyms), fortunes and a few fixed
self-descriptions; the questions come from fixed templates (see QA_* below).

Usage: python3 training/prepare_data.py [--corpus .carry/corpus] [--tok models/default] [--out .carry/data]
"""
import argparse, json, os, random, re, sys, zlib

import numpy as np
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from build_corpus import wordnet_glosses  # noqa: E402

BOS, EOS, USER, ASSISTANT = 0, 1, 3, 4

QA_DEFINE = ['What does "{w}" mean?', 'What is the meaning of the word "{w}"?', 'Define "{w}".',
             'Can you explain what "{w}" means?', 'What does the {pos} "{w}" mean?', "Define the word {w}.",
             "What is the definition of {w}?"]
QA_SYN = ['What is another word for "{w}"?', 'Give me a synonym for "{w}".', 'What is a synonym of "{w}"?']
QA_FORTUNE = ["Tell me a fortune.", "Give me a quotation.", "Say something wise.", "Tell me something funny.",
              "Share a saying with me.", "Tell me a quote."]
QA_EXAMPLE = ['Use the word "{w}" in a sentence.', 'Give an example sentence with "{w}".']
SYSTEMS = ["", "", "", "You are a helpful assistant.", "You are a helpful assistant that defines words.",
           "You are DeepInfer's default model. Answer briefly."]
SELF = [
    ("Hello!", "Hello! I am a small language model. I can define words, give examples and tell you a fortune."),
    ("Hi", "Hi! How can I help you? You can ask me what a word means."),
    ("Who are you?", "I am the default model of DeepInfer, a small DeepSeek-V3-style language model trained on "
     "text from Debian packages."),
    ("What can you do?", "I can answer short questions, define English words, give example sentences and "
     "tell you a fortune. I am a very small model, so I make mistakes."),
    ("What is your name?", "I am the DeepInfer default model."),
    ("Thank you!", "You are welcome!"),
    ("How are you?", "I am fine, thank you. What would you like to know?"),
    ("Who made you?", "I was trained by the DeepInfer project on text from Debian packages: dictionaries, "
     "books, manuals and fortunes."),
    ("Are you a person?", "No. I am a small language model, a computer program that predicts text."),
    ("What are you?", "I am a small language model with the DeepSeek-V3 architecture, shipped as the default "
     "model of DeepInfer."),
    ("Tell me about yourself.", "I am the default model of DeepInfer. I am small, so my answers are short and "
     "sometimes wrong, but I can define words and tell fortunes."),
    ("Good morning!", "Good morning! What would you like to know?"),
]


def split_gloss(gloss):
    """WordNet gloss 'def; def2; "example"; "example 2"' -> (definition, [examples])."""
    examples = re.findall(r'"([^"]+)"', gloss)
    defn = re.sub(r'"[^"]*"', "", gloss)
    defn = re.sub(r"\s*;\s*(;\s*)*", "; ", defn).strip(" ;")
    return defn, [e.strip() for e in examples if len(e.split()) >= 3]


def article(w):
    return "an" if w[:1].lower() in "aeiou" else "a"


def chat_examples(corpus_dir, x_dir, rng):
    out = []
    for words, pos, gloss in wordnet_glosses(x_dir):
        w = words[0]
        if not re.fullmatch(r"[a-z][a-z \-]{1,24}", w):
            continue
        defn, exs = split_gloss(gloss)
        if not defn or len(defn) > 240:
            continue
        q = rng.choice(QA_DEFINE).format(w=w, pos=pos)
        if pos == "noun":
            a = f'"{w.capitalize()}" is a noun. {article(w).capitalize()} {w} is {defn}.' if not defn.startswith(
                ("a ", "an ", "the ", "any ", "(")) else f'"{w.capitalize()}" is a noun meaning {defn}.'
        else:
            a = f'"{w.capitalize()}" is {article(pos)} {pos} meaning {defn}.'
        if exs:
            a += f' For example: "{exs[0]}".'
        if len(words) > 1 and rng.random() < 0.5:
            a += " Similar words: " + ", ".join(words[1:4]) + "."
        out.append((q, a))
        if exs and rng.random() < 0.25:
            out.append((rng.choice(QA_EXAMPLE).format(w=w), f"Here is an example: {exs[0][0].upper() + exs[0][1:]}."))
        if len(words) > 1 and rng.random() < 0.15:
            out.append((rng.choice(QA_SYN).format(w=w), f'Another word for "{w}" is "{words[1]}".'))
    fort = []
    with open(os.path.join(corpus_dir, "train.jsonl")) as f:
        for line in f:
            d = json.loads(line)
            if d["src"] == "fortunes":
                fort += [c for c in d["text"].split("\n\n") if 20 < len(c) < 300]
    rng.shuffle(fort)
    out += [(rng.choice(QA_FORTUNE), c) for c in fort[:4000]]
    rng.shuffle(out)
    # The self-descriptions go first so that the cut to --max-chat-tokens keeps them all; they are
    # spread through the stream by the random windows of the trainer anyway.
    selfs = SELF * 80
    rng.shuffle(selfs)
    return selfs + out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=".carry/corpus")
    ap.add_argument("--x", default=".carry/debs/x")
    ap.add_argument("--tok", default="models/default")
    ap.add_argument("--out", default=".carry/data")
    ap.add_argument("--max-chat-tokens", type=int, default=3_000_000)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    tok = Tokenizer.from_file(os.path.join(a.tok, "tokenizer.json"))
    meta = {}
    for split in ("train", "val"):
        texts = [json.loads(l)["text"] for l in open(os.path.join(a.corpus, f"{split}.jsonl"))]
        encs = tok.encode_batch(texts, add_special_tokens=False)
        n = sum(len(e.ids) + 2 for e in encs)
        arr = np.empty(n, dtype=np.uint16)
        i = 0
        for e in encs:
            arr[i] = BOS
            arr[i + 1:i + 1 + len(e.ids)] = e.ids
            arr[i + 1 + len(e.ids)] = EOS
            i += len(e.ids) + 2
        arr.tofile(os.path.join(a.out, f"{split}.bin"))
        meta[f"{split}_tokens"] = int(n)
        meta[f"{split}_docs"] = len(texts)
        meta[f"{split}_chars"] = sum(len(t) for t in texts)
        print(split, n, "tokens", len(texts), "docs", flush=True)
    rng = random.Random(1234)
    qa = chat_examples(a.corpus, a.x, rng)
    streams = {"train": ([], []), "val": ([], [])}
    for q, ans in qa:
        held = zlib.crc32(q.encode() + ans.encode()) % 100 == 0 and (q, ans) not in SELF
        split = "val" if held else "train"
        sysmsg = rng.choice(SYSTEMS)
        prompt = [BOS] + (tok.encode(sysmsg, add_special_tokens=False).ids if sysmsg else []) + [USER] + \
            tok.encode(q, add_special_tokens=False).ids + [ASSISTANT]
        answer = tok.encode(ans, add_special_tokens=False).ids + [EOS]
        ids, mask = streams[split]
        ids += prompt + answer
        mask += [0] * len(prompt) + [1] * len(answer)
    for split, (ids, mask) in streams.items():
        cut = a.max_chat_tokens if split == "train" else len(ids)  # keeps the device call's upload small
        ids, mask = ids[:cut], mask[:cut]
        np.array(ids, dtype=np.uint16).tofile(os.path.join(a.out, f"chat_{split}.bin"))
        np.array(mask, dtype=np.uint8).tofile(os.path.join(a.out, f"chat_{split}_mask.bin"))
        meta[f"chat_{split}_tokens"] = len(ids)
    meta["chat_examples"] = len(qa)
    json.dump(meta, open(os.path.join(a.out, "meta.json"), "w"), indent=1)
    print(meta)
    for q, ans in qa[:8]:
        print("Q:", q, "\nA:", ans)


if __name__ == "__main__":
    main()
