/* The KV block manager: per-sequence block tables over one block pool per cache group, prefix
 * caching by hash chain, window groups that give back old blocks (see kv_manager.h). */
#include "kv/kv_manager.h"
#include "kv/block_pool.h"
#include <stdlib.h>
#include <string.h>

struct di_kv_manager {
  int n_groups;
  di_kv_group_info info[DI_KV_MAX_GROUPS];
  int span[DI_KV_MAX_GROUPS];          /* tokens covered by one block */
  di_block_pool pool[DI_KV_MAX_GROUPS];
  int prefix_caching;
  uint8_t replay[DI_KV_MAX_GROUPS];    /* bounded replay: the group keeps nothing for cached prefixes */
  int64_t query_tokens, hit_tokens;
};

void di_kv_set_bounded_replay(di_kv_manager *m) {
  for (int g = 0; g < m->n_groups; g++)
    m->replay[g] = m->info[g].kind == DI_KV_SLIDING || m->info[g].kind == DI_KV_STATE;
}

/* Positions one block of a group covers: its block_tokens (0: DI_KV_BLOCK_SIZE). A value other than
 * DI_KV_BLOCK_SIZE must divide it and is for full, unwindowed groups only (kv_manager.h). */
static di_status group_span(const di_kv_group_info *gi, int g, int *span) {
  const int bt = gi->block_tokens > 0 ? gi->block_tokens : DI_KV_BLOCK_SIZE;
  if (gi->block_tokens < 0 || DI_KV_BLOCK_SIZE % bt != 0)
    return di_error_set(DI_ERR_INVALID_ARG, "KV cache group %d: blocks of %d tokens (a divisor of %d is needed)", g,
                        gi->block_tokens, DI_KV_BLOCK_SIZE);
  if (bt != DI_KV_BLOCK_SIZE && (gi->window > 0 || gi->kind != DI_KV_FULL))
    return di_error_set(DI_ERR_INVALID_ARG, "KV cache group %d: blocks of %d tokens are for full groups without a window", g, bt);
  *span = bt;
  return DI_OK;
}

