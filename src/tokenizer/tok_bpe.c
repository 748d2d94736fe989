/* The BPE model: vocab and merge hash maps, the per-word merge loop (a priority queue ordered by
 * merge rank then position, as HF's word.rs), byte fallback, unk fusing, and the shared word cache. */
#include "tokenizer/tok_internal.h"
#include "tokenizer/unicode.h"
#include <stdio.h>

uint64_t di_hash_bytes(const char *s, size_t n) {
  /* FNV-1a over 8-byte words then bytes: fast enough and well mixed for vocab strings */
  uint64_t h = 0xcbf29ce484222325ULL;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, s + i, 8);
    h = (h ^ w) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  for (; i < n; i++)
    h = (h ^ (unsigned char)s[i]) * 0x100000001b3ULL;
  h ^= h >> 32;
  return h * 0x9E3779B97F4A7C15ULL;
}

/* Open addressing; a slot holds the hash tag and the key's offset and length, so a probe costs one
 * cache miss in the table plus one in the matching key's bytes. */
di_status di_strmap_build(di_strmap *m, int32_t n_keys, const uint32_t *off, const uint32_t *len,
                          const char *data, const char *what) {
  uint32_t cap = 16;
  while (cap < (uint32_t)n_keys * 2u + 2u)
    cap *= 2;
  m->slots = calloc(cap, sizeof *m->slots);
  if (!m->slots)
    return di_error_set(DI_ERR_OOM, "%s: out of memory for a hash map of %d keys", what, n_keys);
  m->mask = cap - 1;
  for (int32_t k = 0; k < n_keys; k++) {
    if (len[k] == UINT32_MAX)
      continue; /* hole */
    uint64_t hh = di_hash_bytes(data + off[k], len[k]);
    uint32_t h = (uint32_t)hh & m->mask, tag = (uint32_t)(hh >> 32);
    while (m->slots[h].idx) {
      const di_strslot *o = &m->slots[h];
      if (o->tag == tag && o->len == len[k] && memcmp(data + o->off, data + off[k], len[k]) == 0) {
        m->dups++;
        break; /* duplicate key: the later one wins, as a Rust HashMap collect does */
      }
      h = (h + 1) & m->mask;
    }
    m->slots[h] = (di_strslot){tag, (uint32_t)k + 1, off[k], len[k]};
  }
  return DI_OK;
}

int32_t di_strmap_get(const di_strmap *m, const char *s, size_t n, const uint32_t *off, const uint32_t *len,
                      const char *data) {
  (void)off;
  (void)len;
  if (!m->slots)
    return -1;
  uint64_t hh = di_hash_bytes(s, n);
  uint32_t h = (uint32_t)hh & m->mask, tag = (uint32_t)(hh >> 32);
  for (;;) {
    const di_strslot *sl = &m->slots[h];
    if (!sl->idx)
      return -1;
    if (sl->tag == tag && sl->len == n && memcmp(data + sl->off, s, n) == 0)
      return (int32_t)sl->idx - 1;
    h = (h + 1) & m->mask;
  }
}

int32_t di_vocab_lookup(const di_tokenizer *t, const char *s, size_t n) {
  return di_strmap_get(&t->vocab, s, n, t->mtok_off, t->mtok_len, t->tok_data.p);
}

static inline uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  return x;
}

static const di_merge_val *merge_get(const di_merge_map *m, int32_t a, int32_t b) {
  uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  uint64_t h = mix64(key) & m->mask;
  for (;;) {
    uint64_t k = m->keys[h];
    if (k == key)
      return &m->vals[h];
    if (k == 0)
      return NULL;
    h = (h + 1) & m->mask;
  }
}

/* Called by the loader once per merge, in file order (rank = index). */
static int merge_put(di_merge_map *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
  uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  uint64_t h = mix64(key) & m->mask;
  while (m->keys[h] != 0 && m->keys[h] != key)
    h = (h + 1) & m->mask;
  m->keys[h] = key;
  m->vals[h].rank = rank;
  m->vals[h].new_id = new_id;
  return 0;
}

