/* A step of the CUDA backend: prepare() lays the batch's inputs (tokens, positions, cache slots,
 * block tables, the attention work list and its splits, sampling rows) out in one pinned block and
 * sizes the buffers; submit() uploads it in one copy and runs the forward eagerly, or captures it into
 * a CUDA graph per bucket the second time the bucket is seen and replays it after that; wait() takes
 * the logits (and the profile marks). */
#include "cuda_backend_impl.cuh"
#include "k_mha_prefill.h"
#include <stdlib.h>
#include <string.h>

/* ---- step preparation ---------------------------------------------------------------------------- */

static int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p *= 2;
  return p;
}

static di_status ensure_inputs(cu_backend *b, size_t n) {
  if (n <= b->in_cap) return DI_OK;
  size_t c = b->in_cap ? b->in_cap : ((size_t)1 << 20);
  while (c < n) c *= 2;
  drop_graphs(b);
  cudaFreeHost(b->in_host);
  b->in_host = NULL;
  dev_free(b, b->in_dev);
  b->in_dev = NULL;
  DI_CU(cudaMallocHost((void **)&b->in_host, c * sizeof(int32_t)));
  DI_TRY(dev_alloc(b, (void **)&b->in_dev, c * sizeof(int32_t)));
  b->in_cap = c;
  return DI_OK;
}

