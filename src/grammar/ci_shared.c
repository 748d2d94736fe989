/* The shared store of vocabulary classifications (ci_shared.h): an open-addressing table of
 * (description, entry) under one mutex, bounded in memory by forgetting everything at once (the
 * entries are caches; grammars holding one keep it alive through its reference count). */
#include "grammar/ci_shared.h"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct slot {
  uint64_t hash;
  uint32_t *key; /* NULL = empty */
  int n;
  di_ci_entry *e;
} slot;

typedef struct class_slot {
  uint32_t set[8];
  uint32_t id; /* 0 = empty */
} class_slot;

enum { MAX_CLASS_IDS = 1 << 20 }; /* 36 MB of sets at most; further sets are written out */

struct di_ci_shared {
  pthread_mutex_t mu;
  slot *t;
  int cap, used;
  size_t bytes, max_bytes;
  long hits, lookups;
  class_slot *ct; /* byte sets -> ids (open addressing), kept for the store's lifetime */
  int ccap, cused;
};

void di_ci_entry_release(di_ci_entry *e) {
  if (!e || atomic_fetch_sub(&e->refs, 1) != 1)
    return;
  free(e->acc_bits);
  free(e->acc_list);
  free(e->unc);
  free(e);
}

di_ci_shared *di_ci_shared_create(size_t max_bytes) {
  di_ci_shared *s = calloc(1, sizeof *s);
  if (!s)
    return NULL;
  s->cap = 1024;
  s->t = calloc((size_t)s->cap, sizeof *s->t);
  if (!s->t) {
    free(s);
    return NULL;
  }
  s->max_bytes = max_bytes;
  pthread_mutex_init(&s->mu, NULL);
  return s;
}

static void clear_all(di_ci_shared *s) {
  for (int i = 0; i < s->cap; i++)
    if (s->t[i].key) {
      free(s->t[i].key);
      di_ci_entry_release(s->t[i].e);
    }
  memset(s->t, 0, sizeof *s->t * (size_t)s->cap);
  s->used = 0;
  s->bytes = 0;
}

void di_ci_shared_free(di_ci_shared *s) {
  if (!s)
    return;
  clear_all(s);
  free(s->t);
  free(s->ct);
  pthread_mutex_destroy(&s->mu);
  free(s);
}

/* The slot holding the description, or the empty slot where it would go. */
static slot *find_slot(di_ci_shared *s, const uint32_t *key, int n, uint64_t h) {
  for (uint32_t i = (uint32_t)h & (uint32_t)(s->cap - 1);; i = (i + 1) & (uint32_t)(s->cap - 1)) {
    slot *x = &s->t[i];
    if (!x->key || (x->hash == h && x->n == n && memcmp(x->key, key, sizeof *key * (size_t)n) == 0))
      return x;
  }
}

di_ci_entry *di_ci_shared_find(di_ci_shared *s, const uint32_t *key, int n, uint64_t h) {
  pthread_mutex_lock(&s->mu);
  s->lookups++;
  slot *x = find_slot(s, key, n, h);
  di_ci_entry *e = x->key ? x->e : NULL;
  if (e) {
    atomic_fetch_add(&e->refs, 1);
    s->hits++;
  }
  pthread_mutex_unlock(&s->mu);
  return e;
}

static int grow(di_ci_shared *s) {
  int nc = s->cap * 2;
  slot *t = calloc((size_t)nc, sizeof *t), *old = s->t;
  if (!t)
    return 0;
  int oc = s->cap;
  s->t = t;
  s->cap = nc;
  for (int i = 0; i < oc; i++)
    if (old[i].key)
      *find_slot(s, old[i].key, old[i].n, old[i].hash) = old[i];
  free(old);
  return 1;
}

void di_ci_shared_put(di_ci_shared *s, const uint32_t *key, int n, uint64_t h, di_ci_entry *e) {
  size_t cost = e->bytes + sizeof *key * (size_t)n + sizeof(slot);
  pthread_mutex_lock(&s->mu);
  if (s->bytes + cost > s->max_bytes)
    clear_all(s);
  if ((s->used + 1) * 2 > s->cap && !grow(s)) {
    pthread_mutex_unlock(&s->mu);
    return; /* not stored: only a cache */
  }
  slot *x = find_slot(s, key, n, h);
  if (x->key) { /* a fuller entry for the same language (an overflowed one recomputed) */
    s->bytes -= x->e->bytes;
    di_ci_entry_release(x->e);
  } else {
    uint32_t *copy = malloc(sizeof *key * (size_t)n);
    if (!copy) {
      pthread_mutex_unlock(&s->mu);
      return;
    }
    memcpy(copy, key, sizeof *key * (size_t)n);
    x->key = copy;
    x->n = n;
    x->hash = h;
    s->used++;
    s->bytes += sizeof *key * (size_t)n + sizeof(slot);
  }
  atomic_fetch_add(&e->refs, 1);
  x->e = e;
  s->bytes += e->bytes;
  pthread_mutex_unlock(&s->mu);
}

static class_slot *class_slot_of(class_slot *t, int cap, const uint32_t set[8]) {
  uint64_t h = 0x9E3779B97F4A7C15ULL;
  for (int i = 0; i < 8; i++)
    h = (h ^ set[i]) * 0x100000001B3ULL;
  for (uint32_t i = (uint32_t)(h ^ (h >> 31)) & (uint32_t)(cap - 1);; i = (i + 1) & (uint32_t)(cap - 1))
    if (!t[i].id || memcmp(t[i].set, set, sizeof t[i].set) == 0)
      return &t[i];
}

uint32_t di_ci_shared_class_id(di_ci_shared *s, const uint32_t set[8]) {
  pthread_mutex_lock(&s->mu);
  uint32_t id = 0;
  if (!s->ct) {
    s->ccap = 256;
    s->ct = calloc((size_t)s->ccap, sizeof *s->ct);
  }
  if (s->ct && (s->cused + 1) * 2 > s->ccap && s->cused < MAX_CLASS_IDS) { /* grow */
    class_slot *t = calloc((size_t)s->ccap * 2, sizeof *t);
    if (t) {
      for (int i = 0; i < s->ccap; i++)
        if (s->ct[i].id)
          *class_slot_of(t, s->ccap * 2, s->ct[i].set) = s->ct[i];
      free(s->ct);
      s->ct = t;
      s->ccap *= 2;
    }
  }
  if (s->ct) {
    class_slot *x = class_slot_of(s->ct, s->ccap, set);
    if (x->id) {
      id = x->id;
    } else if (s->cused < MAX_CLASS_IDS && (s->cused + 1) * 2 <= s->ccap) {
      memcpy(x->set, set, sizeof x->set);
      x->id = id = (uint32_t)++s->cused;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return id;
}

void di_ci_shared_stats(di_ci_shared *s, long *hits, long *lookups) {
  pthread_mutex_lock(&s->mu);
  *hits = s->hits;
  *lookups = s->lookups;
  pthread_mutex_unlock(&s->mu);
}
