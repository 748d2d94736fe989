"""A DeepSeek-V4 checkpoint in the native formats V4-Flash ships, made from tests/data/models/dsv4-tiny.

usage: python3 make_v4_native.py SRC_DIR OUT_DIR   (numpy only; writes OUT_DIR/{config.json, model.safetensors,
       dequant.safetensors}; then golden_v4_native.py, where torch and transformers live, writes golden.safetensors)

As DeepSeek's own V4 checkpoints store them (DeepSeek's tensor names: layers.L..., embed.weight, norm.weight,
hc_head_fn, head.weight; scales named `<stem>.scale` beside `<stem>.weight`):
- routed experts (ffn.experts.E.w1/w2/w3) in MXFP4: e2m1 values packed two per I8 byte [rows, cols / 2], the
  first value of a pair in the low nibble, and one E8M0 scale per 32 values (F8_E8M0 [rows, cols / 32]);
  config.json says "expert_dtype": "fp4";
- the attention's projections and the shared expert in block FP8 (F8_E4M3, 128 x 128 blocks, UE8M0 scales:
  quantization_config {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128,
  128]}); at these tiny sizes every block is a partial one;
- everything else (embeddings, head, router, norms, mHC, compressors, indexer, sinks) as in the source (f32).
dequant.safetensors holds the dequantized values under transformers' names: the reference forward runs on
exactly the numbers the quantized checkpoint stands for. Rounding: FP8 by round-to-nearest-even of value /
scale with the block scale 2^ceil(log2(amax / 448)); MXFP4 to the nearest e2m1 value (ties to the even
code) with the scale 2^(floor(log2(amax)) - 2) (OCP MX's rule), so every value fits.
"""
import json, os, struct, sys
import numpy as np

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float64)