di_status prepare(cu_backend *b, const di_batch *bt) {
  const int T = bt->n_tokens, NH = b->NH;
  /* the pinned input block is rewritten below: the previous step's upload must have run (with token
   * feedback that step may still be queued) */
  if (b->h2d_recorded) DI_CU(cudaEventSynchronize(b->ev_h2d));
  if (T <= 0) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: empty batch");
  if (bt->n_outputs < 0 || bt->n_outputs > T)
    return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: %d outputs for %d tokens", bt->n_outputs, T);
  if (!b->kv) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: submit before kv_alloc");
  b->want_on = bt->output_logits != NULL && bt->n_outputs > 0;
  if (b->want_on) {
    if (bt->n_outputs > b->want_cap) {
      uint8_t *w = (uint8_t *)realloc(b->want_host, (size_t)bt->n_outputs);
      if (w) b->want_host = w;
      int32_t *lo = (int32_t *)realloc(b->lg_out, sizeof(int32_t) * (size_t)bt->n_outputs);
      if (lo) b->lg_out = lo;
      if (!w || !lo) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
      b->want_cap = bt->n_outputs;
    }
    memcpy(b->want_host, bt->output_logits, (size_t)bt->n_outputs);
  }
  const int graph = b->use_graphs && T <= DI_CUDA_GRAPH_MAX_T;
  const int Tp = graph ? pow2_at_least(T) : T;
  const int n_out = bt->n_outputs, n_out_p = graph ? pow2_at_least(n_out > 0 ? n_out : 1) : (n_out > 0 ? n_out : 1);
  if (b->flog) { /* the drafter's feature log (cuda_dspark.cu): every row an output row, in order */
    if (n_out != T) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: the DSpark feature log needs every row of a step "
                                        "as an output row (%d outputs for %d tokens)", n_out, T);
    if (Tp > b->flog_cap) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: a step of %d rows exceeds the DSpark feature log "
                                              "(%d rows)", Tp, b->flog_cap);
    if (b->flog_n + Tp > b->flog_cap) DI_TRY(b->flog_flush(b->flog_ctx));
  }
  /* a DSpark proposal inside the step (cuda_dspark.cu, prop_forward): after the step's own sampling,
   * from the step's logged rows; the log's earlier rows become cache entries first (eagerly, here), so
   * the step's rows are the log's first ones and are consumed by the step itself */
  b->prop_on = 0;
  b->prop_blk = b->prop_bt = b->prop_n = 0;
  if (b->flog && b->prop_forward && bt->propose_row && bt->propose_cap && bt->drafter_tables && bt->sample_rows &&
      b->step_sample_on && n_out > 0 && Tp <= DI_CUDA_PROP_MAX_T)
    for (int q = 0; q < bt->n_seqs && !b->prop_on; q++) b->prop_on = bt->propose_row[q] >= 0;
  if (b->prop_on) {
    if (b->flog_n > 0) DI_TRY(b->flog_flush(b->flog_ctx));
    int max_pos = 0;
    for (int t = 0; t < T; t++)
      if (bt->positions[t] > max_pos) max_pos = bt->positions[t];
    b->prop_n = bt->n_seqs;
    b->prop_blk = graph ? pow2_at_least(bt->n_seqs) : bt->n_seqs;
    b->prop_bt = pow2_at_least(max_pos / DI_DRAFTER_BLOCK_TOKENS + 1);
    DI_TRY(b->prop_prepare(b->prop_ctx, Tp, b->prop_blk));
  }
  int max_blocks = 1;
  for (int t = 0; t < T; t++) {
    int sq = bt->seq_of[t], pos = bt->positions[t];
    if (sq < 0 || sq >= bt->n_seqs) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: token %d: sequence %d of %d", t, sq, bt->n_seqs);
    if (bt->tokens[t] >= b->V || (bt->tokens[t] < 0 && -1 - bt->tokens[t] >= b->fb_n))
      return di_error_set(DI_ERR_INVALID_ARG, bt->tokens[t] < 0 ? "token id %d: no sampled row %d to take it from" :
                          "token id %d out of range [0, %d)", bt->tokens[t], bt->tokens[t] < 0 ? -1 - bt->tokens[t] : b->V);
    if (pos < 0 || pos / DI_KV_BLOCK_SIZE >= bt->seqs[sq].n_blocks)
      return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: token %d: position %d beyond its %d blocks", t, pos, bt->seqs[sq].n_blocks);
    if (pos / DI_KV_BLOCK_SIZE + 1 > max_blocks) max_blocks = pos / DI_KV_BLOCK_SIZE + 1;
  }
  for (int i = 0; i < n_out; i++)
    if (bt->output_rows[i] < 0 || bt->output_rows[i] >= T)
      return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: output row %d out of range", bt->output_rows[i]);
  const int bt_stride = pow2_at_least(max_blocks);
  /* the output head on the wanted rows only (lg_gather): DSpark's verify steps read 1 + drafts rows of
   * each sequence (with its feature log on: the drafter's features come from the capture, and hn is not
   * returned); never with the step's own sampling, which samples every output row */
  int n_lg = n_out;
  if (b->want_on && b->flog && !bt->sample_rows) {
    n_lg = 0;
    for (int i = 0; i < n_out; i++)
      if (b->want_host[i]) b->lg_out[n_lg++] = i;
  }
  const int lg_gather = n_lg < n_out, n_lg_p = !lg_gather ? n_out_p : graph ? pow2_at_least(n_lg > 0 ? n_lg : 1) : (n_lg > 0 ? n_lg : 1);

  /* attention chunks: runs of consecutive tokens of one sequence, cut into rows of bm; padding
   * tokens form their own run (the spare sequence T_p, position 0) */
  const int rows_total = Tp * NH;
  int n_runs = 0;
  for (int t = 0; t < T; t++)
    if (t == 0 || bt->seq_of[t] != bt->seq_of[t - 1]) n_runs++;
  if (Tp > T) n_runs++;
  /* the fixed-split attention (k_mla_fixed.cu; fixed = its split in keys): items of 32 rows where runs
   * are long, else 16 */
  const int fixed = b->attn_fixed;
  /* ... on its tensor-core kernel (k_mla_fixed_tc.cu, the same bits; DEEPINFER_CUDA_MLA_FIXED_TC): items
   * of 64 rows where runs average 64 rows (prefill chunks, verify blocks), or at every step (=2) */
  /* (it reads bf16 rows only: an FP8 cache keeps every row on the CUDA-core kernel) */
  const int fixed_tc = fixed && !b->kv_fp8 && (b->fixed_tc == 2 || (b->fixed_tc == 1 && rows_total / n_runs >= 64));
  const int bm = fixed_tc ? 64
                 : fixed  ? (rows_total / n_runs >= 32 ? 32 : 16)
                          : rows_total / n_runs >= 64 && !b->invariant ? 64 : 16;
  /* count chunks */
  int n_chunks = 0;
  for (int t = 0; t < Tp;) {
    int u = t + 1;
    while (u < Tp && (t >= T ? 1 : (u < T && bt->seq_of[u] == bt->seq_of[t]))) u++;
    n_chunks += (((u - t) * NH) + bm - 1) / bm;
    t = u;
  }
  const int target = 2 * b->sms;
  /* batch-invariant mode: no key splits (a split's boundaries would follow the batch's longest row of
   * the item; one pass over keys 0.. in fixed tiles gives every row the same sums, the tiles past its
   * own position being exact no-ops of the online softmax) */
  int S_max = n_chunks >= target || b->invariant ? 1 : (target + n_chunks - 1) / n_chunks;
  const int KS = b->split_keys;
  int tiles_cap = (bt_stride * DI_KV_BLOCK_SIZE + KS - 1) / KS;
  if (S_max > tiles_cap) S_max = tiles_cap;
  /* decode of few sequences (<= 2 x SMs / cluster size of them): the cluster form (splits merged inside
   * a cluster of CTAs, k_mla_decode.cu), one cluster per row group up to CL_TILES key tiles of 64 per
   * CTA (contexts <= 2048 keys with clusters of 16, 1024 with 8), so short contexts need no combine
   * kernel in the graph; longer ones take more clusters, merged by mla_combine */
  const int CL = b->attn_cluster, CL_TILES = 2;
  /* batch-invariant mode: every step in this form, one cluster per row group, key tiles dealt to its
   * CTAs round-robin (the strided form of di_cuk_mla_attn_cluster) */
  const int cluster = !fixed && CL > 0 && bm == 16 && (n_chunks * CL <= target || b->invariant);
  int C_max = 1;
  if (cluster && !b->invariant) {
    const int ktiles_cap = (bt_stride * DI_KV_BLOCK_SIZE + DI_CUK_DECODE_KTILE - 1) / DI_CUK_DECODE_KTILE;
    C_max = (ktiles_cap + CL * CL_TILES - 1) / (CL * CL_TILES);
    const int c_fit = target / (CL * n_chunks);
    if (C_max > c_fit) C_max = c_fit > 1 ? c_fit : 1;
  }
  if (cluster) S_max = C_max; /* partial slots: one per cluster */
  /* fixed splits: a row group's splits in CTAs of their own when the step has few row groups (decode,
   * verify), else all in one CTA; either gives a row the same bits */
  const int fixed_sep = fixed && n_chunks * 4 <= target;
  if (fixed) S_max = fixed_sep ? (bt_stride * DI_KV_BLOCK_SIZE - 1) / fixed + 1 : 1;
  const int max_items = cluster ? n_chunks * C_max * CL : n_chunks * S_max, max_citems = S_max > 1 ? n_chunks : 0;
  DI_TRY(ensure_acts(b, Tp, n_out_p, fixed && !fixed_sep ? 1 : max_items)); /* (partial slots) */
  if (fixed_tc && !b->tc_slots) DI_TRY(dev_alloc(b, (void **)&b->tc_slots, di_cuk_mla_fixed_tc_slot_bytes()));

  /* the MHA form of prefill attention (DEEPINFER_CUDA_PREFILL_MHA; the default mode, eager steps of at
   * least prefill_mha tokens): each run's tokens in items of 64, its keys 0 .. the run's largest
   * position gathered once from the cache and up-projected (cuda_deepseek2.cu) */
  int n_mi = 0;
  int64_t n_mk = 0;
  int use_mha = b->prefill_mha > 0 && !b->invariant && !graph && T >= b->prefill_mha &&
                di_cuk_mha_prefill_ok(b->dn, b->dr, b->dv);
  for (int t = 0; use_mha && t < T;) {
    int u = t + 1, maxpos = bt->positions[t];
    for (; u < T && bt->seq_of[u] == bt->seq_of[t]; u++)
      if (bt->positions[u] > maxpos) maxpos = bt->positions[u];
    /* every run a prefill chunk (>= 64 tokens, or at most 16 keys a token): a decode row's run would
     * up-project its whole context for one query, so such steps keep the absorbed form */
    if (u - t < DI_CUK_MHA_ROWS && (int64_t)(maxpos + 1) > 16 * (int64_t)(u - t)) use_mha = 0;
    n_mi += (u - t + DI_CUK_MHA_ROWS - 1) / DI_CUK_MHA_ROWS;
    n_mk += maxpos + 1;
    t = u;
  }
  const int64_t mha_row_bytes = 2 * ((int64_t)DI_CUK_MLA_D + (int64_t)NH * (b->dn + b->dv));
  if (use_mha && n_mk * mha_row_bytes > ((int64_t)2 << 30)) use_mha = 0; /* more than 2 GiB of keys: absorbed */
  if (use_mha && n_mk > b->mha_cap) { /* grown lazily (after the KV pool took its share): if the memory is
                                         not there, this step keeps the absorbed form */
    dev_free(b, b->mha_g);
    dev_free(b, b->mha_kv);
    b->mha_g = b->mha_kv = NULL;
    b->mha_cap = 0;
    const int64_t c = n_mk + n_mk / 2;
    if (dev_alloc(b, &b->mha_g, 2 * (size_t)c * DI_CUK_MLA_D) != DI_OK ||
        dev_alloc(b, &b->mha_kv, 2 * (size_t)c * NH * (b->dn + b->dv)) != DI_OK) {
      dev_free(b, b->mha_g);
      b->mha_g = NULL;
      (void)cudaGetLastError(); /* the failed cudaMalloc must not surface at the next launch check */
      di_error_clear();
      use_mha = 0;
    } else {
      b->mha_cap = c;
    }
  }

  /* layout of the input block (int32 units); the last block-table row is the padding tokens' */
  const int n_seq_rows = (bt->n_seqs > Tp ? bt->n_seqs : Tp) + 1, spare_seq = n_seq_rows - 1;
  size_t o = 0;
  const size_t o_tok = o; o += Tp;
  const size_t o_pos = o; o += Tp;
  const size_t o_slot = o; o += Tp;
  const size_t o_out = o; o += n_out_p;
  const size_t o_lg = o; o += n_out_p; /* lg_gather: the wanted rows' token rows (n_lg_p <= n_out_p) */
  const size_t o_bt = o; o += (size_t)n_seq_rows * bt_stride;
  const size_t o_n = o; o += 4;
  o = (o + 3) & ~(size_t)3;
  const size_t o_items = o; o += (size_t)max_items * (sizeof(di_cuk_attn_item) / sizeof(int32_t));
  const size_t o_citems = o; o += (size_t)(max_citems > 0 ? max_citems : 1) * 4;
  const size_t o_mitems = o; o += use_mha ? (size_t)n_mi * (sizeof(di_cuk_mha_item) / sizeof(int32_t)) : 0;
  const size_t o_mslots = o; o += use_mha ? (size_t)n_mk : 0;
  o = (o + 1) & ~(size_t)1; /* 8-byte fields */
  const size_t o_srows = o; o += (size_t)n_out_p * (sizeof(di_cuk_sample_row) / sizeof(int32_t));
  const size_t o_prop = o; o += b->prop_on ? (size_t)b->prop_blk * (3 + (size_t)b->prop_bt) + (size_t)Tp : 0;
  DI_TRY(ensure_inputs(b, o));
  int32_t *hi = b->in_host;
  const int32_t spare = (int32_t)b->n_blocks;
  for (int t = 0; t < Tp; t++) {
    if (t < T) {
      const di_batch_seq *sq = &bt->seqs[bt->seq_of[t]];
      int pos = bt->positions[t];
      hi[o_tok + t] = bt->tokens[t];
      hi[o_pos + t] = pos;
      hi[o_slot + t] = sq->block_table[pos / DI_KV_BLOCK_SIZE] * DI_KV_BLOCK_SIZE + pos % DI_KV_BLOCK_SIZE;
    } else {
      hi[o_tok + t] = 0;
      hi[o_pos + t] = 0;
      hi[o_slot + t] = spare * DI_KV_BLOCK_SIZE;
    }
  }
  for (int i = 0; i < n_out_p; i++) hi[o_out + i] = i < n_out ? bt->output_rows[i] : 0;
  for (int k = 0; lg_gather && k < n_lg_p; k++) hi[o_lg + k] = k < n_lg ? bt->output_rows[b->lg_out[k]] : 0;
  b->step_sample = bt->sample_rows && b->step_sample_on && n_out > 0;
  if (b->step_sample) {
    di_cuk_sample_row *sr = (di_cuk_sample_row *)(hi + o_srows);
    for (int i = 0; i < n_out_p; i++) {
      const di_sample_row *r = &bt->sample_rows[i < n_out ? i : 0];
      sr[i] = cuk_row(r);
      if (i >= n_out) sr[i].temperature = 0.f; /* padding rows: greedy, ignored */
    }
    memcpy(b->sub_rows, bt->sample_rows, sizeof(di_sample_row) * (size_t)n_out);
  }
  for (int sidx = 0; sidx < n_seq_rows; sidx++) {
    int32_t *row = hi + o_bt + (size_t)sidx * bt_stride;
    int nb = 0;
    if (sidx < bt->n_seqs) {
      nb = bt->seqs[sidx].n_blocks < bt_stride ? bt->seqs[sidx].n_blocks : bt_stride;
      for (int j = 0; j < nb; j++) {
        int32_t id = bt->seqs[sidx].block_table[j];
        if (id < 0 || id >= b->n_blocks)
          return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: block id %d out of range [0, %lld)", id, (long long)b->n_blocks);
        row[j] = id;
      }
    }
    for (int j = nb; j < bt_stride; j++) row[j] = spare;
  }
  /* items */
  di_cuk_attn_item *items = (di_cuk_attn_item *)(hi + o_items);
  di_cuk_combine_item *citems = (di_cuk_combine_item *)(hi + o_citems);
  int ni = 0, nci = 0, part = 0;
  for (int t = 0; t < Tp;) {
    int u = t + 1;
    while (u < Tp && (t >= T ? 1 : (u < T && bt->seq_of[u] == bt->seq_of[t]))) u++;
    const int seq = t >= T ? spare_seq : bt->seq_of[t];
    int kfresh = t < T ? bt->positions[t] : 0; /* the sequence's smallest position in this step */
    for (int tt = t + 1; tt < u && tt < T; tt++)
      if (bt->positions[tt] < kfresh) kfresh = bt->positions[tt];
    for (int r0 = t * NH; r0 < u * NH; r0 += bm) {
      int r1 = r0 + bm < u * NH ? r0 + bm : u * NH;
      int maxpos = 0;
      for (int tt = r0 / NH; tt <= (r1 - 1) / NH; tt++) {
        int p = tt < T ? bt->positions[tt] : 0;
        if (p > maxpos) maxpos = p;
      }
      if (fixed) {
        ni += di_cuk_attn_fixed_items(r0, r1, seq, maxpos, kfresh, fixed, fixed_sep, &part, items + ni, citems, &nci);
        continue;
      }
      if (cluster) {
        const int nkt = (maxpos + DI_CUK_DECODE_KTILE) / DI_CUK_DECODE_KTILE;
        int nc = (nkt + CL * CL_TILES - 1) / (CL * CL_TILES);
        if (nc > C_max) nc = C_max;
        ni += di_cuk_attn_cluster_items(r0, r1, seq, maxpos + 1, kfresh, CL, nc, b->invariant, &part, items + ni, citems,
                                        &nci);
        continue;
      }
      const int nkt = (maxpos + KS) / KS;
      /* at least attn_min_split x split_keys keys per split (DEEPINFER_CUDA_ATTN_MIN_SPLIT, default
       * 1; DEEPINFER_CUDA_ATTN_SPLIT_KEYS, default DI_CUK_ATTN_KTILE = 32): a split's work is a
       * latency-bound chain of key tiles, so at decode more, shorter splits finish sooner (measured:
       * 2 x 64 keys per split was 5% slower per token than 1 x 64 at a 600-token context) */
      const int s_len = (nkt + b->attn_min_split - 1) / b->attn_min_split;
      int S = S_max < s_len ? S_max : s_len;
      const int per = (nkt + S - 1) / S;
      S = (nkt + per - 1) / per;
      if (S == 1) {
        items[ni++] = (di_cuk_attn_item){r0, r1, seq, 0, maxpos + 1, -1, kfresh};
      } else {
        citems[nci++] = (di_cuk_combine_item){r0, r1, part, S};
        for (int sp = 0; sp < S; sp++) {
          int k0 = sp * per * KS, k1 = (sp + 1) * per * KS;
          if (k1 > maxpos + 1) k1 = maxpos + 1;
          items[ni++] = (di_cuk_attn_item){r0, r1, seq, k0, k1, part++, kfresh};
        }
      }
    }
    t = u;
  }
  DI_ASSERT(ni <= max_items && nci <= (max_citems > 0 ? max_citems : 0) + 0);
  if (use_mha) { /* MHA items and the keys' cache slots, run by run */
    di_cuk_mha_item *mi = (di_cuk_mha_item *)(hi + o_mitems);
    int32_t *ms = hi + o_mslots;
    int nmi = 0;
    int64_t kbase = 0;
    for (int t = 0; t < T;) {
      int u = t + 1, maxpos = bt->positions[t];
      for (; u < T && bt->seq_of[u] == bt->seq_of[t]; u++)
        if (bt->positions[u] > maxpos) maxpos = bt->positions[u];
      const int32_t *tab = bt->seqs[bt->seq_of[t]].block_table;
      for (int k = 0; k <= maxpos; k++)
        ms[kbase + k] = tab[k / DI_KV_BLOCK_SIZE] * DI_KV_BLOCK_SIZE + k % DI_KV_BLOCK_SIZE;
      for (int t0 = t; t0 < u; t0 += DI_CUK_MHA_ROWS)
        mi[nmi++] = (di_cuk_mha_item){t0, t0 + DI_CUK_MHA_ROWS < u ? t0 + DI_CUK_MHA_ROWS : u, (int32_t)kbase, maxpos + 1};
      kbase += maxpos + 1;
      t = u;
    }
    DI_ASSERT(nmi == n_mi && kbase == n_mk);
  }
  hi[o_n] = ni;
  hi[o_n + 1] = nci;
  int32_t *d = b->in_dev;
  int32_t *prop_slot = NULL; /* a proposing step's context slots (its rows are the log's first ones, consumed by it) */
  if (b->prop_on) {
    const int PB = b->prop_blk, PT = b->prop_bt;
    int32_t *pr = hi + o_prop, *pl = pr + PB, *pc = pl + PB, *ptab = pc + PB;
    prop_slot = ptab + (size_t)PB * PT;
    for (int i = 0; i < PB; i++) pr[i] = pl[i] = -1, pc[i] = 0;
    memset(ptab, 0, sizeof(int32_t) * (size_t)PB * PT);
    for (int t = 0; t < T; t++) pl[bt->seq_of[t]] = t; /* each sequence's last row */
    for (int q = 0; q < bt->n_seqs; q++) {
      const int r0 = bt->propose_row[q];
      if (r0 < 0) continue;
      if (r0 >= T || bt->seq_of[r0] != q || bt->propose_cap[q] < 0)
        return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: sequence %d: proposal row %d (cap %d) is not one of its rows", q,
                            r0, bt->propose_cap[q]);
      pr[q] = r0;
      pc[q] = bt->propose_cap[q];
      const int nb = bt->drafter_blocks[q] < PT ? bt->drafter_blocks[q] : PT;
      for (int k = 0; k < nb; k++) ptab[(size_t)q * PT + k] = bt->drafter_tables[q][k];
    }
    b->d_prop = d + o_prop;
  }
  if (b->flog) { /* the rows' place in the feature log, their positions and drafter cache slots (the
                   * drafter's own KV group: its tables travel in the batch as drafter_tables; a batch
                   * without them, e.g. di_model_score on the same model, feeds the drafter nothing) */
    for (int t = 0; t < Tp; t++) {
      int32_t slot = -1;
      if (t < T && bt->drafter_tables) {
        const int sq = bt->seq_of[t], pos = bt->positions[t];
        const int32_t blk = pos / DI_DRAFTER_BLOCK_TOKENS < bt->drafter_blocks[sq] ? bt->drafter_tables[sq][pos / DI_DRAFTER_BLOCK_TOKENS] : -1;
        if (blk < 0) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: token %d: position %d beyond its %d drafter cache "
                                         "blocks", t, pos, bt->drafter_blocks[sq]);
        slot = blk * DI_DRAFTER_BLOCK_TOKENS + pos % DI_DRAFTER_BLOCK_TOKENS;
      }
      if (prop_slot) {
        prop_slot[t] = slot;
        continue;
      }
      b->flog_pos[b->flog_n + t] = t < T ? bt->positions[t] : 0;
      b->flog_slot[b->flog_n + t] = slot;
    }
    hi[o_n + 2] = prop_slot ? 0 : b->flog_n;
    b->d_flog_row0 = d + o_n + 2;
    if (!prop_slot) b->flog_n += Tp;
  }
  b->d_tokens = d + o_tok; b->d_pos = d + o_pos; b->d_slots = d + o_slot; b->d_out_rows = d + o_out;
  b->d_bt = d + o_bt; b->d_nitems = d + o_n; b->d_ncitems = d + o_n + 1;
  b->lg_gather = lg_gather; b->n_lg = n_lg; b->n_lg_p = n_lg_p; b->d_lg_rows = d + o_lg;
  b->d_items = (di_cuk_attn_item *)(d + o_items);
  b->d_step_rows = (di_cuk_sample_row *)(d + o_srows);
  b->d_citems = (di_cuk_combine_item *)(d + o_citems);
  b->mha_step = use_mha;
  b->n_mha_items = use_mha ? n_mi : 0;
  b->n_mha_keys = use_mha ? (int)n_mk : 0;
  b->d_mha_items = (const di_cuk_mha_item *)(d + o_mitems);
  b->d_mha_slots = d + o_mslots;
  b->T = T; b->Tp = Tp; b->n_out = n_out; b->n_out_p = n_out_p; b->bt_stride = bt_stride;
  b->max_items = max_items; b->max_citems = max_citems; b->bm = bm; b->attn_cl = cluster ? CL : 0; b->in_used = o;
  b->n_seq_rows = n_seq_rows;
  return DI_OK;
}


