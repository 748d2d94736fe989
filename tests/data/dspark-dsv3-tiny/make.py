"""Writes the random DSpark drafter of tests/data/models/dsv3-tiny used by the CUDA engine test
(tests/cuda/test_cuda_engine.c): 1 layer, block 4, target layers [0, 2], Markov rank 16, a confidence
head; the target's embedding and head are shared (absent here). Random weights (seed 22): its drafts
are rarely accepted, which is what a test of verification (greedy equal to plain decoding) needs."""
import json, os, numpy as np
from safetensors.numpy import save_file

here = os.path.dirname(os.path.abspath(__file__))
target = json.load(open(os.path.join(here, "..", "models", "dsv3-tiny", "config.json")))
H, V = target["hidden_size"], target["vocab_size"]
c = {"architectures": ["Qwen3DSparkModel"], "model_type": "qwen3", "vocab_size": V, "hidden_size": H,
     "intermediate_size": 256, "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
     "head_dim": 32, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 4096,
     "attention_bias": False, "tie_word_embeddings": False, "hidden_act": "silu", "block_size": 4,
     "target_layer_ids": [0, 2], "mask_token_id": 2, "markov_rank": 16, "markov_head_type": "vanilla",
     "enable_confidence_head": True, "confidence_head_with_markov": True, "torch_dtype": "float32"}
rng = np.random.default_rng(22)
def w(*shape, std=0.05):
    return (rng.standard_normal(shape) * std).astype(np.float32)
t = {"fc.weight": w(H, 2 * H), "hidden_norm.weight": np.ones(H, np.float32), "norm.weight": np.ones(H, np.float32),
     "markov_head.markov_w1.weight": w(V, 16), "markov_head.markov_w2.weight": w(V, 16),
     "confidence_head.proj.weight": w(1, H + 16), "confidence_head.proj.bias": np.zeros(1, np.float32)}
p = "layers.0."
t.update({p + "input_layernorm.weight": np.ones(H, np.float32), p + "post_attention_layernorm.weight": np.ones(H, np.float32),
          p + "self_attn.q_norm.weight": np.ones(32, np.float32), p + "self_attn.k_norm.weight": np.ones(32, np.float32),
          p + "self_attn.q_proj.weight": w(128, H), p + "self_attn.k_proj.weight": w(64, H),
          p + "self_attn.v_proj.weight": w(64, H), p + "self_attn.o_proj.weight": w(H, 128),
          p + "mlp.gate_proj.weight": w(256, H), p + "mlp.up_proj.weight": w(256, H), p + "mlp.down_proj.weight": w(H, 256)})
save_file(t, os.path.join(here, "model.safetensors"))
json.dump(c, open(os.path.join(here, "config.json"), "w"), indent=2)