/* Merge table construction, called by the loader: init once, then add each merge in file order. */
di_status di_bpe_merges_init(di_tokenizer *t, size_t n) {
  uint64_t cap = 16;
  while (cap < n * 2 + 2)
    cap *= 2;
  t->merges.keys = calloc(cap, sizeof *t->merges.keys);
  t->merges.vals = malloc(cap * sizeof *t->merges.vals);
  if (!t->merges.keys || !t->merges.vals)
    return di_error_set(DI_ERR_OOM, "tokenizer.json: out of memory for %zu merges", n);
  t->merges.mask = cap - 1;
  return DI_OK;
}

di_status di_bpe_merge_resolve(di_tokenizer *t, const char *a, size_t na, const char *b, size_t nb,
                               uint32_t rank, int32_t out[3]) {
  int32_t ia = di_vocab_lookup(t, a, na), ib = di_vocab_lookup(t, b, nb);
  if (ia < 0 || ib < 0)
    return di_error_set(DI_ERR_FORMAT, "tokenizer.json: model.merges[%u]: token \"%.*s\" is not in the vocab",
                        rank, (int)(ia < 0 ? na : nb), ia < 0 ? a : b);
  /* the merged token: a + b without b's continuing_subword_prefix */
  size_t skip = 0;
  if (t->prefix_len && nb >= t->prefix_len && memcmp(b, t->prefix, t->prefix_len) == 0)
    skip = t->prefix_len;
  char stackbuf[512];
  size_t nn = na + nb - skip;
  char *buf = nn <= sizeof stackbuf ? stackbuf : malloc(nn);
  if (!buf)
    return di_error_set(DI_ERR_OOM, "tokenizer.json: out of memory");
  memcpy(buf, a, na);
  memcpy(buf + na, b + skip, nb - skip);
  /* most vocabularies number merged tokens in merge order: try rank + the last offset first */
  int32_t id = -1, guess = (int32_t)rank + t->merge_guess;
  if (guess >= 0 && guess < t->n_model_ids && t->mtok_len[guess] == nn &&
      memcmp(t->tok_data.p + t->mtok_off[guess], buf, nn) == 0)
    id = guess;
  if (id < 0)
    id = di_vocab_lookup(t, buf, nn);
  if (id >= 0)
    t->merge_guess = id - (int32_t)rank;
  if (id < 0) {
    di_status st = di_error_set(DI_ERR_FORMAT, "tokenizer.json: model.merges[%u]: merged token \"%.*s\" is not in the vocab",
                                rank, (int)(nn > 200 ? 200 : nn), buf);
    if (buf != stackbuf)
      free(buf);
    return st;
  }
  if (buf != stackbuf)
    free(buf);
  out[0] = ia;
  out[1] = ib;
  out[2] = id;
  return DI_OK;
}

void di_bpe_merge_insert(di_tokenizer *t, const int32_t m[3], uint32_t rank) {
  merge_put(&t->merges, m[0], m[1], rank, m[2]);
}

/* ---- word cache ---- */
static di_bpe_cache *cache_new(void) {
  di_bpe_cache *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->mask = (1u << 17) - 1;
  c->limit = 1u << 16;
  c->slots = calloc(c->mask + 1, sizeof *c->slots);
  if (!c->slots) {
    free(c);
    return NULL;
  }
  pthread_mutex_init(&c->mu, NULL);
  return c;
}

static void cache_free(di_bpe_cache *c) {
  if (!c)
    return;
  pthread_mutex_destroy(&c->mu);
  free(c->slots);
  di_buf_free(&c->keys);
  free(c->vals.p);
  free(c);
}

/* Looks w up; on a hit appends its ids to out and returns 1. */
static int cache_get(di_bpe_cache *c, const char *w, size_t n, uint64_t h, di_ivec *out) {
  int hit = 0;
  pthread_mutex_lock(&c->mu);
  uint32_t s = (uint32_t)h & c->mask;
  for (;;) {
    uint32_t e = c->slots[s];
    if (!e)
      break;
    int32_t *v = c->vals.p + (e - 1);
    if ((size_t)v[1] == n && memcmp(c->keys.p + v[0], w, n) == 0) {
      int32_t k = v[2];
      hit = 1;
      for (int32_t i = 0; i < k; i++)
        if (di_ivec_push(out, v[3 + i])) {
          hit = -1;
          break;
        }
      break;
    }
    s = (s + 1) & c->mask;
  }
  pthread_mutex_unlock(&c->mu);
  return hit;
}

