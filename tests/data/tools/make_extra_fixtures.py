"""More fixture checkpoints in other shapes than the shared four, made with the same generator
(make_fixtures.py, copied from the project's shared tools): odd sizes, more layers, long prompts,
every routing method, YaRN with mscale != mscale_all_dim, half-split RoPE, the transformers>=5
config dialect, FP8 with blocks that are not multiples of 8.

usage (where torch + transformers live, e.g. the GPU device): python3 make_extra_fixtures.py OUTDIR
"""
import json, os, sys

OUT = sys.argv[1]
sys.argv = [sys.argv[0], OUT, "public"]
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402

CASES = {
    # odd sizes everywhere, 5 layers (2 dense), 12 experts in 3 groups, yarn with distinct mscales
    "dsv3-odd": dict(cfg=mf.base_v3(
        vocab_size=777, hidden_size=72, intermediate_size=136, moe_intermediate_size=40, num_hidden_layers=5,
        num_attention_heads=3, num_key_value_heads=3, n_routed_experts=12, n_group=3, topk_group=2,
        num_experts_per_tok=3, first_k_dense_replace=2, q_lora_rank=40, kv_lora_rank=24, qk_nope_head_dim=24,
        qk_rope_head_dim=8, v_head_dim=20, routed_scaling_factor=1.7,
        rope_scaling={"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32, "beta_fast": 32,
                      "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 0.8}),
        prompts=[1, 7, 150], fp8=None),
    # V2 with YaRN (as real V2 checkpoints), group-limited greedy, no q_lora, tied embeddings
    "dsv2-yarn-tied": dict(cfg=mf.base_v2(
        q_lora_rank=None, topk_method="group_limited_greedy", n_group=4, topk_group=3, num_experts_per_tok=3,
        routed_scaling_factor=2.0, tie_word_embeddings=True, num_hidden_layers=4, first_k_dense_replace=1,
        rope_scaling={"type": "yarn", "factor": 16.0, "original_max_position_embeddings": 128, "beta_fast": 32,
                      "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}),
        prompts=[2, 9, 130], fp8=None),
    # V3 with half-split rotary pairs (rope_interleave false), plain rope, moe_layer_freq 1, 3 dense
    "dsv3-halfsplit": dict(cfg=mf.base_v3(rope_interleave=False, rope_scaling=None, num_hidden_layers=4,
                                          first_k_dense_replace=3, n_shared_experts=2),
                           prompts=[1, 5, 70], fp8=None),
    # FP8 with 16x12 blocks (column blocks not a multiple of 8: the scalar dequantization path)
    "dsv3-fp8-16x12": dict(cfg=mf.base_v3(), prompts=[1, 6, 40], fp8=[16, 12]),
}

if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    for i, (name, spec) in enumerate(CASES.items()):
        try:
            mf.make_case(name, spec, 7000 + 31 * i)
        except BaseException as e:  # noqa
            import traceback
            mf.log(name, "FAILED:", traceback.format_exc()[-1500:])
    # the transformers>=5 dialect: the same checkpoint as dsv3-odd with rope_parameters in config.json
    try:
        src = os.path.join(OUT, "dsv3-odd", "config.json")
        cfg = json.load(open(src))
        rs = cfg.pop("rope_scaling")
        rp = {"rope_type": rs["type"], "rope_theta": cfg.pop("rope_theta")}
        rp.update({k: v for k, v in rs.items() if k != "type"})
        cfg["rope_parameters"] = rp
        d = os.path.join(OUT, "dsv3-odd-v5config")
        os.makedirs(d, exist_ok=True)
        json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
        from transformers import AutoConfig
        hc = AutoConfig.from_pretrained(d)
        mf.log("dsv3-odd-v5config", "transformers reads rope_parameters:", getattr(hc, "rope_parameters", None))
    except BaseException as e:  # noqa
        mf.log("v5config FAILED", repr(e))
    with open(os.path.join(OUT, "log_extra.txt"), "w") as f:
        f.write("\n".join(mf.LOG) + "\n")
