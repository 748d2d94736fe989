"""PyTorch DSpark block drafter for the shipped model, in DeepSpec's checkpoint layout.

What the C loader (src/arch/dspark_weights.c) reads, so a drafter trained by DeepSpec loads too:
config.json (a Qwen3 config plus block_size, target_layer_ids, mask_token_id, markov_rank,
markov_head_type "vanilla", enable_confidence_head, confidence_head_with_markov) and model.safetensors
with DeepSpec's names: fc.weight [H, n_feat*H_target], hidden_norm.weight, layers.N.{input_layernorm,
post_attention_layernorm}.weight, layers.N.self_attn.{q,k,v,o}_proj.weight, layers.N.self_attn.
{q,k}_norm.weight (per head, Qwen3), layers.N.mlp.{gate,up,down}_proj.weight, norm.weight,
markov_head.markov_w1.weight [V, r], markov_head.markov_w2.weight [V, r],
confidence_head.proj.{weight [1, H (+r)], bias [1]}. embed_tokens.weight / lm_head.weight may be left
out (ours are): DeepSpec copies them from the target and freezes them, so the target's are used.

The drafter (DeepSpec's design): the target's hidden states of `target_layer_ids` (HF numbering: the
output of that decoder layer; the last layer's after the final norm, as HF's output_hidden_states
gives it) are concatenated, projected by fc and normalised (hidden_norm): these "context" rows are the
keys/values every drafter layer sees (its own k_proj/v_proj/k_norm), cached per position. A block of
block_size rows [anchor token, mask, mask, ...] at positions a..a+B-1 attends to the context before a
and to the whole block (no causal mask inside it); row j predicts the token at a+j+1. Logits are
lm_head(norm(h_j)) plus the low-rank Markov term markov_w2 @ markov_w1[prev_j] (prev_0 = anchor token,
prev_j = draft j-1), so the block is made consistent left to right in a cheap sequential pass; the
confidence head is sigmoid(proj([h_j ; markov_w1[prev_j]])), the predicted acceptance of draft j.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

from model import MLP, RMSNorm  # training/model.py (the target's code): the same norm and SwiGLU MLP


def default_drafter_config(target_cfg):
    return {
        "architectures": ["Qwen3DSparkModel"],
        "model_type": "qwen3",
        "vocab_size": target_cfg["vocab_size"],
        "hidden_size": target_cfg["hidden_size"],
        "intermediate_size": 384,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "max_position_embeddings": target_cfg["max_position_embeddings"],
        "attention_bias": False,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "block_size": 5,
        "target_layer_ids": [0, 1, 3],
        "mask_token_id": 2,
        "num_anchors": 48,
        "markov_rank": 32,
        "markov_head_type": "vanilla",
        "enable_confidence_head": True,
        "confidence_head_with_markov": True,
        "torch_dtype": "bfloat16",
    }


def rope_cos_sin(positions, head_dim, theta):
    """Qwen3 RoPE (half-split pairs): cos/sin [..., head_dim] in float32."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim))
    f = positions.float()[..., None] * inv
    f = torch.cat([f, f], dim=-1)
    return f.cos(), f.sin()