static void cache_put(di_bpe_cache *c, const char *w, size_t n, uint64_t h, const int32_t *ids, size_t k) {
  if (n > 256 || k > 64)
    return; /* long words are rare; keep the cache small */
  pthread_mutex_lock(&c->mu);
  if (c->count >= c->limit) {
    memset(c->slots, 0, (c->mask + 1) * sizeof *c->slots);
    c->count = 0;
    c->keys.len = 0;
    c->vals.len = 0;
  }
  size_t koff = c->keys.len, voff = c->vals.len;
  int ok = di_buf_append(&c->keys, w, n) == 0;
  ok = ok && di_ivec_push(&c->vals, (int32_t)koff) == 0 && di_ivec_push(&c->vals, (int32_t)n) == 0 &&
       di_ivec_push(&c->vals, (int32_t)k) == 0;
  for (size_t i = 0; ok && i < k; i++)
    ok = di_ivec_push(&c->vals, ids[i]) == 0;
  if (ok) {
    uint32_t s = (uint32_t)h & c->mask;
    while (c->slots[s])
      s = (s + 1) & c->mask;
    c->slots[s] = (uint32_t)voff + 1;
    c->count++;
  } else {
    c->keys.len = koff;
    c->vals.len = voff;
  }
  pthread_mutex_unlock(&c->mu);
}

di_status di_bpe_build(di_tokenizer *t) {
  t->cache = cache_new();
  if (!t->cache)
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory for the BPE cache");
  for (int i = 0; i < 0x400; i++) {
    char u[8]; /* (8: the hash reads whole words when it can) */
    int l = di_utf8_encode((uint32_t)i, u);
    t->char_id[i] = di_vocab_lookup(t, u, (size_t)l);
  }
  for (int b = 0; b < 256; b++) {
    char name[8];
    snprintf(name, sizeof name, "<0x%02X>", b);
    t->byte_id[b] = di_vocab_lookup(t, name, 6);
  }
  return DI_OK;
}

void di_bpe_free(di_tokenizer *t) {
  cache_free(t->cache);
  t->cache = NULL;
  free(t->merges.keys);
  free(t->merges.vals);
}

/* ---- the merge loop ---- */
typedef struct { int32_t id, prev, next, alive; } sym;
typedef struct { uint32_t rank; int32_t pos, new_id; } qitem;

static int q_less(const qitem *a, const qitem *b) {
  return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}
static void q_push(qitem *q, size_t *n, qitem x) {
  size_t i = (*n)++;
  while (i > 0) {
    size_t p = (i - 1) / 2;
    if (!q_less(&x, &q[p]))
      break;
    q[i] = q[p];
    i = p;
  }
  q[i] = x;
}
static qitem q_pop(qitem *q, size_t *n) {
  qitem top = q[0], x = q[--*n];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    const qitem *best = &x;
    if (l < *n && q_less(&q[l], best))
      m = l, best = &q[l];
    if (r < *n && q_less(&q[r], best))
      m = r;
    if (m == i)
      break;
    q[i] = q[m];
    i = m;
  }
  if (*n)
    q[i] = x;
  return top;
}

static int32_t lookup_char(const di_tokenizer *t, const char *s, size_t n, uint32_t cp, int first, int last,
                           char *tmp, size_t tmpcap) {
  if ((first || !t->prefix_len) && (!last || !t->suffix_len)) {
    if (cp < 0x400)
      return t->char_id[cp];
    return di_vocab_lookup(t, s, n);
  }
  size_t pl = first ? 0 : t->prefix_len, sl = last ? t->suffix_len : 0;
  if (pl + n + sl > tmpcap)
    return -1;
  memcpy(tmp, t->prefix, pl);
  memcpy(tmp + pl, s, n);
  memcpy(tmp + pl + n, t->suffix, sl);
  return di_vocab_lookup(t, tmp, pl + n + sl);
}

