"""Golden outputs of transformers for the native-format V4 checkpoint of make_v4_native.py.

usage: python3 golden_v4_native.py SRC_DIR OUT_DIR   (where torch and transformers with deepseek_v4 live)
Loads the dequantized weights (OUT_DIR/dequant.safetensors, in the naming of SRC_DIR's checkpoint, with SRC_DIR's
config: tests/data/models/dsv4-tiny) through transformers' own from_pretrained (which maps the checkpoint's names
onto its modules), checks that they differ from SRC_DIR's, and writes OUT_DIR/golden.safetensors in the layout of
the other fixtures (pN.ids / logits / greedy / margin) for SRC_DIR's golden prompts, float32 on the CPU. Then
removes dequant.safetensors (the project ships the quantized checkpoint and the golden only).
"""
import os, sys, time
import torch
from safetensors.torch import load_file, save_file
import transformers
from transformers import DeepseekV4ForCausalLM

torch.set_grad_enabled(False)
src, out = sys.argv[1], sys.argv[2]
t0 = time.time()
print("transformers", transformers.__version__, "torch", torch.__version__, flush=True)
import shutil, tempfile
tmp = tempfile.mkdtemp()
shutil.copy(os.path.join(src, "config.json"), tmp)
shutil.copy(os.path.join(out, "dequant.safetensors"), os.path.join(tmp, "model.safetensors"))
model = DeepseekV4ForCausalLM.from_pretrained(tmp, dtype=torch.float32).eval()
plain = DeepseekV4ForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
a, b = model.state_dict(), plain.state_dict()
changed = sum(1 for k in a if not torch.equal(a[k], b[k]))
print("module tensors", len(a), "changed by quantization:", changed, flush=True)
assert changed >= 4 * 5, "the dequantized weights did not reach the model"  # experts are fused modules: a layer's count once
shutil.rmtree(tmp)
ref = load_file(os.path.join(src, "golden.safetensors"))
golden = {}
for p in range(3):
    ids = ref[f"p{p}.ids"].tolist()
    lg = model(torch.tensor([ids])).logits[0].float()
    golden[f"p{p}.ids"] = torch.tensor(ids, dtype=torch.int32)
    golden[f"p{p}.logits"] = lg
    seq, greedy, margins = list(ids), [], []
    for _ in range(int(ref[f"p{p}.greedy"].numel())):
        last = model(torch.tensor([seq])).logits[0, -1].double()
        top2 = torch.topk(last, 2)
        greedy.append(int(top2.indices[0]))
        margins.append(float(top2.values[0] - top2.values[1]))
        seq.append(greedy[-1])
    golden[f"p{p}.greedy"] = torch.tensor(greedy, dtype=torch.int32)
    golden[f"p{p}.margin"] = torch.tensor(margins, dtype=torch.float32)
    d = (lg - ref[f"p{p}.logits"]).norm() / ref[f"p{p}.logits"].norm()
    print(f"p{p} T={len(ids)} greedy {greedy} min margin {min(margins):.2e}; logits vs the unquantized model rel {d:.3f}",
          flush=True)
save_file(golden, os.path.join(out, "golden.safetensors"))
os.remove(os.path.join(out, "dequant.safetensors"))
print(f"done in {time.time() - t0:.1f} s", flush=True)