static graph_entry *find_graph(cu_backend *b) {
  for (int i = 0; i < b->n_graphs; i++) {
    graph_entry *g = &b->graphs[i];
    if (!g->prop_only && g->T == b->Tp && g->n_out == b->n_out_p && g->bt_stride == b->bt_stride && g->max_items == b->max_items &&
        g->max_citems == b->max_citems && g->bm == b->bm && g->attn_cl == b->attn_cl && g->n_seq_rows == b->n_seq_rows &&
        g->step_sample == b->step_sample && g->n_lg == b->n_lg_p && g->prop_blk == b->prop_blk && g->prop_bt == b->prop_bt)
      return g;
  }
  if (b->n_graphs == MAX_GRAPHS) drop_graphs(b);
  graph_entry *g = &b->graphs[b->n_graphs++];
  memset(g, 0, sizeof *g);
  g->T = b->Tp; g->n_out = b->n_out_p; g->bt_stride = b->bt_stride; g->max_items = b->max_items;
  g->max_citems = b->max_citems; g->bm = b->bm; g->attn_cl = b->attn_cl; g->n_seq_rows = b->n_seq_rows;
  g->step_sample = b->step_sample;
  g->n_lg = b->n_lg_p;
  g->prop_blk = b->prop_blk;
  g->prop_bt = b->prop_bt;
  return g;
}


