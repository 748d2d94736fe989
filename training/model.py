"""PyTorch DeepSeek-V3 model with one MTP module, used to train the shipped default model.

It computes exactly what transformers' DeepseekV3ForCausalLM computes from the saved weights (MLA with
q_lora, interleaved-pair RoPE, sigmoid router with correction bias and group-limited top-k, shared
expert), plus the DeepSeek-V3 multi-token-prediction (MTP) module. `export_state_dict` / `load_hf`
convert to and from the Hugging Face checkpoint layout (per-expert tensors, MTP at layer index N).
"""
import json
import math
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


def rope_cos_sin(cfg, positions, device):
    """cos/sin [T, rope_dim/2] for plain RoPE (rope_scaling null) in float32, per rotated pair."""
    d = cfg["qk_rope_head_dim"]
    inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32, device=device) / d))
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def apply_rope_pairs(x, cos, sin):
    """Rotates adjacent pairs (x0,x1),(x2,x3),... by one frequency each; the output is laid out as
    [rotated evens | rotated odds], which is what transformers' apply_rotary_pos_emb_interleave returns.
    q and k get the same permutation, so attention scores equal those of in-place pair rotation."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class MLA(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        H, nh = cfg["hidden_size"], cfg["num_attention_heads"]
        self.nh, self.nope, self.rope, self.vd = nh, cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
        self.kv_lora = cfg["kv_lora_rank"]
        self.q_a_proj = nn.Linear(H, cfg["q_lora_rank"], bias=False)
        self.q_a_layernorm = RMSNorm(cfg["q_lora_rank"], cfg["rms_norm_eps"])
        self.q_b_proj = nn.Linear(cfg["q_lora_rank"], nh * (self.nope + self.rope), bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(H, self.kv_lora + self.rope, bias=False)
        self.kv_a_layernorm = RMSNorm(self.kv_lora, cfg["rms_norm_eps"])
        self.kv_b_proj = nn.Linear(self.kv_lora, nh * (self.nope + self.vd), bias=False)
        self.o_proj = nn.Linear(nh * self.vd, H, bias=False)
        self.scale = (self.nope + self.rope) ** -0.5

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, self.nh, -1).transpose(1, 2)
        q_nope, q_rot = q.split([self.nope, self.rope], dim=-1)
        ckv = self.kv_a_proj_with_mqa(x)
        kv_lat, k_rot = ckv.split([self.kv_lora, self.rope], dim=-1)
        kv = self.kv_b_proj(self.kv_a_layernorm(kv_lat)).view(B, T, self.nh, -1).transpose(1, 2)
        k_nope, v = kv.split([self.nope, self.vd], dim=-1)
        q_rot = apply_rope_pairs(q_rot, cos, sin)
        k_rot = apply_rope_pairs(k_rot.view(B, 1, T, self.rope), cos, sin).expand(B, self.nh, T, self.rope)
        q = torch.cat([q_nope, q_rot], dim=-1)
        k = torch.cat([k_nope, k_rot], dim=-1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        return self.o_proj(o.transpose(1, 2).reshape(B, T, self.nh * self.vd))


class MLP(nn.Module):
    def __init__(self, H, inter):
        super().__init__()
        self.gate_proj = nn.Linear(H, inter, bias=False)
        self.up_proj = nn.Linear(H, inter, bias=False)
        self.down_proj = nn.Linear(inter, H, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class MoE(nn.Module):
    """Routed experts are stored stacked ([E, I, H]) and computed densely: every expert runs on every
    token and its output is multiplied by the routing weight, which is zero for experts not chosen.
    For experts this small that is faster than gathering tokens, and it is the same function."""

    def __init__(self, cfg):
        super().__init__()
        H, E, I = cfg["hidden_size"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        self.E, self.I, self.k = E, I, cfg["num_experts_per_tok"]
        self.n_group, self.topk_group = cfg["n_group"], cfg["topk_group"]
        self.scaling = cfg["routed_scaling_factor"]
        self.norm_topk = cfg["norm_topk_prob"]
        self.gate_weight = nn.Parameter(torch.empty(E, H))
        self.register_buffer("e_score_correction_bias", torch.zeros(E))
        self.w_gate = nn.Parameter(torch.empty(E, I, H))
        self.w_up = nn.Parameter(torch.empty(E, I, H))
        self.w_down = nn.Parameter(torch.empty(E, H, I))
        self.shared_experts = MLP(H, I * cfg["n_shared_experts"])
        self.last_load = None

    def route(self, x):
        with torch.autocast(device_type=x.device.type, enabled=False):
            scores = F.linear(x.float(), self.gate_weight.float()).sigmoid()
        choice = scores + self.e_score_correction_bias
        g = choice.view(-1, self.n_group, self.E // self.n_group).topk(2, dim=-1)[0].sum(-1)
        gidx = g.topk(self.topk_group, dim=-1, sorted=False)[1]
        gmask = torch.zeros_like(g).scatter_(1, gidx, 1.0)
        smask = gmask.unsqueeze(-1).expand(-1, self.n_group, self.E // self.n_group).reshape(-1, self.E)
        choice = choice.masked_fill(smask == 0, float("-inf"))
        idx = choice.topk(self.k, dim=-1, sorted=False)[1]
        w = scores.gather(1, idx)
        if self.norm_topk:
            w = w / (w.sum(-1, keepdim=True) + 1e-20)
        return idx, w * self.scaling

    def forward(self, x):
        shape = x.shape
        xf = x.reshape(-1, shape[-1])
        idx, w = self.route(xf)
        if self.training:
            self.last_load = torch.bincount(idx.flatten(), minlength=self.E)
        comb = torch.zeros(xf.shape[0], self.E, device=x.device, dtype=w.dtype).scatter_(1, idx, w)
        E, I = self.E, self.I
        g = F.linear(xf, self.w_gate.reshape(E * I, -1))
        u = F.linear(xf, self.w_up.reshape(E * I, -1))
        a = (F.silu(g) * u).view(-1, E, I) * comb.to(g.dtype).unsqueeze(-1)
        # w_down [E, H, I] -> [H, E*I] so that one matmul sums over experts.
        out = F.linear(a.reshape(-1, E * I), self.w_down.permute(1, 0, 2).reshape(shape[-1], E * I))
        return (out + self.shared_experts(xf)).view(shape)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, moe):
        super().__init__()
        H = cfg["hidden_size"]
        self.input_layernorm = RMSNorm(H, cfg["rms_norm_eps"])
        self.self_attn = MLA(cfg)
        self.post_attention_layernorm = RMSNorm(H, cfg["rms_norm_eps"])
        self.mlp = MoE(cfg) if moe else MLP(H, cfg["intermediate_size"])

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class MTPModule(nn.Module):
    """DeepSeek-V3 MTP: x_i = eh_proj([enorm(embed(t[i+1])) ; hnorm(h_i)]), one decoder layer (causal
    over the MTP layer's own positions, same position ids as the main model), shared_head.norm, then the
    output head (shared with the main model while training; saved as a copy)."""

    def __init__(self, cfg):
        super().__init__()
        H = cfg["hidden_size"]
        self.enorm = RMSNorm(H, cfg["rms_norm_eps"])
        self.hnorm = RMSNorm(H, cfg["rms_norm_eps"])
        self.eh_proj = nn.Linear(2 * H, H, bias=False)
        self.layer = DecoderLayer(cfg, moe=cfg["num_hidden_layers"] >= cfg["first_k_dense_replace"])
        self.shared_head_norm = RMSNorm(H, cfg["rms_norm_eps"])

    def forward(self, h, emb_next, cos, sin):
        x = self.eh_proj(torch.cat([self.enorm(emb_next), self.hnorm(h)], dim=-1))
        return self.shared_head_norm(self.layer(x, cos, sin))


class DeepSeekV3(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        H, V, L = cfg["hidden_size"], cfg["vocab_size"], cfg["num_hidden_layers"]
        self.embed_tokens = nn.Embedding(V, H)
        self.layers = nn.ModuleList([DecoderLayer(cfg, moe=i >= cfg["first_k_dense_replace"]) for i in range(L)])
        self.norm = RMSNorm(H, cfg["rms_norm_eps"])
        self.lm_head = nn.Linear(H, V, bias=False)
        self.mtp = MTPModule(cfg) if cfg.get("num_nextn_predict_layers", 0) > 0 else None

    def init_weights(self, std=0.02):
        n_res = 2 * (len(self.layers) + 1)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight") or ".enorm." in name or ".hnorm." in name:
                nn.init.ones_(p)
            elif name.endswith(("o_proj.weight", "down_proj.weight", "w_down")):
                nn.init.normal_(p, std=std / math.sqrt(n_res))
            else:
                nn.init.normal_(p, std=std)

    def moe_layers(self):
        return [m for m in self.modules() if isinstance(m, MoE)]

    def hidden(self, ids):
        """Final hidden states after model.norm, [B, T, H]."""
        T = ids.shape[1]
        cos, sin = rope_cos_sin(self.cfg, torch.arange(T, device=ids.device), ids.device)
        x = self.embed_tokens(ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.norm(x)

    def mtp_hidden(self, h, ids):
        """MTP output (after shared_head.norm) at positions 0..T-2: row i uses h[i] and ids[i+1]."""
        T = ids.shape[1] - 1
        cos, sin = rope_cos_sin(self.cfg, torch.arange(T, device=ids.device), ids.device)
        return self.mtp(h[:, :-1], self.embed_tokens(ids[:, 1:]), cos, sin)

    def forward(self, ids):
        h = self.hidden(ids)
        logits = self.lm_head(h)
        mtp_logits = self.lm_head(self.mtp_hidden(h, ids)) if self.mtp is not None else None
        return logits, mtp_logits


# ------------------------------------------------------------------ checkpoint layout conversion

def _layer_items(prefix, layer):
    out = {}
    for k, v in layer.state_dict().items():
        if k.startswith("mlp.") and isinstance(layer.mlp, MoE):
            continue
        out[prefix + k] = v
    if isinstance(layer.mlp, MoE):
        m = layer.mlp
        out[prefix + "mlp.gate.weight"] = m.gate_weight.data
        out[prefix + "mlp.gate.e_score_correction_bias"] = m.e_score_correction_bias.data
        for e in range(m.E):
            out[prefix + f"mlp.experts.{e}.gate_proj.weight"] = m.w_gate.data[e]
            out[prefix + f"mlp.experts.{e}.up_proj.weight"] = m.w_up.data[e]
            out[prefix + f"mlp.experts.{e}.down_proj.weight"] = m.w_down.data[e]
        for k, v in m.shared_experts.state_dict().items():
            out[prefix + "mlp.shared_experts." + k] = v
    return out


def export_state_dict(model, dtype=torch.bfloat16):
    """HF DeepSeek-V3 tensor names; weights in `dtype`, router correction bias in float32."""
    sd = {"model.embed_tokens.weight": model.embed_tokens.weight.data,
          "model.norm.weight": model.norm.weight.data,
          "lm_head.weight": model.lm_head.weight.data}
    for i, layer in enumerate(model.layers):
        sd.update(_layer_items(f"model.layers.{i}.", layer))
    if model.mtp is not None:
        n = len(model.layers)
        p = f"model.layers.{n}."
        sd.update(_layer_items(p, model.mtp.layer))
        sd[p + "enorm.weight"] = model.mtp.enorm.weight.data
        sd[p + "hnorm.weight"] = model.mtp.hnorm.weight.data
        sd[p + "eh_proj.weight"] = model.mtp.eh_proj.weight.data
        sd[p + "shared_head.norm.weight"] = model.mtp.shared_head_norm.weight.data
        # Copies, as in DeepSeek-V3 checkpoints (shared with the main model during training).
        sd[p + "shared_head.head.weight"] = model.lm_head.weight.data
        sd[p + "embed_tokens.weight"] = model.embed_tokens.weight.data
    out = {}
    for k, v in sd.items():
        v = v.detach().cpu()
        out[k] = v.float().contiguous() if k.endswith("e_score_correction_bias") else v.to(dtype).contiguous()
    return out


def load_hf(path, dtype=torch.float32, device="cpu"):
    """Builds DeepSeekV3 from a HF folder (config.json + model.safetensors). MTP embed/head copies are
    checked to equal the main ones (this model shares them)."""
    from safetensors.torch import load_file
    cfg = json.load(open(os.path.join(path, "config.json")))
    sd = load_file(os.path.join(path, "model.safetensors"))
    model = DeepSeekV3(cfg)
    n = cfg["num_hidden_layers"]

    def load_layer(prefix, layer):
        own = {}
        for k in layer.state_dict():
            if k.startswith("mlp.") and isinstance(layer.mlp, MoE):
                continue
            own[k] = sd[prefix + k]
        if isinstance(layer.mlp, MoE):
            m = layer.mlp
            own["mlp.gate_weight"] = sd[prefix + "mlp.gate.weight"]
            own["mlp.e_score_correction_bias"] = sd[prefix + "mlp.gate.e_score_correction_bias"]
            own["mlp.w_gate"] = torch.stack([sd[prefix + f"mlp.experts.{e}.gate_proj.weight"] for e in range(m.E)])
            own["mlp.w_up"] = torch.stack([sd[prefix + f"mlp.experts.{e}.up_proj.weight"] for e in range(m.E)])
            own["mlp.w_down"] = torch.stack([sd[prefix + f"mlp.experts.{e}.down_proj.weight"] for e in range(m.E)])
            for k in m.shared_experts.state_dict():
                own["mlp.shared_experts." + k] = sd[prefix + "mlp.shared_experts." + k]
        layer.load_state_dict({k: v.float() for k, v in own.items()})

    model.embed_tokens.weight.data.copy_(sd["model.embed_tokens.weight"].float())
    model.norm.weight.data.copy_(sd["model.norm.weight"].float())
    model.lm_head.weight.data.copy_(sd["lm_head.weight"].float())
    for i, layer in enumerate(model.layers):
        load_layer(f"model.layers.{i}.", layer)
    if model.mtp is not None:
        p = f"model.layers.{n}."
        load_layer(p, model.mtp.layer)
        model.mtp.enorm.weight.data.copy_(sd[p + "enorm.weight"].float())
        model.mtp.hnorm.weight.data.copy_(sd[p + "hnorm.weight"].float())
        model.mtp.eh_proj.weight.data.copy_(sd[p + "eh_proj.weight"].float())
        model.mtp.shared_head_norm.weight.data.copy_(sd[p + "shared_head.norm.weight"].float())
        assert torch.equal(sd[p + "shared_head.head.weight"], sd["lm_head.weight"])
        assert torch.equal(sd[p + "embed_tokens.weight"], sd["model.embed_tokens.weight"])
    return model.to(device=device, dtype=dtype).eval()


def save_hf(model, path, extra_config=None):
    from safetensors.torch import save_file
    os.makedirs(path, exist_ok=True)
    save_file(export_state_dict(model), os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    cfg = dict(model.cfg)
    if extra_config:
        cfg.update(extra_config)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")


def default_config(vocab_size=8192):
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": vocab_size,
        "hidden_size": 224,
        "intermediate_size": 576,
        "moe_intermediate_size": 64,
        "num_hidden_layers": 4,
        "num_nextn_predict_layers": 1,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "n_shared_experts": 1,
        "n_routed_experts": 8,
        "ep_size": 1,
        "routed_scaling_factor": 2.5,
        "kv_lora_rank": 64,
        "q_lora_rank": 128,
        "qk_rope_head_dim": 16,
        "v_head_dim": 32,
        "qk_nope_head_dim": 32,
        "topk_method": "noaux_tc",
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 2,
        "moe_layer_freq": 1,
        "first_k_dense_replace": 1,
        "norm_topk_prob": True,
        "scoring_func": "sigmoid",
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "initializer_range": 0.02,
        "rms_norm_eps": 1e-06,
        "use_cache": True,
        "bos_token_id": 0,
        "eos_token_id": 1,
        "pad_token_id": 2,
        "tie_word_embeddings": False,
        "rope_theta": 10000,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "torch_dtype": "bfloat16",
    }