di_status di_bpe_encode_word(const di_tokenizer *t, const char *w, size_t n, di_ivec *out) {
  if (n == 0)
    return DI_OK;
  if (t->ignore_merges) {
    int32_t id = di_vocab_lookup(t, w, n);
    if (id >= 0)
      return di_ivec_push(out, id) ? di_error_set(DI_ERR_OOM, "tokenizer: out of memory") : DI_OK;
  }
  uint64_t h = di_hash_bytes(w, n);
  int hit = cache_get(t->cache, w, n, h, out);
  if (hit < 0)
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  if (hit)
    return DI_OK;

  sym stack_syms[64];
  qitem stack_q[3 * 64 + 1];
  sym *sy = n <= 64 ? stack_syms : malloc(n * sizeof *sy);
  qitem *q = n <= 64 ? stack_q : malloc((3 * n + 1) * sizeof *q); /* pushes <= 3 per symbol */
  if (!sy || !q) {
    if (sy != stack_syms)
      free(sy);
    if (q != stack_q)
      free(q);
    return di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
  }
  int32_t ns = 0;
  const unsigned char *u = (const unsigned char *)w;
  int32_t unk = -1; /* pending unk (HF keeps one and fuses or flushes it) */
  char tmp[64];
  size_t i = 0;
#define ADD(x) (sy[ns].id = (x), sy[ns].alive = 1, ns++)
  while (i < n) {
    uint32_t cp;
    int l = di_utf8_decode(u + i, n - i, &cp);
    if (!l)
      l = 1, cp = 0xFFFD;
    int32_t id = lookup_char(t, w + i, (size_t)l, cp, i == 0, i + (size_t)l == n, tmp, sizeof tmp);
    if (id >= 0) {
      if (unk >= 0) {
        ADD(unk);
        unk = -1;
      }
      ADD(id);
    } else {
      int done = 0;
      if (t->byte_fallback) {
        int all = 1;
        for (int k = 0; k < l; k++)
          if (t->byte_id[u[i + k]] < 0)
            all = 0;
        if (all) {
          for (int k = 0; k < l; k++)
            ADD(t->byte_id[u[i + k]]);
          done = 1; /* as HF: a pending unk is not flushed before the bytes */
        }
      }
      if (!done && t->unk_id >= 0) {
        if (unk >= 0 && !t->fuse_unk)
          ADD(unk);
        unk = t->unk_id;
      }
    }
    i += (size_t)l;
  }
  if (unk >= 0)
    ADD(unk);
#undef ADD
  for (int32_t k = 0; k < ns; k++) {
    sy[k].prev = k - 1;
    sy[k].next = k + 1 < ns ? k + 1 : -1;
  }
  size_t nq = 0;
  for (int32_t k = 0; k + 1 < ns; k++) {
    const di_merge_val *mv = merge_get(&t->merges, sy[k].id, sy[k + 1].id);
    if (mv)
      q_push(q, &nq, (qitem){mv->rank, k, mv->new_id});
  }
  while (nq) {
    qitem top = q_pop(q, &nq);
    sym *s = &sy[top.pos];
    if (!s->alive || s->next < 0)
      continue;
    sym *r = &sy[s->next];
    const di_merge_val *mv = merge_get(&t->merges, s->id, r->id);
    if (!mv || mv->new_id != top.new_id)
      continue; /* stale entry */
    s->id = top.new_id;
    r->alive = 0;
    s->next = r->next;
    if (r->next >= 0)
      sy[r->next].prev = top.pos;
    if (s->prev >= 0) {
      const di_merge_val *pv = merge_get(&t->merges, sy[s->prev].id, s->id);
      if (pv)
        q_push(q, &nq, (qitem){pv->rank, s->prev, pv->new_id});
    }
    if (s->next >= 0) {
      const di_merge_val *nv = merge_get(&t->merges, s->id, sy[s->next].id);
      if (nv)
        q_push(q, &nq, (qitem){nv->rank, top.pos, nv->new_id});
    }
  }
  size_t start = out->len;
  di_status st = DI_OK;
  for (int32_t k = 0; k >= 0 && k < ns; k = sy[k].next)
    if (di_ivec_push(out, sy[k].id)) {
      st = di_error_set(DI_ERR_OOM, "tokenizer: out of memory");
      break;
    }
  if (st == DI_OK)
    cache_put(t->cache, w, n, h, out->len > start ? out->p + start : NULL, out->len - start); /* none: p may be NULL */
  if (sy != stack_syms)
    free(sy);
  if (q != stack_q)
    free(q);
  return st;
}