/* A DSpark proposal's own graph (prop_only), keyed by what prop_forward's launches name: the step's
 * padded rows, the padded block count, the drafter tables' stride and where its inputs lie in the
 * step's input block. */
static graph_entry *find_prop_graph(cu_backend *b) {
  const size_t off = (size_t)(b->d_prop - b->in_dev);
  for (int i = 0; i < b->n_graphs; i++) {
    graph_entry *g = &b->graphs[i];
    if (g->prop_only && g->T == b->Tp && g->prop_blk == b->prop_blk && g->prop_bt == b->prop_bt && g->prop_off == off)
      return g;
  }
  if (b->n_graphs == MAX_GRAPHS) drop_graphs(b);
  graph_entry *g = &b->graphs[b->n_graphs++];
  memset(g, 0, sizeof *g);
  g->prop_only = 1;
  g->T = b->Tp;
  g->prop_blk = b->prop_blk;
  g->prop_bt = b->prop_bt;
  g->prop_off = off;
  return g;
}

/* Captures what run(ctx) enqueues on the stream into g->exec (the step's forward or a proposal's);
 * `what` names it in the errors. */
static di_status capture_graph(cu_backend *b, graph_entry *g, di_status (*run)(void *), void *ctx, const char *what) {
  cudaGraph_t graph_h = NULL;
  DI_CU(cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal));
  di_status st = run(ctx);
  cudaError_t e = cudaStreamEndCapture(b->stream, &graph_h);
  if (st != DI_OK) { if (graph_h) cudaGraphDestroy(graph_h); return st; }
  if (e != cudaSuccess) return di_error_set(DI_ERR_BACKEND, "cuda: %s capture failed: %s", what, cudaGetErrorString(e));
  e = cudaGraphInstantiate(&g->exec, graph_h, 0);
  cudaGraphDestroy(graph_h);
  if (e != cudaSuccess) { g->exec = NULL; return di_error_set(DI_ERR_BACKEND, "cuda: %s instantiate failed: %s", what, cudaGetErrorString(e)); }
  b->stats.graph_captures++;
  return DI_OK;
}
static di_status step_forward(void *b) { return forward((cu_backend *)b); }

