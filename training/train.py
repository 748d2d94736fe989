#!/usr/bin/env python3
"""Trains the default model (training/model.py) on the prepared data, then evaluates it.

One run: pre-training on the corpus (with a few chat examples mixed in), then a short instruction phase
(chat examples at a higher rate, loss only on the answers) at the end of the learning-rate schedule.
Loss = CE(next token) + lambda * CE(MTP: token after next). The router correction biases are updated
with the auxiliary-loss-free rule of DeepSeek-V3 (bias += gamma * sign(mean load - expert load)).
Then it saves the Hugging Face folder and writes metrics.json (held-out perplexity, MTP agreement per
position bucket, greedy-generation draft acceptance) and samples.json.

Usage (GPU): python3 training/train.py --data .carry/data --out OUT/m/model   (defaults = the shipped run)
CPU smoke test: python3 training/train.py --tiny --device cpu --steps 20 --out /tmp/tiny
"""
import argparse, json, math, os, shutil, sys, time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import DeepSeekV3, default_config, save_hf  # noqa: E402

SAMPLE_PROMPTS = [
    "The meaning of life is",
    "Once upon a time, there was a little",
    "In the beginning God created",
    "The Debian project is",
    "To install a package, you",
    "def fibonacci(n):",
]
CHAT_PROMPTS = ['What does "happiness" mean?', "Who are you?", "Tell me a fortune.", 'Define "river".']
BUCKETS = [(0, 16), (16, 64), (64, 256), (256, 1024)]


def log(*a):
    print(*a, flush=True)


class Data:
    def __init__(self, path, name, device, mask=False):
        self.ids = torch.from_numpy(np.fromfile(os.path.join(path, f"{name}.bin"), dtype=np.uint16).astype(np.int32)).to(device)
        self.mask = None
        if mask:
            self.mask = torch.from_numpy(np.fromfile(os.path.join(path, f"{name}_mask.bin"), dtype=np.uint8)).to(device)
        self.device = device

    def batch(self, n, L, gen):
        off = torch.randint(0, self.ids.numel() - L - 1, (n,), device=self.device, generator=gen)
        idx = off[:, None] + torch.arange(L + 1, device=self.device)[None, :]
        x = self.ids[idx].long()
        m = self.mask[idx].float() if self.mask is not None else torch.ones_like(x, dtype=torch.float32)
        return x, m


def losses(model, x, m):
    """Main CE over x[:,1:] and MTP CE over x[:,2:], both weighted by the target mask."""
    inp = x[:, :-1]
    logits, mtp_logits = model(inp)
    V = logits.shape[-1]
    t1, m1 = x[:, 1:], m[:, 1:]
    ce = F.cross_entropy(logits.float().reshape(-1, V), t1.reshape(-1), reduction="none")
    main = (ce * m1.reshape(-1)).sum() / m1.sum().clamp(min=1)
    t2, m2 = x[:, 2:], m[:, 2:]
    ce2 = F.cross_entropy(mtp_logits.float().reshape(-1, V), t2.reshape(-1), reduction="none")
    mtp = (ce2 * m2.reshape(-1)).sum() / m2.sum().clamp(min=1)
    return main, mtp