static uint64_t mix64(uint64_t x) {
  x ^= x >> 30; x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27; x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static uint64_t hash_with(uint64_t seed, uint64_t parent, const int32_t *t, int n) {
  uint64_t h = mix64(seed ^ mix64(parent + 0x9e3779b97f4a7c15ULL));
  for (int i = 0; i < n; i++) h = mix64(h ^ ((uint64_t)(uint32_t)t[i] + ((uint64_t)i << 32)));
  return mix64(h ^ (uint64_t)n);
}

uint64_t di_kv_block_hash(uint64_t parent, const int32_t *tokens, int n) {
  return hash_with(0x243f6a8885a308d3ULL, parent, tokens, n);
}
static uint64_t block_hash2(uint64_t parent, const int32_t *tokens, int n) {
  return hash_with(0x13198a2e03707344ULL, parent, tokens, n);
}

di_status di_kv_manager_create(const di_kv_group_info *groups, int n_groups, const int64_t *n_blocks,
                               int prefix_caching, di_kv_manager **out) {
  if (n_groups < 1 || n_groups > DI_KV_MAX_GROUPS)
    return di_error_set(DI_ERR_INVALID_ARG, "KV manager: %d cache groups (1..%d supported)", n_groups, DI_KV_MAX_GROUPS);
  di_kv_manager *m = calloc(1, sizeof *m);
  if (!m) return di_error_set(DI_ERR_OOM, "KV manager: out of memory");
  m->n_groups = n_groups;
  m->prefix_caching = prefix_caching;
  for (int g = 0; g < n_groups; g++) {
    m->info[g] = groups[g];
    int tpe = groups[g].tokens_per_entry > 0 ? groups[g].tokens_per_entry : 1;
    m->info[g].tokens_per_entry = tpe;
    /* every group pages by positions (a compressed block holds the entries whose window closes in it);
     * spans divide DI_KV_BLOCK_SIZE, so all groups hit at one length, a multiple of it */
    di_status st = group_span(&groups[g], g, &m->span[g]);
    m->info[g].block_tokens = m->span[g];
    if (st == DI_OK) st = di_block_pool_init(&m->pool[g], n_blocks[g]);
    if (st != DI_OK) {
      di_kv_manager_free(m);
      return di_error_wrap(st, "KV cache group %d: ", g);
    }
  }
  *out = m;
  return DI_OK;
}

void di_kv_manager_free(di_kv_manager *m) {
  if (!m) return;
  for (int g = 0; g < m->n_groups; g++) di_block_pool_destroy(&m->pool[g]);
  free(m);
}

int di_kv_num_groups(const di_kv_manager *m) { return m->n_groups; }
int64_t di_kv_group_blocks(const di_kv_manager *m, int g) { return m->pool[g].n; }
const di_kv_group_info *di_kv_group(const di_kv_manager *m, int g) { return &m->info[g]; }

/* blocks a sequence of `tokens` positions holds at once in a group: a window group at most those
 * covering its window and a step of step_tokens after it (plus a block on each side) */
static int64_t seq_blocks(const di_kv_group_info *gi, int span, int64_t tokens, int step_tokens) {
  int64_t n = (tokens + span - 1) / span;
  if (gi->window > 0) {
    int64_t cap = ((int64_t)gi->window + (step_tokens > 0 ? step_tokens : 1) + span - 1) / span + 1;
    if (n > cap) n = cap;
  }
  return n;
}

/* a window group: every sequence its window (decode), and one step's chunk on top */
static int64_t blocks_for(const di_kv_group_info *gi, int span, int64_t tokens, int max_seqs, int step_tokens) {
  int64_t n = (tokens + span - 1) / span;
  if (gi->window > 0) {
    int64_t cap = (int64_t)max_seqs * seq_blocks(gi, span, (int64_t)1 << 40, 1) + (step_tokens + span - 1) / span;
    if (n > cap) n = cap;
  }
  return n < 1 ? 1 : n;
}

int di_kv_fits(const di_kv_manager *m, int64_t n_tokens, int step_tokens, int *group, int64_t *need) {
  for (int g = 0; g < m->n_groups; g++) {
    int64_t n = seq_blocks(&m->info[g], m->span[g], n_tokens, step_tokens);
    if (n > m->pool[g].n) {
      *group = g;
      *need = n;
      return 0;
    }
  }
  return 1;
}

di_status di_kv_plan(const di_kv_group_info *groups, int n_groups, int64_t budget_bytes, int max_seqs, int step_tokens,
                     int64_t *n_blocks) {
  if (n_groups < 1 || n_groups > DI_KV_MAX_GROUPS)
    return di_error_set(DI_ERR_INVALID_ARG, "KV plan: %d cache groups", n_groups);
  int span[DI_KV_MAX_GROUPS];
  for (int g = 0; g < n_groups; g++) {
    if (groups[g].bytes_per_token <= 0)
      return di_error_set(DI_ERR_INVALID_ARG, "KV plan: group %d has %lld bytes per token", g, (long long)groups[g].bytes_per_token);
    DI_TRY(group_span(&groups[g], g, &span[g]));
  }
  /* per-sequence state (V4's window ring, compressor scratch) comes off the budget first, for
   * max_seqs sequences: the blocks then bound the per-token growth */
  int64_t per_seq = 0;
  for (int g = 0; g < n_groups; g++)
    per_seq += groups[g].bytes_per_seq > 0 ? groups[g].bytes_per_seq : 0;
  if (per_seq > 0) {
    if (per_seq > budget_bytes / (max_seqs > 0 ? max_seqs : 1))
      return di_error_set(DI_ERR_OOM, "KV cache budget of %lld bytes cannot hold the per-sequence state of %d sequences "
                          "(%lld bytes each); lower max_num_seqs or raise the KV cache memory",
                          (long long)budget_bytes, max_seqs, (long long)per_seq);
    budget_bytes -= per_seq * (max_seqs > 0 ? max_seqs : 1);
  }
  /* largest token capacity T whose blocks fit the budget (binary search; cost is monotone in T) */
  int64_t lo = 0, hi = (int64_t)1 << 40;
  while (lo < hi) {
    int64_t mid = lo + (hi - lo + 1) / 2, bytes = 0;
    for (int g = 0; g < n_groups && bytes <= budget_bytes; g++)
      bytes += blocks_for(&groups[g], span[g], mid, max_seqs, step_tokens) * groups[g].bytes_per_token * span[g];
    if (bytes <= budget_bytes) lo = mid; else hi = mid - 1;
  }
  if (lo < 1)
    return di_error_set(DI_ERR_OOM, "KV cache budget of %lld bytes holds not even one block per cache group "
                        "(one block of group 0 is %lld bytes)", (long long)budget_bytes,
                        (long long)(groups[0].bytes_per_token * DI_KV_BLOCK_SIZE));
  for (int g = 0; g < n_groups; g++) n_blocks[g] = blocks_for(&groups[g], span[g], lo, max_seqs, step_tokens);
  return DI_OK;
}

static di_status seq_reserve(di_kv_seq *s, int g, int n) {
  if (n <= s->cap[g]) return DI_OK;
  int cap = s->cap[g] ? s->cap[g] : 8;
  while (cap < n) cap *= 2;
  int32_t *t = realloc(s->table[g], (size_t)cap * sizeof *t);
  if (!t) return di_error_set(DI_ERR_OOM, "KV block table: out of memory");
  s->table[g] = t;
  s->cap[g] = cap;
  return DI_OK;
}

static int groups_share_prefixes(const di_kv_manager *m) {
  for (int g = 0; g < m->n_groups; g++)
    if (m->info[g].no_sharing) return 0; /* the state is not in the blocks */
  return 1;
}

/* Group g's blocks in a prefix of k x DI_KV_BLOCK_SIZE tokens. */
static int prefix_blocks(const di_kv_manager *m, int g, int k) { return k * (DI_KV_BLOCK_SIZE / m->span[g]); }

/* First block of a k x 64-token prefix that group g needs (0 for a full group; a window group only those
 * covering the window before position k * 64, the same rule di_kv_slide frees by). */
static int first_needed(const di_kv_manager *m, int g, int k) {
  const int w = m->info[g].window, span = m->span[g], nb = prefix_blocks(m, g, k);
  int i = 0;
  if (w > 0)
    while (i < nb && (int64_t)(i + 1) * span <= (int64_t)k * DI_KV_BLOCK_SIZE - w) i++;
  return i;
}

/* hash chains of the first nb blocks of `span` tokens */
static void chain(const int32_t *tokens, int nb, int span, uint64_t *h, uint64_t *h2) {
  uint64_t parent = 0;
  for (int i = 0; i < nb; i++) {
    h[i] = di_kv_block_hash(parent, tokens + (size_t)i * span, span);
    h2[i] = block_hash2(parent, tokens + (size_t)i * span, span);
    parent = h[i];
  }
}

int di_kv_shares_prefixes(const di_kv_manager *m) { return groups_share_prefixes(m); }

int di_kv_match_prefix(di_kv_manager *m, di_kv_seq *s, const int32_t *tokens, int n_tokens, int force) {
  if ((!m->prefix_caching && !force) || n_tokens <= 1 || !groups_share_prefixes(m)) return 0;
  for (int g = 0; g < m->n_groups; g++)
    if (s->n[g] != 0) return 0;
  if (!force) m->query_tokens += n_tokens;
  const int span = DI_KV_BLOCK_SIZE, kmax = (n_tokens - 1) / span; /* the last token is always computed */
  if (kmax <= 0) return 0;
  /* each block size's hash chain over the kmax x 64 tokens (groups of one size share theirs) */
  uint64_t *hg[DI_KV_MAX_GROUPS], *h2g[DI_KV_MAX_GROUPS];
  size_t words = 0;
  for (int g = 0; g < m->n_groups; g++) words += 2 * (size_t)prefix_blocks(m, g, kmax);
  uint64_t *hbuf = malloc(sizeof *hbuf * words);
  if (!hbuf) return 0; /* no hit: the prompt is computed */
  size_t used = 0;
  for (int g = 0; g < m->n_groups; g++) {
    int same = -1;
    for (int f = 0; f < g && same < 0; f++)
      if (m->span[f] == m->span[g]) same = f;
    if (same >= 0) {
      hg[g] = hg[same];
      h2g[g] = h2g[same];
      continue;
    }
    const int nb = prefix_blocks(m, g, kmax);
    hg[g] = hbuf + used;
    h2g[g] = hbuf + used + nb;
    used += 2 * (size_t)nb;
    chain(tokens, nb, m->span[g], hg[g], h2g[g]);
  }
  /* full groups: the longest run of cached blocks from the start; window groups: a shorter prefix may
   * be needed, one whose window blocks are all still cached (older ones may be evicted) */
  int k = kmax, min_k = 0;
  for (int g = 0; g < m->n_groups; g++) {
    if (m->replay[g]) { /* a replayed window must not reach before position 1 */
      const int w = m->info[g].kind == DI_KV_SLIDING ? m->info[g].window : 0;
      if ((w + span - 1) / span > min_k) min_k = (w + span - 1) / span;
      continue;
    }
    if (m->info[g].window > 0) continue;
    const int r = DI_KV_BLOCK_SIZE / m->span[g], nb = prefix_blocks(m, g, k);
    int i = 0;
    while (i < nb && di_block_pool_lookup(&m->pool[g], hg[g][i], h2g[g][i]) >= 0) i++;
    k = i / r;
  }
  for (; k > 0; k--) {
    int ok = k >= min_k;
    for (int g = 0; g < m->n_groups && ok; g++) {
      if (m->replay[g]) /* fresh blocks for the replayed window */
        ok = m->info[g].kind != DI_KV_SLIDING || m->pool[g].n_free >= k - first_needed(m, g, k);
      else
        for (int i = first_needed(m, g, k), nb = prefix_blocks(m, g, k); i < nb && ok; i++)
          ok = di_block_pool_lookup(&m->pool[g], hg[g][i], h2g[g][i]) >= 0;
    }
    if (ok) break;
  }
  for (int g = 0; g < m->n_groups && k > 0; g++)
    if (seq_reserve(s, g, prefix_blocks(m, g, k)) != DI_OK) k = 0;
  if (k <= 0) {
    free(hbuf);
    return 0;
  }
  for (int g = 0; g < m->n_groups; g++) {
    const int nb = prefix_blocks(m, g, k);
    const int first = m->replay[g] && m->info[g].kind == DI_KV_STATE ? nb : first_needed(m, g, k);
    const uint64_t *h = hg[g], *h2 = h2g[g];
    for (int i = 0; i < nb; i++) {
      int32_t b = -1; /* blocks behind a window group's window are not taken */
      if (i >= first && m->replay[g]) {
        b = di_block_pool_alloc(&m->pool[g]);
        DI_ASSERT(b >= 0);
      } else if (i >= first) {
        b = di_block_pool_lookup(&m->pool[g], h[i], h2[i]);
        DI_ASSERT(b >= 0);
        di_block_pool_ref(&m->pool[g], b);
      }
      s->table[g][i] = b;
    }
    s->n[g] = nb;
    s->n_freed[g] = first;
    s->n_hashed[g] = nb;
    s->last_hash[g] = h[nb - 1];
  }
  free(hbuf);
  const int hit = k * span;
  if (!force) m->hit_tokens += hit;
  return hit;
}

static int blocks_to_cover(const di_kv_manager *m, int g, int n_tokens) {
  return (n_tokens + m->span[g] - 1) / m->span[g];
}

int64_t di_kv_blocks_needed(const di_kv_manager *m, const di_kv_seq *s, int n_tokens) {
  int64_t need = 0;
  for (int g = 0; g < m->n_groups; g++) {
    int want = blocks_to_cover(m, g, n_tokens);
    if (want > s->n[g]) need += want - s->n[g];
  }
  return need;
}

int di_kv_can_allocate(const di_kv_manager *m, const di_kv_seq *s, int n_tokens) {
  for (int g = 0; g < m->n_groups; g++) {
    int want = blocks_to_cover(m, g, n_tokens);
    if (want > s->n[g] && want - s->n[g] > m->pool[g].n_free) return 0;
  }
  return 1;
}

di_status di_kv_allocate(di_kv_manager *m, di_kv_seq *s, int n_tokens) {
  int grows = 0; /* most decoding steps need no new block in any group: nothing to do then */
  for (int g = 0; g < m->n_groups && !grows; g++) grows = blocks_to_cover(m, g, n_tokens) > s->n[g];
  if (!grows) return DI_OK;
  if (!di_kv_can_allocate(m, s, n_tokens)) {
    for (int g = 0; g < m->n_groups; g++) {
      int want = blocks_to_cover(m, g, n_tokens);
      if (want - s->n[g] > m->pool[g].n_free)
        return di_error_set(DI_ERR_OOM, "KV cache group %d: %d more blocks needed, %lld free of %lld",
                            g, want - s->n[g], (long long)m->pool[g].n_free, (long long)m->pool[g].n);
    }
  }
  for (int g = 0; g < m->n_groups; g++) DI_TRY(seq_reserve(s, g, blocks_to_cover(m, g, n_tokens)));
  for (int g = 0; g < m->n_groups; g++) {
    int want = blocks_to_cover(m, g, n_tokens);
    while (s->n[g] < want) {
      int32_t b = di_block_pool_alloc(&m->pool[g]);
      DI_ASSERT(b >= 0);
      s->table[g][s->n[g]++] = b;
    }
  }
  return DI_OK;
}

/* Registers group g's full blocks among tokens[0..n_valid) (the hash chain goes on past blocks already
 * given back, which keep no hash). */
static void commit_group(di_kv_manager *m, di_kv_seq *s, int g, const int32_t *tokens, int n_valid) {
  {
    int span = m->span[g];
    while ((s->n_hashed[g] + 1) * span <= n_valid && s->n_hashed[g] < s->n[g]) {
      int i = s->n_hashed[g];
      uint64_t h = s->last_hash[g];
      uint64_t nh = di_kv_block_hash(h, tokens + i * span, span);
      if (s->table[g][i] >= 0 && !m->replay[g]) /* a block given back keeps no hash; bounded replay keeps none */
        di_block_pool_register(&m->pool[g], s->table[g][i], nh, block_hash2(h, tokens + i * span, span));
      s->last_hash[g] = nh;
      s->n_hashed[g]++;
    }
  }
}

void di_kv_commit(di_kv_manager *m, di_kv_seq *s, const int32_t *tokens, int n_valid) {
  for (int g = 0; g < m->n_groups; g++) commit_group(m, s, g, tokens, n_valid);
}

void di_kv_slide(di_kv_manager *m, di_kv_seq *s, const int32_t *tokens, int n_known, int pos) {
  for (int g = 0; g < m->n_groups; g++) {
    int w = m->info[g].window;
    if (w <= 0) continue;
    int span = m->span[g];
    /* the blocks about to go are registered first, so that they stay findable for prefix hits (their
     * content may still be being written by the step in flight: any later reader runs after it) */
    commit_group(m, s, g, tokens, n_known < pos - w ? n_known : pos - w);
    /* block i covers tokens [i*span, (i+1)*span); it is needed while (i+1)*span > pos - w */
    while (s->n_freed[g] < s->n[g] && (int64_t)(s->n_freed[g] + 1) * span <= (int64_t)pos - w) {
      int i = s->n_freed[g]++;
      if (s->table[g][i] >= 0) di_block_pool_unref(&m->pool[g], s->table[g][i]);
      s->table[g][i] = -1;
    }
  }
}

void di_kv_truncate(di_kv_manager *m, di_kv_seq *s, int n_tokens) {
  for (int g = 0; g < m->n_groups; g++) {
    int keep = blocks_to_cover(m, g, n_tokens);
    if (keep < s->n_hashed[g]) keep = s->n_hashed[g];
    while (s->n[g] > keep) {
      int32_t b = s->table[g][--s->n[g]];
      if (b >= 0) di_block_pool_unref(&m->pool[g], b);
    }
  }
}

void di_kv_free_seq(di_kv_manager *m, di_kv_seq *s) {
  for (int g = 0; g < m->n_groups; g++) {
    for (int i = s->n[g] - 1; i >= 0; i--)
      if (s->table[g][i] >= 0) di_block_pool_unref(&m->pool[g], s->table[g][i]);
    free(s->table[g]);
  }
  memset(s, 0, sizeof *s);
}

void di_kv_get_stats(const di_kv_manager *m, di_kv_stats *st) {
  memset(st, 0, sizeof *st);
  for (int g = 0; g < m->n_groups; g++) {
    st->total_blocks += m->pool[g].n;
    st->free_blocks += m->pool[g].n_free;
    st->cached_blocks += m->pool[g].n_cached;
    st->evictions += m->pool[g].evictions;
  }
  st->used_blocks = st->total_blocks - st->free_blocks;
  st->query_tokens = m->query_tokens;
  st->hit_tokens = m->hit_tokens;
}

int64_t di_kv_seq_refs(const di_kv_manager *m, const di_kv_seq *s) {
  int64_t r = 0;
  for (int g = 0; g < m->n_groups; g++)
    for (int i = 0; i < s->n[g]; i++) r += s->table[g][i] >= 0;
  return r;
}

di_status di_kv_check(const di_kv_manager *m, int64_t expected_refs) {
  int64_t refs = 0;
  char what[48];
  for (int g = 0; g < m->n_groups; g++) {
    snprintf(what, sizeof what, "KV cache group %d", g);
    DI_TRY(di_block_pool_check(&m->pool[g], what));
    for (int64_t b = 0; b < m->pool[g].n; b++) refs += m->pool[g].ref[b];
  }
  if (expected_refs >= 0 && refs != expected_refs)
    return di_error_set(DI_ERR_INTERNAL, "KV cache: %lld block references held, live sequences account for %lld",
                        (long long)refs, (long long)expected_refs);
  return DI_OK;
}
