/* ASCII runs (ascii_run.h): C(s) and n(s) for an automaton state, by a breadth-first search over
 * the states after 1, 2, ... bytes of C, one representative byte per byte class. A state already
 * seen at a lower level is not expanded again: whatever kills it d bytes later kills the search
 * at that lower level + d, which the search reaches first. */
#include "grammar/ascii_run.h"
#include <stdlib.h>
#include <string.h>
#include "util/grow.h"

enum { SLOTS = 4096, MAX_SEEN = 2048 };

void di_ascii_scratch_free(di_ascii_scratch *w) {
  free(w->key);
  free(w->at);
  free(w->cur);
  free(w->next);
  memset(w, 0, sizeof *w);
}

static int seen_insert(di_ascii_scratch *w, int s) {
  for (uint32_t h = ((uint32_t)s * 2654435761u) & (SLOTS - 1);; h = (h + 1) & (SLOTS - 1)) {
    if (w->at[h] != w->stamp) {
      w->at[h] = w->stamp;
      w->key[h] = s;
      return 1;
    }
    if (w->key[h] == s)
      return 0;
  }
}

static int push(int32_t **p, int *n, int *cap, int32_t x) {
  if (!di_grow((void **)p, cap, *n + 1, sizeof(int32_t), 64))
    return 0;
  (*p)[(*n)++] = x;
  return 1;
}

int di_ascii_run_compute(di_grt *rt, int s, di_ascii_scratch *w, di_ascii_run *r) {
  memset(r, 0, sizeof *r);
  if (!w->key || !w->at) { /* each made once: after a failed allocation, the other is kept, not made again */
    if (!w->key)
      w->key = malloc(sizeof(int32_t) * SLOTS);
    if (!w->at)
      w->at = calloc(SLOTS, sizeof(uint32_t));
    if (!w->key || !w->at)
      return 0; /* n = 0: nothing skipped, still correct */
  }
  /* C: per byte class, the ASCII bytes whose representative s takes twice */
  uint64_t members[256][2];
  int16_t rep_of[256];
  int ncls = 0;
  int16_t cls_list[128];
  for (int k = 0; k < 256; k++)
    rep_of[k] = -1;
  for (unsigned b = 1; b < 128; b++) {
    int k = rt->cls[b];
    if (rep_of[k] < 0) {
      rep_of[k] = (int16_t)b;
      members[k][0] = members[k][1] = 0;
      cls_list[ncls++] = (int16_t)k;
    }
    members[k][b >> 6] |= 1ull << (b & 63);
  }
  uint8_t reps[128];
  int nreps = 0;
  for (int i = 0; i < ncls; i++) {
    int k = cls_list[i];
    unsigned b = (unsigned)rep_of[k];
    int s1 = di_grt_step(rt, s, b);
    if (s1 == DI_GRT_ERROR)
      return -1;
    int s2 = s1 >= 0 ? di_grt_step(rt, s1, b) : DI_GRT_DEAD;
    if (s2 == DI_GRT_ERROR)
      return -1;
    if (s2 < 0)
      continue;
    reps[nreps++] = (uint8_t)b;
    r->set[0] |= members[k][0];
    r->set[1] |= members[k][1];
  }
  if (nreps == 0)
    return 0;
  if (++w->stamp == 0) {
    memset(w->at, 0, sizeof(uint32_t) * SLOTS);
    w->stamp = 1;
  }
  int ncur = 0, nnext = 0, nseen = 1, level = 0;
  seen_insert(w, s);
  if (!push(&w->cur, &ncur, &w->cap_cur, s))
    return 0;
  while (ncur > 0 && level < DI_ASCII_RUN_MAX) {
    nnext = 0;
    for (int i = 0; i < ncur; i++)
      for (int k = 0; k < nreps; k++) {
        int q = di_grt_step(rt, w->cur[i], reps[k]);
        if (q == DI_GRT_ERROR) {
          r->n = 0;
          return -1;
        }
        if (q < 0) {
          r->n = (int16_t)level; /* every run of `level` bytes lives, some run of level + 1 dies */
          return 0;
        }
        if (seen_insert(w, q)) {
          if (++nseen > MAX_SEEN || !push(&w->next, &nnext, &w->cap_next, q)) {
            r->n = (int16_t)level; /* too many states to follow: the levels so far are certain */
            return 0;
          }
        }
      }
    level++;
    int32_t *t = w->cur;
    w->cur = w->next;
    w->next = t;
    int tc = w->cap_cur;
    w->cap_cur = w->cap_next;
    w->cap_next = tc;
    ncur = nnext;
  }
  r->n = ncur == 0 ? DI_ASCII_RUN_MAX : (int16_t)level; /* no new state: no run ever dies */
  return 0;
}