def read_st(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        body = f.read()
    out = {}
    for k, v in head.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        if v["dtype"] == "I64":  # the hash-routing table, kept as it is
            out[k] = np.frombuffer(body[a:b], dtype=np.int64).reshape(v["shape"])
            continue
        assert v["dtype"] == "F32", (k, v["dtype"])
        out[k] = np.frombuffer(body[a:b], dtype=np.float32).reshape(v["shape"]).astype(np.float64)
    return out


def write_st(path, tensors):
    """tensors: name -> (dtype string, numpy array of the stored bytes' type, shape)"""
    head, blobs, off = {}, [], 0
    for k in sorted(tensors):
        dt, arr, shape = tensors[k]
        b = np.ascontiguousarray(arr).tobytes()
        head[k] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(head, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def e4m3_values():
    """every finite e4m3fn value and its code"""
    vals, codes = [], []
    for c in range(256):
        s, e, m = c >> 7, (c >> 3) & 15, c & 7
        if e == 15 and m == 7:
            continue  # NaN
        v = (m / 8.0) * 2.0 ** -6 if e == 0 else (1 + m / 8.0) * 2.0 ** (e - 7)
        vals.append(-v if s else v)
        codes.append(c)
    return np.array(vals), np.array(codes, dtype=np.uint8)


E4M3_VALS, E4M3_CODES = e4m3_values()
POS = E4M3_VALS >= 0
POS_VALS, POS_CODES = E4M3_VALS[POS], E4M3_CODES[POS]
order = np.argsort(POS_VALS)
POS_VALS, POS_CODES = POS_VALS[order], POS_CODES[order]
# +0 and -0 both appear; keep the +0 code (0x00) for zero
keep = np.concatenate([[True], POS_VALS[1:] != POS_VALS[:-1]])
POS_VALS, POS_CODES = POS_VALS[keep], POS_CODES[keep]


def nearest_even(x, grid, codes):
    """index of the nearest grid value to |x| (ties to the even code), sign applied by the caller"""
    a = np.abs(x)
    i = np.clip(np.searchsorted(grid, a), 1, len(grid) - 1)
    lo, hi = grid[i - 1], grid[i]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (codes[i] % 2 == 0))
    return np.where(pick_hi, i, i - 1)


def quant_fp8(w, br=128, bc=128):
    R, C = w.shape
    sr, sc = -(-R // br), -(-C // bc)
    codes = np.zeros((R, C), dtype=np.uint8)
    scale_e = np.zeros((sr, sc), dtype=np.uint8)
    deq = np.zeros_like(w)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * br:(i + 1) * br, j * bc:(j + 1) * bc]
            amax = np.abs(blk).max()
            e = int(np.ceil(np.log2(amax / 448.0))) if amax > 0 else -127
            scale = 2.0 ** e
            k = nearest_even(blk / scale, POS_VALS, POS_CODES)
            c = POS_CODES[k] | np.where(blk < 0, 0x80, 0).astype(np.uint8)
            codes[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = c
            deq[i * br:(i + 1) * br, j * bc:(j + 1) * bc] = np.sign(blk) * POS_VALS[k] * scale
            scale_e[i, j] = e + 127
    return codes, scale_e, deq


def quant_mxfp4(w):
    R, C = w.shape
    assert C % 32 == 0
    g = w.reshape(R, C // 32, 32)
    amax = np.abs(g).max(axis=2)
    e = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2, -127).astype(np.int64)
    scale = 2.0 ** e
    x = g / scale[:, :, None]
    k = nearest_even(x, E2M1, np.arange(8))
    nib = (k | np.where(x < 0, 8, 0)).astype(np.uint8).reshape(R, C)
    deq = (np.sign(x) * E2M1[k] * scale[:, :, None]).reshape(R, C)
    packed = (nib[:, 0::2] | (nib[:, 1::2] << 4)).astype(np.uint8)
    return packed.view(np.int8), (e + 127).astype(np.uint8), deq


def original_name(n):
    if n == "model.embed_tokens.weight":
        return "embed.weight"
    if n == "model.norm.weight":
        return "norm.weight"
    if n.startswith("model.hc_head."):
        return "hc_head_" + n[len("model.hc_head.hc_"):]
    return n[6:] if n.startswith("model.") else n


FP8_SUFFIXES = ("attn.wq_a.weight", "attn.wq_b.weight", "attn.wkv.weight", "attn.wo_a.weight", "attn.wo_b.weight",
                "ffn.shared_experts.w1.weight", "ffn.shared_experts.w2.weight", "ffn.shared_experts.w3.weight")


def main():
    src, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    w = read_st(os.path.join(src, "model.safetensors"))
    def plain(v):  # a tensor kept as it is: the I64 hash-routing table, or f32
        return ("I64", v, v.shape) if v.dtype == np.int64 else ("F32", v.astype(np.float32), v.shape)

    stored, deq, counts = {}, {}, {"MXFP4": 0, "FP8": 0}
    for k, v in w.items():
        on = original_name(k)
        kind = "MXFP4" if ".ffn.experts." in k else "FP8" if k.endswith(FP8_SUFFIXES) else None
        if kind:
            q, s, d = quant_mxfp4(v) if kind == "MXFP4" else quant_fp8(v)
            stored[on] = ("I8" if kind == "MXFP4" else "F8_E4M3", q, q.shape)
            stored[on[:-len(".weight")] + ".scale"] = ("F8_E8M0", s, s.shape)
            deq[k] = d
            counts[kind] += 1
        else:
            stored[on] = plain(v)
            deq[k] = v
    n_fp4, n_fp8 = counts["MXFP4"], counts["FP8"]
    write_st(os.path.join(out, "model.safetensors"), stored)
    write_st(os.path.join(out, "dequant.safetensors"), {k: plain(v) for k, v in deq.items()})
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg["expert_dtype"] = "fp4"
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "activation_scheme": "dynamic",
                                  "weight_block_size": [128, 128]}
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    err = {k: float(np.linalg.norm(deq[k] - w[k]) / np.linalg.norm(w[k])) for k in deq if deq[k] is not w[k]}
    print(f"{n_fp4} MXFP4 and {n_fp8} FP8 tensors; quantization rel error: MXFP4 max "
          f"{max(v for k, v in err.items() if '.experts.' in k):.3f}, FP8 max "
          f"{max(v for k, v in err.items() if '.experts.' not in k):.4f}")


if __name__ == "__main__":
    main()