def rotate(x, cos, sin):
    h = x.shape[-1] // 2
    rot = torch.cat([-x[..., h:], x[..., :h]], dim=-1)
    return x * cos.to(x.dtype) + rot * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c):
        super().__init__()
        H, self.nh, self.nkv, self.hd = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
        self.q_proj = nn.Linear(H, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(H, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.q_norm = RMSNorm(self.hd, c["rms_norm_eps"])
        self.k_norm = RMSNorm(self.hd, c["rms_norm_eps"])

    def forward(self, x, ctx, cos_q, sin_q, cos_k, sin_k, mask):
        """x [N, Q, H] block rows, ctx [N, C, H] context rows; keys = [ctx ; x]; mask [N, 1, Q, C+Q] bool."""
        N, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(N, Q, self.nh, self.hd)).transpose(1, 2)
        kv_in = torch.cat([ctx, x], dim=1)
        K = kv_in.shape[1]
        k = self.k_norm(self.k_proj(kv_in).view(N, K, self.nkv, self.hd)).transpose(1, 2)
        v = self.v_proj(kv_in).view(N, K, self.nkv, self.hd).transpose(1, 2)
        q = rotate(q, cos_q[:, None], sin_q[:, None])
        k = rotate(k, cos_k[:, None], sin_k[:, None])
        rep = self.nh // self.nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        q, k = q.to(v.dtype), k.to(v.dtype)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.hd ** -0.5)
        return self.o_proj(o.transpose(1, 2).reshape(N, Q, self.nh * self.hd))


class Layer(nn.Module):
    def __init__(self, c):
        super().__init__()
        H = c["hidden_size"]
        self.input_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(H, c["rms_norm_eps"])
        self.mlp = MLP(H, c["intermediate_size"])

    def forward(self, x, ctx, rope, mask):
        x = x + self.self_attn(self.input_layernorm(x), ctx, *rope, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class MarkovHead(nn.Module):
    def __init__(self, V, r):
        super().__init__()
        self.markov_w1 = nn.Embedding(V, r)
        self.markov_w2 = nn.Linear(r, V, bias=False)


class ConfidenceHead(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.proj = nn.Linear(dim, 1)


class Drafter(nn.Module):
    def __init__(self, c, embed_weight, lm_head_weight, target_hidden):
        super().__init__()
        self.c = c
        H = c["hidden_size"]
        self.fc = nn.Linear(len(c["target_layer_ids"]) * target_hidden, H, bias=False)
        self.hidden_norm = RMSNorm(H, c["rms_norm_eps"])
        self.layers = nn.ModuleList([Layer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = RMSNorm(H, c["rms_norm_eps"])
        self.markov_head = MarkovHead(c["vocab_size"], c["markov_rank"])
        self.confidence_head = ConfidenceHead(H + c["markov_rank"])
        # Frozen copies of the target's embedding and output head (not saved).
        self.register_buffer("embed", embed_weight.detach().clone(), persistent=False)
        self.register_buffer("head", lm_head_weight.detach().clone(), persistent=False)

    def init_weights(self, std=0.02):
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                nn.init.ones_(p)
            elif name.endswith("bias"):
                nn.init.zeros_(p)
            elif "markov_w2" in name:
                nn.init.zeros_(p)
            else:
                nn.init.normal_(p, std=std)

    def context(self, feats):
        return self.hidden_norm(self.fc(feats))

    def backbone(self, block_ids, block_pos, ctx, ctx_pos, mask):
        """block_ids/block_pos [N, Q]; ctx [N, C, H], ctx_pos [N, C]; returns norm(h) [N, Q, H]."""
        c = self.c
        x = F.embedding(block_ids, self.embed).to(ctx.dtype)
        cq, sq = rope_cos_sin(block_pos, c["head_dim"], c["rope_theta"])
        ck, sk = rope_cos_sin(torch.cat([ctx_pos, block_pos], dim=1), c["head_dim"], c["rope_theta"])
        for layer in self.layers:
            x = layer(x, ctx, (cq, sq, ck, sk), mask)
        return self.norm(x)

    def logits(self, h, prev_ids):
        base = F.linear(h, self.head.to(h.dtype))
        m = self.markov_head
        return base + m.markov_w2(m.markov_w1(prev_ids).to(h.dtype))

    def confidence_logit(self, h, prev_ids):
        feat = torch.cat([h, self.markov_head.markov_w1(prev_ids).to(h.dtype)], dim=-1)
        return self.confidence_head.proj(feat).squeeze(-1)

    def export(self, dtype=torch.bfloat16):
        return {k: v.detach().to("cpu", dtype).contiguous() for k, v in self.state_dict().items()}


def target_features(tm, ids, layer_ids):
    """Runs the target (training/model.py's DeepSeekV3): the concatenated features of layer_ids (the
    last layer's after model.norm) [N, T, n*H] and the target's logits [N, T, V]."""
    from model import rope_cos_sin as target_rope  # the target's (interleaved-pair) RoPE
    T = ids.shape[1]
    cos, sin = target_rope(tm.cfg, torch.arange(T, device=ids.device), ids.device)
    x = tm.embed_tokens(ids)
    feats = []
    last = len(tm.layers) - 1
    for i, layer in enumerate(tm.layers):
        x = layer(x, cos, sin)
        if i in layer_ids:
            feats.append((tm.norm(x) if i == last else x).float())
    logits = tm.lm_head(tm.norm(x))
    return torch.cat(feats, dim=-1), logits
