"""Logits of transformers' DeepseekV4ForCausalLM run WITH its cache, chunk by chunk, on the dsv4-tiny fixture:
the oracle of the cached CPU forward's chunk semantics (tests/model/test_v4_cached.c). transformers' CSA indexer
ranks every compressed entry that exists when a chunk runs, so exact score ties (frequent) can be broken differently
under different chunkings; this file pins what transformers itself does.

usage: python3 v4_cached_golden.py FIXTURE_DIR OUT.safetensors   (transformers >= 5.17 with deepseek_v4, torch)
Each case: c<i>.ids (int32 tokens), c<i>.chunks (int32 chunk sizes, summing to len(ids)), c<i>.pos (int32 positions
kept), c<i>.logits (float32 [len(pos), vocab]).
"""
import sys
import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV4ForCausalLM

torch.set_grad_enabled(False)
fixture, out = sys.argv[1], sys.argv[2]
model = DeepseekV4ForCausalLM.from_pretrained(fixture, dtype=torch.float32).eval()
gold = load_file(f"{fixture}/golden.safetensors")
V = model.config.vocab_size
g = torch.Generator().manual_seed(4242)

cases = []
# the fixture's 300-token prompt and its golden continuation: 7+128+165, then 8 decode steps
p2 = torch.cat([gold["p2.ids"], gold["p2.greedy"]]).tolist()
cases.append((p2, [7, 128, 165] + [1] * 8))
# the 40-token prompt one token at a time
p1 = torch.cat([gold["p1.ids"], gold["p1.greedy"]]).tolist()
cases.append((p1, [1] * len(p1)))
# a random 280-token sequence: 130 + 1-token steps (past two 128-token compression blocks and the window)
r = torch.randint(0, V, (280,), generator=g).tolist()
cases.append((r, [130] + [1] * 150))

res = {}
for ci, (ids, chunks) in enumerate(cases):
    assert sum(chunks) == len(ids)
    cache, at, rows = None, 0, []
    for k in chunks:
        o = model(torch.tensor([ids[at:at + k]]), past_key_values=cache, use_cache=True)
        cache = o.past_key_values
        rows.append(o.logits[0].float())
        at += k
    lg = torch.cat(rows)
    # keep every 8th position and every decode-step position: enough to see tie effects, small enough to ship
    pos = [t for t in range(len(ids)) if t % 8 == 7 or t >= len(ids) - 8]
    res[f"c{ci}.ids"] = torch.tensor(ids, dtype=torch.int32)
    res[f"c{ci}.chunks"] = torch.tensor(chunks, dtype=torch.int32)
    res[f"c{ci}.pos"] = torch.tensor(pos, dtype=torch.int32)
    res[f"c{ci}.logits"] = lg[pos].contiguous()
    full = model(torch.tensor([ids])).logits[0].float()
    d = ((lg - full).norm(dim=-1) / full.norm(dim=-1))
    print(f"case {ci}: T={len(ids)} chunks {chunks[:4]}... positions kept {len(pos)}; "
          f"positions where the cached run differs from one uncached call (rel > 1e-5): {int((d > 1e-5).sum())}")
save_file(res, out)
