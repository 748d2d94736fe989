"""Points of llama.cpp's `llama-batched-bench` for the sweep's plots (bench/sweep.py --llama-batched-bench FILE).

llama-batched-bench prints a Markdown table, one row per (PP, TG, B):
  |    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
PP prompt tokens per sequence, TG generated tokens per sequence, B parallel sequences, T_PP the time to
prefill all B prompts (S_PP = B*PP / T_PP), T_TG the time to generate (S_TG = B*TG / T_TG). As sweep
points: decode (concurrency B, aggregate S_TG, per user S_TG / B) from rows with TG > 0, prefill
(prompt length PP, batch B, prefill tok/s S_PP, TTFT = T_PP: every sequence's first token comes after
the whole batch's prefill) from rows with PP > 0. Its JSONL output (--output-format jsonl: keys pp,
tg, pl, t_pp, speed_pp, t_tg, speed_tg) is read too. Other lines (the log before the table) are skipped.
"""
import json


def parse(text):
    """(decode_rows, prefill_rows) in bench/sweep_measure.py's row shapes."""
    rows = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                j = json.loads(line)
                rows.append((int(j["pp"]), int(j["tg"]), int(j["pl"]), float(j["t_pp"]), float(j["speed_pp"]),
                             float(j["t_tg"]), float(j["speed_tg"])))
            except (ValueError, KeyError):
                pass
            continue
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) < 8:
            continue
        try:
            pp, tg, b = int(cells[0]), int(cells[1]), int(cells[2])
            t_pp, s_pp, t_tg, s_tg = float(cells[4]), float(cells[5]), float(cells[6]), float(cells[7])
        except ValueError:  # the header and the |---| rule
            continue
        rows.append((pp, tg, b, t_pp, s_pp, t_tg, s_tg))
    decode, prefill, seen = [], [], set()
    for pp, tg, b, t_pp, s_pp, t_tg, s_tg in rows:
        if b <= 0:
            continue
        if tg > 0 and t_tg > 0:
            decode.append({"concurrency": b, "prompt_len": pp, "output_len": tg, "requests": b, "output_tokens": b * tg,
                           "wall_s": t_tg, "output_tok_s": s_tg, "per_user_tok_s": round(s_tg / b, 2),
                           "mean_tpot_ms": round(1e3 * t_tg / tg, 3), "mean_ttft_ms": round(1e3 * t_pp, 2),
                           "p50_ttft_ms": round(1e3 * t_pp, 2)})
        if pp > 0 and t_pp > 0 and (pp, b) not in seen:  # one prefill point per (PP, B) whatever TG
            seen.add((pp, b))
            prefill.append({"prompt_len": pp, "batch": b, "prompt_tokens": pp * b, "wall_s": t_pp, "prefill_tok_s": s_pp,
                            "mean_ttft_ms": round(1e3 * t_pp, 2), "p50_ttft_ms": round(1e3 * t_pp, 2)})
    return decode, prefill