/* a graph step's proposal (cu_submit): after the step on the stream, eagerly at its key's first sight,
 * then captured and replayed, as a step */
static di_status prop_launch(cu_backend *b) {
  graph_entry *g = find_prop_graph(b);
  if (!g->exec && g->seen < 1) {
    g->seen++;
    return b->prop_forward(b->prop_ctx);
  }
  if (!g->exec) DI_TRY(capture_graph(b, g, b->prop_forward, b->prop_ctx, "proposal graph"));
  DI_CU(cudaGraphLaunch(g->exec, b->stream));
  return DI_OK;
}

/* a step is on the stream: when it samples in-step, its tokens' copy to the host goes right behind it */
static di_status step_queued(cu_backend *b) {
  b->pending = 1;
  b->tok_queued = b->step_sample;
  if (b->step_sample) DI_TRY(queue_tokens(b, b->n_out));
  return DI_OK;
}

static di_status launch_graph(cu_backend *b, graph_entry *g);

di_status cu_submit(di_backend *bb, const di_batch *batch) {
  cu_backend *b = (cu_backend *)bb;
  if (b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: submit while a step is in flight");
  DI_TRY(prepare(b, batch));
  DI_CU(cudaMemcpyAsync(b->in_dev, b->in_host, b->in_used * sizeof(int32_t), cudaMemcpyHostToDevice, b->stream));
  DI_CU(cudaEventRecord(b->ev_h2d, b->stream));
  b->h2d_recorded = 1;
  b->stats.steps++;
  const int graph = b->use_graphs && b->T <= DI_CUDA_GRAPH_MAX_T;
  if (!graph) {
    DI_TRY(forward(b));
    return step_queued(b);
  }
  /* a proposal in a graph step, with DEEPINFER_DSPARK_PROP_GRAPH=1 (prop_split; default 0: one graph holds
   * both): the step's graph without it (the plain step's, prop_blk = prop_bt = 0 in its key), then the
   * proposal's own graph behind it on the stream (prop_launch). Same launches in the same stream order. */
  const int pb = b->prop_blk, pt = b->prop_bt, split = b->prop_split && b->prop_on && b->step_sample;
  if (split) b->prop_blk = b->prop_bt = 0, b->prop_defer = 1;
  graph_entry *g = find_graph(b);
  di_status st_g = DI_OK;
  if (!g->exec && g->seen < 1) { /* first sight: eager (sets kernel attributes, plans GEMMs) */
    g->seen++;
    st_g = forward(b);
  } else {
    st_g = launch_graph(b, g);
  }
  if (split) {
    b->prop_blk = pb, b->prop_bt = pt, b->prop_defer = 0;
    if (st_g == DI_OK) st_g = prop_launch(b);
  }
  DI_TRY(st_g);
  return step_queued(b);
}

/* the step's graph: captured at its second sight, then replayed */
static di_status launch_graph(cu_backend *b, graph_entry *g) {
  if (!g->exec) DI_TRY(capture_graph(b, g, step_forward, b, "graph"));
  if (b->gpu_time) DI_CU(cudaEventRecord(b->ev_g0, b->stream));
  DI_CU(cudaGraphLaunch(g->exec, b->stream));
  if (b->gpu_time) DI_CU(cudaEventRecord(b->ev_g1, b->stream));
  b->timing = b->gpu_time;
  b->stats.graph_replays++;
  return DI_OK;
}

di_status cu_wait(di_backend *bb, float *logits, float *hidden) {
  cu_backend *b = (cu_backend *)bb;
  if (!b->pending) return di_error_set(DI_ERR_INVALID_ARG, "cuda backend: wait without submit");
  b->pending = 0;
  DI_CU(cudaStreamSynchronize(b->stream));
  if (b->timing) {
    float ms = 0;
    DI_CU(cudaEventElapsedTime(&ms, b->ev_g0, b->ev_g1));
    b->stats.graph_ms += ms;
    b->stats.timed_replays++;
    b->timing = 0;
  }
  if (b->prof && b->n_marks > 1) { /* decode-sized steps and larger ones apart */
    cu_backend::cu_prof_acc *pa = &b->prof_acc[b->T <= DI_CUDA_GRAPH_MAX_T ? 0 : 1];
    pa->steps++;
    for (int i = 1; i < b->n_marks; i++) {
      float ms = 0;
      cudaEventElapsedTime(&ms, b->marks[i - 1], b->marks[i]);
      int k = 0;
      while (k < pa->n && strcmp(pa->label[k], b->mark_label[i])) k++;
      if (k == pa->n && k < 64) pa->label[pa->n++] = b->mark_label[i];
      if (k < 64) pa->ms[k] += ms;
    }
  }
  if (logits && b->n_out > 0 && b->lg_gather) { /* logits row k is output row lg_out[k]: runs of both consecutive */
    const size_t row = sizeof(float) * (size_t)b->V;
    for (int k = 0; k < b->n_lg;) {
      int j = k + 1;
      while (j < b->n_lg && b->lg_out[j] == b->lg_out[j - 1] + 1) j++;
      DI_CU(cudaMemcpy((char *)logits + (size_t)b->lg_out[k] * row, (const char *)b->logits + (size_t)k * row,
                       (size_t)(j - k) * row, cudaMemcpyDeviceToHost));
      k = j;
    }
  } else if (logits && b->n_out > 0 && b->want_on) { /* only the wanted rows, in runs of consecutive ones */
    const size_t row = sizeof(float) * (size_t)b->V;
    for (int i = 0; i < b->n_out;) {
      if (!b->want_host[i]) { i++; continue; }
      int j = i;
      while (j < b->n_out && b->want_host[j]) j++;
      DI_CU(cudaMemcpy((char *)logits + i * row, (const char *)b->logits + i * row, (size_t)(j - i) * row,
                       cudaMemcpyDeviceToHost));
      i = j;
    }
  } else if (logits && b->n_out > 0) {
    DI_CU(cudaMemcpy(logits, b->logits, sizeof(float) * (size_t)b->n_out * b->V, cudaMemcpyDeviceToHost));
  }
  if (hidden && b->n_out > 0 && b->n_capture > 0) {
    DI_CU(cudaMemcpy(hidden, b->cap_buf, sizeof(float) * (size_t)b->n_out * b->n_capture * b->H, cudaMemcpyDeviceToHost));
  } else if (hidden && b->n_out > 0) {
    size_t n = (size_t)b->n_out * b->H;
    uint16_t *tmp = (uint16_t *)malloc(n * 2);
    if (!tmp) return di_error_set(DI_ERR_OOM, "cuda backend: out of host memory");
    cudaError_t e = cudaMemcpy(tmp, b->hn, n * 2, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) { free(tmp); return di_error_set(DI_ERR_BACKEND, "cuda: hidden copy: %s", cudaGetErrorString(e)); }
    for (size_t i = 0; i < n; i++) hidden[i] = di_bf16_to_f32(tmp[i]);
    free(tmp);
  }
  return DI_OK;
}