@torch.no_grad()
def evaluate(model, data, L, max_windows=200):
    """Held-out perplexity and MTP statistics over consecutive windows of the held-out stream."""
    model.eval()
    ids = data.ids
    n = min(max_windows, (ids.numel() - 1) // (L + 1))
    tot = {"nll": 0.0, "n": 0, "mtp_nll": 0.0, "mtp_n": 0, "main_correct": 0, "mtp_correct": 0}
    agree = torch.zeros(len(BUCKETS), device=ids.device)
    cnt = torch.zeros(len(BUCKETS), device=ids.device)
    for w in range(0, n, 16):
        k = min(16, n - w)
        x = torch.stack([ids[(w + j) * (L + 1):(w + j + 1) * (L + 1)] for j in range(k)]).long()
        logits, mtp_logits = model(x[:, :-1])
        logits, mtp_logits = logits.float(), mtp_logits.float()
        V = logits.shape[-1]
        tot["nll"] += F.cross_entropy(logits.reshape(-1, V), x[:, 1:].reshape(-1), reduction="sum").item()
        tot["n"] += x[:, 1:].numel()
        tot["mtp_nll"] += F.cross_entropy(mtp_logits.reshape(-1, V), x[:, 2:].reshape(-1), reduction="sum").item()
        tot["mtp_n"] += x[:, 2:].numel()
        main_arg = logits.argmax(-1)                 # [k, L]: main's guess for x[i+1]
        mtp_arg = mtp_logits.argmax(-1)              # [k, L-1]: MTP's guess for x[i+2] from h[i], x[i+1]
        tot["main_correct"] += (main_arg == x[:, 1:]).sum().item()
        tot["mtp_correct"] += (mtp_arg == x[:, 2:]).sum().item()
        # Agreement: the MTP draft at i vs the main model's own greedy choice for the same token (its
        # argmax at position i+1, which sees x[i+1]) - what a speculative decoder would accept.
        ag = (mtp_arg == main_arg[:, 1:]).float()
        for b, (lo, hi) in enumerate(BUCKETS):
            seg = ag[:, lo:min(hi, ag.shape[1])]
            agree[b] += seg.sum()
            cnt[b] += seg.numel()
    model.train()
    return {
        "val_tokens": tot["n"],
        "val_loss": tot["nll"] / tot["n"],
        "val_ppl": math.exp(tot["nll"] / tot["n"]),
        "mtp_val_loss": tot["mtp_nll"] / tot["mtp_n"],
        "main_top1_acc": tot["main_correct"] / tot["n"],
        "mtp_top1_acc_vs_text": tot["mtp_correct"] / tot["mtp_n"],
        "mtp_agreement_overall": (agree.sum() / cnt.sum()).item(),
        "mtp_agreement_by_position": {f"{lo}-{hi - 1}": (agree[b] / cnt[b]).item() if cnt[b] > 0 else None
                                      for b, (lo, hi) in enumerate(BUCKETS)},
    }


@torch.no_grad()
def chat_val_loss(model, chat, L, n=64):
    model.eval()
    gen = torch.Generator(device=chat.ids.device).manual_seed(7)
    x, m = chat.batch(n, L, gen)
    main, mtp = losses(model, x, m)
    model.train()
    return main.item(), mtp.item()


@torch.no_grad()
def generate(model, ids, n, temperature=0.0, top_p=1.0, gen=None, stop=None):
    """Full recompute each step (no cache): simple and exact; the model is tiny."""
    seq = list(ids)
    for _ in range(n):
        logits = model(torch.tensor([seq], device=model.lm_head.weight.device))[0][0, -1].float()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            p = torch.softmax(logits / temperature, -1)
            sp, si = p.sort(descending=True)
            keep = (sp.cumsum(-1) - sp) < top_p
            sp = sp * keep
            nxt = int(si[torch.multinomial(sp / sp.sum(), 1, generator=gen)])
        seq.append(nxt)
        if stop is not None and nxt == stop:
            break
    return seq


@torch.no_grad()
def greedy_acceptance(model, val, n_prompts=8, prefix=32, n_new=96):
    """Greedy-generates from held-out prefixes, then checks the MTP draft at every generated position
    against the next-next greedy token: the acceptance rate of one-token speculative decoding."""
    model.eval()
    hits = tot = 0
    for k in range(n_prompts):
        start = k * 9973 % (val.ids.numel() - prefix - 1)
        seq = generate(model, val.ids[start:start + prefix].tolist(), n_new)
        x = torch.tensor([seq], device=val.ids.device)
        _, mtp_logits = model(x)
        mtp_arg = mtp_logits[0].float().argmax(-1)  # row i predicts seq[i+2]
        lo = prefix - 1
        hits += (mtp_arg[lo:-1] == x[0, lo + 2:]).sum().item()
        tot += x.shape[1] - lo - 2
    model.train()
    return hits / max(tot, 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=".carry/data")
    ap.add_argument("--tok", default="models/default")
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny config for a CPU smoke test")
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--epochs", type=float, default=14.0, help="passes over the corpus (token budget)")
    ap.add_argument("--steps", type=int, default=0, help="fixed step count (overrides --epochs)")
    ap.add_argument("--time-budget", type=float, default=240.0, help="seconds of training at most")
    ap.add_argument("--lr", type=float, default=2.5e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--mtp-lambda", type=float, default=0.3)
    ap.add_argument("--bias-gamma", type=float, default=1e-3)
    ap.add_argument("--chat-frac", type=float, default=0.05, help="chat rows per batch, pre-training phase")
    ap.add_argument("--chat-phase", type=float, default=0.2, help="final fraction of training = chat phase")
    ap.add_argument("--chat-phase-frac", type=float, default=0.5, help="chat rows per batch in that phase")
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    dev = torch.device(a.device)
    torch.manual_seed(a.seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    train, val = Data(a.data, "train", dev), Data(a.data, "val", dev)
    chat, chat_val = Data(a.data, "chat_train", dev, mask=True), Data(a.data, "chat_val", dev, mask=True)
    from tokenizers import Tokenizer
    vocab = Tokenizer.from_file(os.path.join(a.tok, "tokenizer.json")).get_vocab_size()
    cfg = default_config(vocab_size=vocab)
    if a.tiny:
        cfg.update(hidden_size=64, intermediate_size=128, moe_intermediate_size=16, q_lora_rank=32, kv_lora_rank=16,
                   num_hidden_layers=2)
    model = DeepSeekV3(cfg).to(dev)
    model.init_weights()
    n_params = sum(p.numel() for p in model.parameters())
    # Stored tensors: + copies of embed_tokens and lm_head inside the MTP layer.
    n_stored = n_params + model.embed_tokens.weight.numel() + model.lm_head.weight.numel()
    log(f"params (trained, shared embed/head) {n_params:,}; stored in checkpoint {n_stored:,}")
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8, fused=(dev.type == "cuda"))
    fwd = torch.compile(model) if a.compile else model
    tokens_per_step = a.batch * a.seq
    total_steps = a.steps or max(1, int(a.epochs * train.ids.numel() / tokens_per_step))
    log(f"train tokens {train.ids.numel():,}, val {val.ids.numel():,}, chat {chat.ids.numel():,}; "
        f"{total_steps} steps of {tokens_per_step} tokens; time budget {a.time_budget}s")
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    amp = torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
    history, t0, step = [], time.time(), 0
    moes = model.moe_layers()
    while True:
        elapsed = time.time() - t0
        progress = max(step / total_steps, elapsed / a.time_budget)
        if progress >= 1.0:
            break
        if step < a.warmup:
            lr = a.lr * (step + 1) / a.warmup
        else:
            lr = a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        in_chat_phase = progress >= 1.0 - a.chat_phase
        n_chat = int(round(a.batch * (a.chat_phase_frac if in_chat_phase else a.chat_frac)))
        xs, ms = train.batch(a.batch - n_chat, a.seq, gen)
        if n_chat:
            xc, mc = chat.batch(n_chat, a.seq, gen)
            xs, ms = torch.cat([xs, xc]), torch.cat([ms, mc])
        with amp:
            main, mtp = losses(fwd, xs, ms)
            loss = main + a.mtp_lambda * mtp
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():  # auxiliary-loss-free load balancing
            for m in moes:
                load = m.last_load.float()
                m.e_score_correction_bias += a.bias_gamma * torch.sign(load.mean() - load)
        step += 1
        if step % 50 == 0 or step == 1:
            torch.cuda.synchronize() if dev.type == "cuda" else None
            el = time.time() - t0
            log(f"step {step:5d} lr {lr:.2e} loss {main.item():.4f} mtp {mtp.item():.4f} gn {gn.item():.2f} "
                f"{'chat ' if in_chat_phase else ''}{step * tokens_per_step / el / 1e3:.0f}k tok/s {el:.0f}s")
        if a.eval_every and step % a.eval_every == 0:
            ev = evaluate(model, val, a.seq, max_windows=32)
            history.append({"step": step, "time": time.time() - t0, "val_loss": ev["val_loss"],
                            "mtp_val_loss": ev["mtp_val_loss"], "train_loss": main.item()})
            log(f"  eval step {step}: val loss {ev['val_loss']:.4f} ppl {ev['val_ppl']:.2f} "
                f"mtp {ev['mtp_val_loss']:.4f} agree {ev['mtp_agreement_overall']:.3f}")
    train_time = time.time() - t0
    log(f"trained {step} steps, {step * tokens_per_step:,} tokens in {train_time:.1f}s")

    # Save first, so that a failure in the evaluation below cannot lose the model.
    model.eval()
    gen_cfg = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2, "do_sample": True,
               "temperature": 0.7, "top_p": 0.95, "max_new_tokens": 128}
    save_hf(model, a.out)
    json.dump(gen_cfg, open(os.path.join(a.out, "generation_config.json"), "w"), indent=2)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(a.tok, f), os.path.join(a.out, f))
    bias = {f"layer{i}": [round(v, 4) for v in m.e_score_correction_bias.tolist()] for i, m in enumerate(moes)}
    metrics = {"steps": step, "tokens": step * tokens_per_step, "train_seconds": train_time,
               "params_trained": n_params, "params_stored": n_stored, "config": cfg, "args": vars(a),
               "history": history, "router_bias": bias,
               "device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}
    json.dump(metrics, open(os.path.join(os.path.dirname(a.out.rstrip("/")) or ".", "metrics.json"), "w"), indent=1)
    log("saved", a.out)

    # Evaluation in float32 (TF32 off), so the numbers describe the saved model closely.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    model.float()
    # bf16-round the weights, as saved.
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(p.to(torch.bfloat16).float())
    t1 = time.time()
    ev = evaluate(model, val, a.seq)
    ev["chat_val_loss"], ev["chat_mtp_val_loss"] = chat_val_loss(model, chat_val, a.seq)
    ev["greedy_draft_acceptance"] = greedy_acceptance(model, val)
    metrics["eval"] = ev
    log(json.dumps(ev, indent=1))
    tok = Tokenizer.from_file(os.path.join(a.tok, "tokenizer.json"))
    samples = []
    g = torch.Generator(device=dev).manual_seed(1234)
    for p in SAMPLE_PROMPTS:
        ids = tok.encode(p).ids
        greedy = generate(model, ids, 48)
        sampled = generate(model, ids, 48, temperature=0.8, top_p=0.95, gen=g)
        samples.append({"prompt": p, "greedy": tok.decode(greedy[len(ids):]), "sampled": tok.decode(sampled[len(ids):])})
    for q in CHAT_PROMPTS:
        ids = [0, 3] + tok.encode(q, add_special_tokens=False).ids + [4]
        out = generate(model, ids, 64, stop=1)
        samples.append({"chat": q, "greedy": tok.decode(out[len(ids):])})
    for s in samples:
        log(json.dumps(s, ensure_ascii=False))
    metrics["eval_seconds"] = time.time() - t1
    json.dump(metrics, open(os.path.join(os.path.dirname(a.out.rstrip("/")) or ".", "metrics.json"), "w"), indent=1)
    json.dump(samples, open(os.path.join(os.path.dirname(a.out.rstrip("/")) or ".", "samples.json"), "w"), indent=1,
              ensure_ascii=False)
    log(f"SUMMARY steps {step} train {train_time:.0f}s val_ppl {ev['val_ppl']:.2f} "
        f"mtp_agree {ev['mtp_agreement_overall']:.3f} greedy_accept {ev['greedy_draft_acceptance']:.3f} "
        f"chat_val_loss {ev['chat_val_loss']:.3f}")


if __name__ == "__main__":
    main()
