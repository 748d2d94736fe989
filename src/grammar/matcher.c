/* Token masks and per-request matchers. A mask for automaton state S (a set of stacks, each
 * topped by a byte-class position) is the union over its stacks. For each position we compute
 * once, by walking the vocabulary trie with the stack below replaced by an unknown (PSEUDO), which
 * tokens are accepted whatever the stack ("context-independent", the XGrammar idea), which are
 * rejected whatever it is, and which are uncertain (they run past the end of the rule); at run
 * time only the uncertain ones are walked from the real state. A state's stacks are classified
 * together as one key where that saves walks (group keys, get_group_ci), and a walk starts from
 * the vocabulary's rows of plain-text / letter-digit tokens its start state takes (compute_ci).
 * Whole masks are also cached per state, since states repeat (string bodies, object keys). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "grammar/ascii_run.h"
#include "grammar/ci_shared.h"
#include "grammar/count_chain.h"
#include "grammar/grammar_impl.h"
#include "grammar/language_key.h"
#include "grammar/plain_text.h"
#include "grammar/string_bound.h"
#include "grammar/token_ref.h"
#include "grammar/vocab.h"
#include "util/sort_i32.h"
#include "util/switches.h"

struct di_gvcache {
  uint64_t serial;
  const di_grammar_vocab *v;
  di_ci_entry **ci;   /* by truncated stack (node id, see di_grt_truncated_stack) */
  int32_t *chosen; /* by real stack node: the truncated stack whose entry it uses (0 = not yet) */
  int nci;
  int ci_depth, ci_max_uncertain; /* see get_ci */
  /* the walk of part_key abandoned at its bound of uncertain tokens (compute_ci), kept so that the
   * walk of the same stack with one frame more resumes it at node part_from instead of starting
   * over (part_key -1: none): its accepted tokens (bitmap, count) and uncertain ones so far */
  int part_key, part_from, part_nacc, part_nunc, part_cap;
  int part_group; /* part_key is a group key (a state id, get_group_ci), not a stack node */
  uint32_t *part_bits;
  int32_t *part_unc;
  size_t ci_bytes, ci_max_bytes;   /* memory held by the entries; all are dropped past the cap */
  /* group keys (get_group_ci): a state's stacks with one parent (a rule's alternatives) classified
   * as one key, the state of their truncations; and the trie walks' start from the plain rows */
  int group;
  di_ci_entry **gci; /* by state id: a group key's classification */
  int32_t *gchosen;  /* by state id of a real group: 1 + the group key it uses (0 = not yet) */
  int ngci;
  uint32_t **mask; /* by state id */
  int cap_mask, nmask, max_masks;
  uint8_t *asked; /* by state id: its mask was computed once (cached only when asked again) */
  int cap_asked;
  int32_t *st;     /* walk scratch: state per depth */
  int32_t **rows;  /* walk scratch: transition row per depth */
  uint8_t *pseen;  /* walk scratch: PSEUDO_END seen above this depth */
  uint32_t *bits;  /* scratch bitmap */
  int32_t *alist;  /* scratch: a walk's accepted ids while they are few (words + 1 slots) */
  int32_t *buf;
  int cap_buf;
  /* plain-text budgets (plain_text.h): per state, the plain characters it takes for certain (-1 =
   * not computed); per decoder state, one byte per (byte class, decoder behaviour) group */
  int16_t *budget;
  int cap_budget;
  int plain_ready;
  uint8_t plain_rep[DI_PLAIN_STATES][256];
  int8_t plain_next[DI_PLAIN_STATES][256];
  int plain_nrep[DI_PLAIN_STATES];
  di_ascii_run *arun; /* per state: its ASCII run (ascii_run.h), n = -1 until computed */
  int cap_arun;
  di_ascii_scratch ascratch;
  int derive;              /* derive positions of counted repetitions from one far from the end (count_chain.h) */
  uint8_t *x_plain;        /* per rule: 1 every plain character is one string of it, 2 not, 0 unknown */
  int share;               /* look classifications up in the vocabulary's shared store (ci_shared.h) */
  di_language_key lkey;    /* scratch: the description of the key being looked up */
  int32_t *seen_key; /* budget search: seen states (a hash set, valid where seen_at == seen_stamp) */
  uint32_t *seen_at, seen_stamp;
  struct di_gvcache *next;
};

struct di_grammar_matcher {
  di_grammar *g;
  const di_grammar_vocab *v;
  struct di_gvcache *vc;
  int32_t *hist; /* state after each accepted step; hist[0] = start */
  uint8_t *stop; /* step i accepted a stop token */
  uint32_t *hcs; /* the bounded strings' counter after each step (string_bound.h) */
  int nh, caph;
};

void di_gvcache_free_all(struct di_gvcache *c) {
  while (c) {
    struct di_gvcache *n = c->next;
    for (int i = 0; c->ci && i < c->nci; i++) /* c->ci is NULL when its calloc failed */
      di_ci_entry_release(c->ci[i]);
    for (int i = 0; c->mask && i < c->cap_mask; i++)
      free(c->mask[i]);
    for (int i = 0; c->gci && i < c->ngci; i++)
      di_ci_entry_release(c->gci[i]);
    free(c->gci);
    free(c->gchosen);
    free(c->ci);
    free(c->chosen);
    free(c->mask);
    free(c->asked);
    free(c->part_bits);
    free(c->part_unc);
    free(c->st);
    free(c->rows);
    free(c->pseen);
    free(c->bits);
    free(c->alist);
    free(c->buf);
    free(c->budget);
    free(c->arun);
    di_ascii_scratch_free(&c->ascratch);
    free(c->seen_key);
    free(c->seen_at);
    di_language_key_free(&c->lkey);
    free(c->x_plain);
    free(c);
    c = n;
  }
}

void di_gvcache_drop(di_grammar *g, uint64_t vocab_serial) {
  for (struct di_gvcache **pc = &g->vcaches; *pc;) {
    struct di_gvcache *c = *pc;
    if (c->serial != vocab_serial) {
      pc = &c->next;
      continue;
    }
    *pc = c->next;
    c->next = NULL;
    di_gvcache_free_all(c);
  }
}

/* Under g->mu. */
static di_status ensure_rt(di_grammar *g) {
  if (g->rt_ready)
    return DI_OK;
  DI_TRY(di_grt_init(&g->rt, &g->core));
  g->rt_ready = 1;
  return DI_OK;
}

static struct di_gvcache *get_vcache(di_grammar *g, const di_grammar_vocab *v) {
  for (struct di_gvcache *c = g->vcaches; c; c = c->next)
    if (c->serial == v->serial)
      return c;
  struct di_gvcache *c = calloc(1, sizeof *c);
  if (!c)
    return NULL;
  c->serial = v->serial;
  c->v = v;
  c->nci = 1024; /* by stack node id: sized as the automaton's node table (gram_rt.c) */
  while (c->nci < 4 * g->core.n_flat && c->nci < (1 << 20))
    c->nci *= 2;
  c->ci = calloc((size_t)c->nci, sizeof *c->ci);
  c->chosen = calloc((size_t)c->nci, sizeof *c->chosen);
  c->ci_depth = 12;
  c->ci_max_uncertain = 256;
  c->part_key = -1;
  c->ci_max_bytes = (size_t)128 << 20;
  const int depth = di_switch_int(DI_SW_GRAMMAR_CI_DEPTH, 0);
  if (depth > 0)
    c->ci_depth = depth;
  const int uncertain = di_switch_int(DI_SW_GRAMMAR_CI_UNCERTAIN, -1);
  if (uncertain >= 0)
    c->ci_max_uncertain = uncertain;
  c->share = v->shared_ci && di_switch_int(DI_SW_GRAMMAR_SHARED_CI, 1) != 0;
  c->derive = di_switch_int(DI_SW_GRAMMAR_COUNT_CI, 1) != 0;
  c->group = di_switch_int(DI_SW_GRAMMAR_GROUP_CI, 1) != 0;
  c->lkey.given_minlen = g->minlen; /* the rule lengths made at compile (NULL: computed when first needed) */
  /* max_tokens: acceptance depends on the token boundary too, which compute_mask tests itself (it
   * walks every token where the boundary can drop a stack); a classification is of the bytes alone
   * (the copies of a bounded lexeme take the bytes of the rule), so the shared store serves such
   * grammars as any other. The count-chain derivation stays off for them. */
  if (g->rt.tok_map)
    c->derive = 0;
  c->st = malloc(sizeof(int32_t) * ((size_t)v->maxlen + 2));
  c->pseen = malloc((size_t)v->maxlen + 2);
  c->rows = malloc(sizeof(int32_t *) * ((size_t)v->maxlen + 2));
  c->bits = calloc((size_t)v->words + 1, sizeof(uint32_t));
  c->alist = malloc(sizeof(int32_t) * ((size_t)v->words + 1)); /* NULL: the bitmap is scanned instead */
  size_t per = (size_t)v->words * 4 + 64;
  c->max_masks = (int)((size_t)(32 << 20) / per);
  if (c->max_masks < 64)
    c->max_masks = 64;
  if (!c->ci || !c->chosen || !c->st || !c->rows || !c->pseen || !c->bits) {
    di_gvcache_free_all(c);
    return NULL;
  }
  c->next = g->vcaches;
  g->vcaches = c;
  return c;
}

static int buf_append(int32_t **p, int *n, int *cap, int32_t x) {
  if (*n == *cap) {
    int nc = *cap ? *cap * 2 : 256;
    int32_t *q = realloc(*p, sizeof(int32_t) * (size_t)nc);
    if (!q)
      return 0;
    *p = q;
    *cap = nc;
  }
  (*p)[(*n)++] = x;
  return 1;
}

/* Byte groups for the budget search: bytes alike for the automaton (one byte class) and for the
 * plain-text decoder from every state are represented by one of them. */
static void plain_groups(di_grt *rt, struct di_gvcache *c) {
  int8_t beh[256][DI_PLAIN_STATES];
  for (int b = 0; b < 256; b++)
    for (int u = 0; u < DI_PLAIN_STATES; u++) {
      int starts;
      beh[b][u] = (int8_t)di_plain_step(u, (unsigned)b, &starts);
    }
  uint8_t reps[256];
  int nreps = 0;
  for (int b = 0; b < 256; b++) {
    int k = 0;
    while (k < nreps && !(rt->cls[reps[k]] == rt->cls[b] && memcmp(beh[reps[k]], beh[b], sizeof beh[b]) == 0))
      k++;
    if (k == nreps)
      reps[nreps++] = (uint8_t)b;
  }
  for (int u = 0; u < DI_PLAIN_STATES; u++) {
    c->plain_nrep[u] = 0;
    for (int k = 0; k < nreps; k++)
      if (beh[reps[k]][u] >= 0) {
        c->plain_rep[u][c->plain_nrep[u]] = reps[k];
        c->plain_next[u][c->plain_nrep[u]++] = beh[reps[k]][u];
      }
  }
  c->plain_ready = 1;
}

/* Finishes the character begun at decoder state u (> 0) from state s; 0 when some plain
 * continuation kills the automaton, else 1 with the states at the next boundary appended. */
static int plain_finish_char(di_grt *rt, struct di_gvcache *c, int s, int u, int32_t **next, int *nn, int *cap) {
  for (int k = 0; k < c->plain_nrep[u]; k++) {
    int s2 = di_grt_step(rt, s, c->plain_rep[u][k]);
    if (s2 < 0)
      return 0;
    int u2 = c->plain_next[u][k];
    if (u2 == 0 ? !buf_append(next, nn, cap, s2) : !plain_finish_char(rt, c, s2, u2, next, nn, cap))
      return 0;
  }
  return 1;
}

/* Adds state s to the budget search's seen set (open addressing, cleared by a new stamp); 0 when
 * it was there already. */
static int seen_insert(struct di_gvcache *c, int s) {
  enum { SLOTS = 8192 }; /* twice the search's MAX_SEEN */
  if (!c->seen_key) {
    c->seen_key = malloc(sizeof(int32_t) * SLOTS);
    c->seen_at = calloc(SLOTS, sizeof(uint32_t));
    if (!c->seen_key || !c->seen_at) { /* treated as seen: the search ends early, which is safe */
      free(c->seen_key);
      free(c->seen_at);
      c->seen_key = NULL;
      c->seen_at = NULL;
      return 0;
    }
  }
  for (uint32_t h = ((uint32_t)s * 2654435761u) & (SLOTS - 1);; h = (h + 1) & (SLOTS - 1)) {
    if (c->seen_at[h] != c->seen_stamp) {
      c->seen_at[h] = c->seen_stamp;
      c->seen_key[h] = s;
      return 1;
    }
    if (c->seen_key[h] == s)
      return 0;
  }
}

static int count_frame(const di_grt *rt, const di_count_chains *ch, int key, int max_depth, int *rule);

/* The state whose mask equals S's with fewer distinct states: every stack of S inside a counted
 * repetition with at least the longest token's bytes left (count frame O_j, j > longest token;
 * count_chain.h) moved to O_longest, which no token can tell apart. S itself when none is. It
 * takes no more than S (a subset of S's x's), so its plain-text budget is one for S too. Under
 * g->mu. */
static int mask_state(di_grammar *g, struct di_gvcache *c, int S) {
  di_grt *rt = &g->rt;
  if (!c->derive)
    return S;
  const di_count_chains *ch = &g->chains; /* made at compile (grammar.c) */
  const int maxlen = c->v->maxlen, n = rt->soff[S + 1] - rt->soff[S];
  if (ch->n_frames == 0 || n > 64)
    return S;
  int32_t nodes[64];
  int moved = 0;
  for (int k = 0; k < n; k++) {
    int id = rt->sn[rt->soff[S] + k], r, d = count_frame(rt, ch, id, 64, &r);
    nodes[k] = id;
    if (d < 0 || ch->index[r] <= maxlen)
      continue;
    int s = di_count_chain_descend(&g->chains, r, maxlen);
    int fp = di_count_chain_frame_pos(&g->core, ch, s);
    int id2 = fp >= 0 ? di_grt_replace_frame(rt, id, d, fp) : -1;
    if (id2 >= 0 && id2 != id) {
      nodes[k] = id2;
      moved = 1;
    }
  }
  if (!moved)
    return S;
  int S2 = di_grt_state_of(rt, nodes, n, rt->sflags[S]);
  if (S2 < 0)
    return S;
  return S2;
}

/* Whether the character begun at decoder state u (> 0) from state s is completed by every plain
 * continuation with the rule below ended (PSEUDO_END) after it; u = 0: every plain character. */
static int plain_chars_end_rule(di_grt *rt, struct di_gvcache *c, int s, int u) {
  for (int k = 0; k < c->plain_nrep[u]; k++) {
    int s2 = di_grt_step(rt, s, c->plain_rep[u][k]);
    if (s2 < 0)
      return 0;
    int u2 = c->plain_next[u][k];
    if (u2 == 0 ? !(di_grt_flags(rt, s2) & DI_GRT_PSEUDO_END) : !plain_chars_end_rule(rt, c, s2, u2))
      return 0;
  }
  return 1;
}

/* A lower bound on the plain characters state S takes for certain from its counted repetitions
 * alone (count_chain.h), without a search: a stack at the start of x under count frame O_j, with
 * every start of x there (S holds the whole state "x begins under O_j"), takes any j plain
 * characters when each plain character is a string of x (checked once per x on x alone). 0 when
 * none applies. Under g->mu. */
static int chain_plain_bound(di_grammar *g, struct di_gvcache *c, int S) {
  di_grt *rt = &g->rt;
  const di_gb *gb = &g->core;
  if (!c->derive || g->chains.n_frames == 0)
    return 0;
  if (!c->x_plain && !(c->x_plain = calloc((size_t)gb->n_rules + 1, 1)))
    return 0;
  if (!c->plain_ready)
    plain_groups(rt, c);
  int best = 0;
  for (int k = rt->soff[S]; k < rt->soff[S + 1]; k++) {
    int id = rt->sn[k], r, d = count_frame(rt, &g->chains, id, 64, &r), F = id;
    if (d < 1 || g->chains.index[r] <= best)
      continue;
    for (int q = 0; q < d; q++)
      F = rt->npar[F];
    const int fp = rt->npos[F];
    if (gb->flat[fp - 1].kind != DI_GE_RULE)
      continue;
    const int x = gb->flat[fp - 1].arg;
    if (!c->x_plain[x]) {
      int X = di_grt_rule_state(rt, x, DI_GRT_PSEUDO);
      c->x_plain[x] = X >= 0 && plain_chars_end_rule(rt, c, X, 0) ? 1 : 2;
    }
    if (c->x_plain[x] != 1)
      continue;
    int T = di_grt_rule_state(rt, x, F);
    if (T < 0)
      continue;
    /* T's stacks within S's (both sorted) */
    int a = rt->soff[T], ae = rt->soff[T + 1], b = rt->soff[S], be = rt->soff[S + 1];
    while (a < ae && b < be) {
      if (rt->sn[a] == rt->sn[b])
        a++;
      b++;
    }
    if (a == ae)
      best = g->chains.index[r];
  }
  return best > DI_PLAIN_CAP ? DI_PLAIN_CAP : best;
}

/* How many plain characters state s0 takes for certain (plain_text.h): breadth first over the
 * states at character boundaries, level L holding those after L characters; the first level where
 * some character kills the automaton is the answer. Stops (safely low) past a few thousand
 * states. Under g->mu. */
static int plain_budget(di_grammar *g, struct di_gvcache *c, int s0) {
  di_grt *rt = &g->rt;
  if (s0 < c->cap_budget && c->budget[s0] >= 0)
    return c->budget[s0];
  const int moved = mask_state(g, c, s0);
  int b0 = moved != s0 ? plain_budget(g, c, moved) /* far from a repetition's end: its search serves */
                       : chain_plain_bound(g, c, s0);
  if (b0 > 0) {
    if (s0 < c->cap_budget)
      c->budget[s0] = (int16_t)b0;
    return b0;
  }
  if (!c->plain_ready)
    plain_groups(rt, c);
  int32_t *cur = NULL, *next = NULL;
  int ncur = 0, capcur = 0, nnext = 0, capnext = 0, level = 0, seen_n = 0, ok = 1, min_known = DI_PLAIN_CAP;
  enum { MAX_SEEN = 4096 };
  int32_t *seen = malloc(sizeof(int32_t) * MAX_SEEN);
  int16_t *seen_level = malloc(sizeof(int16_t) * MAX_SEEN);
  if (!seen || !seen_level || !buf_append(&cur, &ncur, &capcur, s0))
    ok = 0;
  c->seen_stamp++;
  if (ok && seen_insert(c, s0)) {
    seen_level[seen_n] = 0;
    seen[seen_n++] = s0;
  }
  /* no subtree holds more plain characters than the vocabulary's most, so the search stops there
   * (a budget of that many is as good as any larger one) */
  const int cap = c->v->max_plain < DI_PLAIN_CAP ? c->v->max_plain : DI_PLAIN_CAP;
  while (ok && ncur > 0 && level < cap && level < min_known) { /* past min_known nothing can lower it */
    nnext = 0;
    for (int i = 0; i < ncur && ok; i++) {
      int s = cur[i];
      for (int k = 0; k < c->plain_nrep[0] && ok; k++) {
        int s2 = di_grt_step(rt, s, c->plain_rep[0][k]);
        int u2 = c->plain_next[0][k];
        if (s2 < 0)
          ok = 0;
        else if (u2 == 0)
          ok = buf_append(&next, &nnext, &capnext, s2);
        else
          ok = plain_finish_char(rt, c, s2, u2, &next, &nnext, &capnext);
      }
    }
    if (!ok)
      break;
    level++;
    ncur = 0; /* the next level: states not seen before */
    for (int i = 0; i < nnext; i++) {
      if (!seen_insert(c, next[i]))
        continue;
      /* a state whose budget is known (cached, or a counted repetition's bound) is not searched
       * further: strings through it live at least level + that many characters (not with
       * DI_GRAMMAR_COUNT_CI=0, which keeps the old search for A/B runs) */
      int t = next[i], known = !c->derive ? 0 : t < c->cap_budget && c->budget[t] >= 0 ? c->budget[t] : chain_plain_bound(g, c, t);
      if (rt->soff[t + 1] == rt->soff[t]) { /* no stack left (a rule ended at the unknown below): it
                                             * dies on any character, so s0 takes level, no more */
        if (level < min_known)
          min_known = level;
        continue;
      }
      if (known > 0) {
        if (level + known < min_known)
          min_known = level + known;
        continue;
      }
      if (seen_n == MAX_SEEN) { /* too many states to follow: the levels so far are certain */
        ncur = 0;
        break;
      }
      seen_level[seen_n] = (int16_t)level;
      seen[seen_n++] = next[i];
      if (!buf_append(&cur, &ncur, &capcur, next[i])) {
        ok = 0;
        break;
      }
    }
    if (seen_n == MAX_SEEN)
      break;
  }
  if (ok && ncur == 0 && seen_n < MAX_SEEN)
    level = DI_PLAIN_CAP; /* no character ever kills it (a search stopped at cap proves only cap) */
  if (level > min_known)
    level = min_known; /* the branches not searched live that long at least */
  free(cur);
  free(next);
  /* a state first reached after j characters takes at least level - j more (else s0 would die
   * sooner): a safe value for it too, which spares a search per state of a counted string */
  int max_state = s0;
  for (int i = 0; i < seen_n; i++)
    if (seen[i] > max_state)
      max_state = seen[i];
  if (max_state >= c->cap_budget) {
    int nc = c->cap_budget ? c->cap_budget : 1024;
    while (nc <= max_state)
      nc *= 2;
    int16_t *q = realloc(c->budget, sizeof *q * (size_t)nc);
    if (!q) {
      free(seen);
      free(seen_level);
      return level; /* not cached; still correct */
    }
    for (int i = c->cap_budget; i < nc; i++)
      q[i] = -1;
    c->budget = q;
    c->cap_budget = nc;
  }
  for (int i = 0; i < seen_n; i++) { /* 0 is no answer: such a state is searched when asked */
    int b = level == DI_PLAIN_CAP ? DI_PLAIN_CAP : level - seen_level[i];
    if (b > 0 && b > c->budget[seen[i]])
      c->budget[seen[i]] = (int16_t)b;
  }
  c->budget[s0] = (int16_t)level;
  free(seen);
  free(seen_level);
  return level;
}

/* State s's ASCII run (ascii_run.h), computed when first asked; NULL without memory for it. */
static const di_ascii_run *ascii_run_of(di_grammar *g, struct di_gvcache *c, int s) {
  if (s >= c->cap_arun) {
    int nc = c->cap_arun ? c->cap_arun : 1024;
    while (nc <= s)
      nc *= 2;
    di_ascii_run *q = realloc(c->arun, sizeof *q * (size_t)nc);
    if (!q)
      return NULL;
    for (int k = c->cap_arun; k < nc; k++)
      q[k].n = -1;
    c->arun = q;
    c->cap_arun = nc;
  }
  if (c->arun[s].n < 0 && di_ascii_run_compute(&g->rt, s, &c->ascratch, &c->arun[s]) != 0)
    c->arun[s].n = 0; /* past the automaton's budget: walk (the walk reports the error) */
  return &c->arun[s];
}

/* Whether every token below trie node i is accepted from state s by its ASCII run (ascii_run.h).
 * Inline: the walk asks at most nodes, and most fail the cheap tests. */
static inline int ascii_run_covers(di_grammar *g, struct di_gvcache *c, int s, int i) {
  const di_grammar_vocab *v = c->v;
  const di_tnode *t = &v->tn[i];
  if ((t->flags & DI_TNODE_NOT_ASCII) || t->len_below > DI_ASCII_RUN_MAX || v->tn[t->tnext].tok_lo - t->tok_lo < 8)
    return 0; /* not ASCII, too long, or too few tokens below to be worth a search */
  const di_ascii_run *r = ascii_run_of(g, c, s);
  return r && di_ascii_run_covers(r, v->ascii_below + 2 * (size_t)i, t->len_below);
}

/* plain_budget's answer for state s when it is cached, else -1 (inline for the walk's nodes). */
static inline int cached_budget(const struct di_gvcache *c, int s) {
  return s < c->cap_budget ? c->budget[s] : -1;
}

/* The name of the rule whose alternative holds flat position pos (for DI_GRAMMAR_DEBUG lines). */
static const char *position_rule_name(const di_gb *g, int pos) {
  for (int r = 0; r < g->n_rules; r++)
    for (int a = g->rule_first[r]; a < g->rule_first[r + 1]; a++) {
      int p = g->rule_alts[a];
      while (g->flat[p].kind != DI_GE_END)
        p++;
      if (pos >= g->rule_alts[a] && pos <= p)
        return g->rules[r].name;
    }
  return "?";
}

/* The classification of the tokens from truncated stack `key` (its top frames, the rest unknown):
 * accepted / rejected whatever lies below, or uncertain. With prune > 0 the subtrees whose tokens
 * all have at most prune bytes are left out (classified elsewhere: derive_ci).
 * With resume, c->part_* holds the abandoned walk of the same stack with one frame fewer (the
 * "upper" key), and this walk continues it: a token the upper key accepts is accepted whatever lies
 * below its frames, so by key too; one it rejects died within its frames, so key rejects it too;
 * its uncertain tokens are walked one by one from key's state; the trie before node part_from is
 * not walked again (only the ancestors of part_from are stepped, to reach its parent's state).
 * Exactly what a walk from the start gives. A walk (prune 0) abandoned at max_unc leaves its own
 * partial walk in c->part_* for the next frame's. With group, key is a group key: the state of several
 * truncated stacks (get_group_ci), walked as one; otherwise a truncated stack.
 *
 * The root's plain rows: when the start state takes any L plain characters for certain (its
 * plain-text budget, the test the walk makes at every node, made at the root), every token whose
 * whole text is plain with at most L characters is accepted: the vocabulary's row L (vocab.h
 * plain_le) is ORed at once, and subtrees holding only such tokens (wplain <= L) are not visited.
 * This is what a string body's key gains (80k tokens of 128k, set one by one otherwise). Under
 * g->mu. */
static di_status compute_ci(di_grammar *g, struct di_gvcache *c, int key, int group, int max_unc, int prune,
                            int resume, di_ci_entry **out) {
  const di_grammar_vocab *v = c->v;
  di_grt *rt = &g->rt;
  di_ci_entry *e = calloc(1, sizeof *e);
  if (!e)
    return di_error_set(DI_ERR_OOM, "out of memory");
  atomic_init(&e->refs, 1);
  struct timespec ts0, ts1;
  const int debug = di_switch_get(DI_SW_GRAMMAR_DEBUG) != 0; /* the thread clock is a system call: only then */
  if (debug)
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts0);
  int s0 = group ? key : di_grt_node_state(rt, key);
  if (group)
    atomic_fetch_add(&((di_grammar_vocab *)v)->n_group_walks, 1);
  if (s0 < 0) {
    free(e);
    return DI_ERR_OOM;
  }
  uint32_t *bits = c->bits; /* all zero on entry, left zero on exit */
  int cap_unc = 0, nacc = 0, from = 0;
  /* the accepted ids also listed while no more than a bitmap's words + 1 (and none came by a
   * subtree bitmap or from a resumed walk; -1 once one did), so a sparse entry needs no scan of
   * the bitmap: the list is valid exactly when nlist == nacc */
  const int W = v->words;
  int nlist = resume || !c->alist ? -1 : 0;
  /* per depth: the state, its transition row (NULL until allocated) and whether the rule end
   * was passed at or above it (tokens running further are uncertain) */
  int32_t *sts = c->st;
  int32_t **rows = c->rows;
  uint8_t *pse = c->pseen;
  di_status st = DI_OK;
  if (resume) { /* the upper key's verdicts, its uncertain tokens walked from s0 (in trie order) */
    atomic_fetch_add(&((di_grammar_vocab *)v)->n_resumed, 1);
    memcpy(bits, c->part_bits, sizeof(uint32_t) * (size_t)v->words);
    nacc = c->part_nacc;
    from = c->part_from;
    const uint8_t *prev = NULL;
    int valid = 0, prevlen = 0;
    sts[0] = s0;
    pse[0] = (di_grt_flags(rt, s0) & DI_GRT_PSEUDO_END) != 0;
    for (int k = 0; k < c->part_nunc && st == DI_OK; k++) {
      const int id = v->sorted[c->part_unc[k]];
      const uint8_t *t = v->bytes + v->off[id];
      const int len = (int)(v->off[id + 1] - v->off[id]);
      int l = 0;
      if (prev)
        while (l < len && l < prevlen && l < valid && t[l] == prev[l])
          l++;
      int d = l, s = sts[l];
      for (; d < len; d++) {
        s = di_grt_step(rt, sts[d], t[d]);
        if (s < 0)
          break;
        sts[d + 1] = s;
        pse[d + 1] = pse[d] | ((rt->sflags[s] & DI_GRT_PSEUDO_END) != 0);
      }
      if (s == DI_GRT_ERROR) {
        st = DI_ERR_OOM;
        break;
      }
      valid = d;
      prev = t;
      prevlen = len;
      if (d == len) {
        bits[id >> 5] |= 1u << (id & 31);
        nacc++;
      } else if (pse[d] && !buf_append(&e->unc, &e->nunc, &cap_unc, c->part_unc[k])) {
        st = di_error_set(DI_ERR_OOM, "out of memory");
      }
    }
    if (st == DI_OK && max_unc >= 0 && e->nunc > max_unc)
      e->overflow = 1; /* abandoned before walking on: resumed again from the same node */
  }
  int rows_at = 0, alnum_at = 0; /* the plain / letters-and-digits row ORed (0: none) */
  if (st == DI_OK && !e->overflow && c->group && v->plain_rows > 0) {
    int b = cached_budget(c, s0);
    if (b < 0)
      b = plain_budget(g, c, s0);
    rows_at = b < v->plain_rows ? b : v->plain_rows;
    if (rows_at > 0) {
      atomic_fetch_add(&((di_grammar_vocab *)v)->n_row_walks, 1);
      const uint32_t *row = v->plain_le + (size_t)rows_at * (size_t)W;
      for (int w = 0; w < W; w++)
        bits[w] |= row[w];
      nlist = -1;
    }
  }
  if (st == DI_OK && !e->overflow && c->group && rows_at == 0 && v->alnum_le) {
    /* the same from the start state's ASCII run (ascii_run.h) when it takes letters and digits: the
     * ids of at most n(s0) of them (the email format's parts, identifiers, hex) */
    const uint64_t alnum[2] = {0x03FF000000000000ull, 0x07FFFFFE07FFFFFEull};
    const di_ascii_run *r = ascii_run_of(g, c, s0);
    if (r && r->n > 0 && !(alnum[0] & ~r->set[0]) && !(alnum[1] & ~r->set[1])) {
      alnum_at = r->n < DI_ALNUM_ROWS ? r->n : DI_ALNUM_ROWS;
      atomic_fetch_add(&((di_grammar_vocab *)v)->n_row_walks, 1);
      const uint32_t *row = v->alnum_le + (size_t)alnum_at * (size_t)W;
      for (int w = 0; w < W; w++)
        bits[w] |= row[w];
      nlist = -1;
    }
  }
  sts[0] = s0;
  rows[0] = rt->trans[s0];
  pse[0] = (di_grt_flags(rt, s0) & DI_GRT_PSEUDO_END) != 0;
  long visited = 0;
  const int32_t *sorted = v->sorted;
  const uint8_t *cls = rt->cls;
  const di_tnode *tn = v->tn;
  long skipped = 0;
  const int lo_from = tn[from < v->nnodes ? from : v->nnodes].tok_lo; /* tokens before it: classified */
  for (int i = 0, n = st == DI_OK && !e->overflow ? v->nnodes : 0, next_i; i < n;) {
    const di_tnode *t = &tn[i];
    __builtin_prefetch(&tn[t->tnext]); /* where a rejected or accepted subtree jumps to */
    if (i < from && t->tnext <= from) { /* classified by the upper key's walk */
      i = t->tnext;
      continue;
    }
    if (prune > 0 && t->len_below < 255 && t->depth + t->len_below <= prune) {
      i = t->tnext;
      continue;
    }
    if ((rows_at > 0 && (t->flags >> DI_TNODE_WPLAIN_SHIFT) <= rows_at) ||
        (alnum_at > 0 && v->walnum[i] <= alnum_at)) { /* all accepted by the row */
      skipped += t->tnext - i;
      i = t->tnext;
      continue;
    }
    visited++;
    int d = t->depth;
    const int32_t *row = rows[d - 1];
    int s = row ? row[cls[t->byte]] : DI_GRT_UNKNOWN;
    if (s == DI_GRT_UNKNOWN) {
      s = di_grt_step_slow(rt, sts[d - 1], t->byte);
      rows[d - 1] = rt->trans[sts[d - 1]];
    }
    if (s < 0) {
      if (s == DI_GRT_ERROR) {
        st = DI_ERR_OOM;
        break;
      }
      if (pse[d - 1]) {
        for (int k = i < from ? lo_from : t->tok_lo, hi = tn[t->tnext].tok_lo; k < hi; k++)
          if (!buf_append(&e->unc, &e->nunc, &cap_unc, k)) {
            st = di_error_set(DI_ERR_OOM, "out of memory");
            break;
          }
        if (st != DI_OK)
          break;
        if (max_unc >= 0 && e->nunc > max_unc) { /* too uncertain: the caller keeps more frames */
          e->overflow = 1;
          from = t->tnext; /* where a walk with one frame more resumes */
          break;
        }
      }
      i = t->tnext;
      continue;
    }
    sts[d] = s;
    rows[d] = rt->trans[s];
    pse[d] = pse[d - 1] | ((rt->sflags[s] & DI_GRT_PSEUDO_END) != 0);
    if (i < from) { /* an ancestor of node from: its own tokens are classified, descend */
      i++;
      continue;
    }
    int below = t->plain, ke = tn[i + 1].tok_lo, known;
    if (t->tnext > i + 1 &&
        ((below != DI_PLAIN_NOT && below <= ((known = cached_budget(c, s)) >= 0 ? known : plain_budget(g, c, s))) ||
         ascii_run_covers(g, c, s, i))) {
      ke = tn[t->tnext].tok_lo; /* every token below is plain text the state takes: all accepted */
      skipped += t->tnext - i - 1;
      next_i = t->tnext;
      if (t->subtree >= 0) { /* a large subtree: its ids' bitmap, word by word */
        const uint32_t *sb = v->subtree_bits + (size_t)t->subtree * (size_t)v->words;
        for (int w = 0; w < v->words; w++)
          bits[w] |= sb[w];
        nacc += ke - t->tok_lo;
        nlist = -1;
        i = next_i;
        continue;
      }
    } else {
      next_i = i + 1;
    }
    for (int k = t->tok_lo; k < ke; k++) {
      int id = sorted[k];
      bits[id >> 5] |= 1u << (id & 31);
      nacc++;
      if (nlist >= 0)
        nlist = nlist <= W ? (c->alist[nlist] = id, nlist + 1) : -1;
    }
    i = next_i;
  }
  if (rows_at > 0 || alnum_at > 0 || resume) { /* tokens may have been set twice (a row, a resumed walk): count the bits */
    nacc = 0;
    for (int w = 0; w < W; w++)
      nacc += __builtin_popcount(bits[w]);
  }
  /* store accepted tokens densely or as a list, whichever is smaller; clear the scratch */
  if (st == DI_OK && !e->overflow) {
    e->nacc = nacc;
    if (nacc > v->words) {
      e->acc_bits = malloc(sizeof(uint32_t) * (size_t)v->words);
      if (e->acc_bits)
        memcpy(e->acc_bits, bits, sizeof(uint32_t) * (size_t)v->words);
      else
        st = di_error_set(DI_ERR_OOM, "out of memory");
    } else if (nacc > 0) {
      e->acc_list = malloc(sizeof(int32_t) * (size_t)nacc);
      if (!e->acc_list)
        st = di_error_set(DI_ERR_OOM, "out of memory");
      else if (nlist == nacc)
        memcpy(e->acc_list, c->alist, sizeof(int32_t) * (size_t)nacc);
      int n = 0;
      for (int w = 0; w < v->words && e->acc_list && nlist != nacc; w++)
        for (uint32_t x = bits[w]; x; x &= x - 1)
          e->acc_list[n++] = w * 32 + __builtin_ctz(x);
    }
  }
  if (st == DI_OK && e->overflow && prune == 0) { /* kept for the walk with one frame more */
    if (!c->part_bits)
      c->part_bits = malloc(sizeof(uint32_t) * (size_t)v->words);
    c->part_key = -1;
    if (c->part_bits) {
      memcpy(c->part_bits, bits, sizeof(uint32_t) * (size_t)v->words);
      free(c->part_unc);
      c->part_unc = e->unc; /* taken over: an abandoned entry keeps no lists */
      c->part_nunc = e->nunc;
      c->part_nacc = nacc;
      c->part_from = from;
      c->part_key = key;
      c->part_group = group;
      e->unc = NULL;
      e->nunc = 0;
    }
  }
  if (nlist == nacc) /* only the listed ids' words are set */
    for (int k = 0; k < nlist; k++)
      bits[c->alist[k] >> 5] = 0;
  else
    memset(bits, 0, sizeof(uint32_t) * (size_t)v->words);
  if (debug) {
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts1);
    const int top = group ? rt->sn[rt->soff[key]] : key;
    fprintf(stderr, "ci %s %d (%d stacks, pos %d, rule %s, plain row %d): accepted %d uncertain %d%s states %d skipped %ld visited %ld of %d%s us %.0f\n",
            group ? "group key" : "key", key, group ? rt->soff[key + 1] - rt->soff[key] : 1, rt->npos[top],
            position_rule_name(&g->core, rt->npos[top]), rows_at, nacc, e->overflow ? c->part_nunc : e->nunc,
            e->overflow ? " (abandoned)" : "", rt->ns, skipped, visited, v->nnodes,
            prune > 0 ? " (longer tokens only)" : resume ? " (resumed: upper key's uncertain walked again)" : "",
            (double)(ts1.tv_sec - ts0.tv_sec) * 1e6 + (double)(ts1.tv_nsec - ts0.tv_nsec) / 1e3);
  }
  if (st != DI_OK) {
    di_ci_entry_release(e);
    return st;
  }
  e->bytes = sizeof *e + sizeof(int32_t) * (size_t)e->nunc +
             (e->acc_bits ? sizeof(uint32_t) * (size_t)v->words : sizeof(int32_t) * (size_t)e->nacc);
  *out = e;
  return DI_OK;
}

static int ensure_ci_slots(struct di_gvcache *c, int id) {
  if (id < c->nci)
    return 1;
  int nc = c->nci * 2;
  while (nc <= id)
    nc *= 2;
  di_ci_entry **q = realloc(c->ci, sizeof *q * (size_t)nc);
  if (q)
    c->ci = q;
  int32_t *r = realloc(c->chosen, sizeof *r * (size_t)nc);
  if (r)
    c->chosen = r;
  if (!q || !r)
    return 0;
  memset(c->ci + c->nci, 0, sizeof *q * (size_t)(nc - c->nci));
  memset(c->chosen + c->nci, 0, sizeof *r * (size_t)(nc - c->nci));
  c->nci = nc;
  return 1;
}

static di_status classify(di_grammar *g, struct di_gvcache *c, int key, int last);

/* The topmost count frame (count_chain.h) of truncated stack `key`: its depth below the top, and
 * its rule in *rule; -1 when it has none. */
static int count_frame(const di_grt *rt, const di_count_chains *ch, int key, int max_depth, int *rule) {
  int d = 0;
  for (int n = key; n > DI_GRT_PSEUDO && d < max_depth; n = rt->npar[n], d++)
    if (ch->frame_rule[rt->npos[n]] >= 0) {
      *rule = ch->frame_rule[rt->npos[n]];
      return d;
    }
  return -1;
}

/* A position of a counted repetition, at most j more x's (count_chain.h), agrees on every token of
 * at most j bytes with the same stack at O_S, S = min(the chain's top, longest token) > j: the
 * source. Sets *src to that stack and *T to j (INT_MAX-like 1 << 30 when j reaches the longest
 * token: then every token agrees and the source's entry serves as it is). 0: no source. */
static int count_source(di_grammar *g, struct di_gvcache *c, int key, int *src, int *T) {
  di_grt *rt = &g->rt;
  const di_count_chains *ch = &g->chains;
  int r, d = count_frame(rt, ch, key, 64, &r);
  if (d < 0)
    return 0;
  const int j = ch->index[r], maxlen = c->v->maxlen;
  int s = r;
  if (j > maxlen) {
    s = di_count_chain_descend(&g->chains, r, maxlen);
  } else {
    while (ch->index[s] < maxlen && ch->up[s] >= 0)
      s = ch->up[s];
  }
  if (s == r || (j < maxlen && j > c->v->len_le_max))
    return 0;
  int fp = di_count_chain_frame_pos(&g->core, ch, s);
  if (fp < 0)
    return 0;
  *src = di_grt_replace_frame(rt, key, d, fp);
  *T = j >= maxlen ? 1 << 30 : j;
  return *src >= 0 ? 1 : -1;
}

/* An entry from the accepted bitmap `bits` (words words) and the sorted uncertain list unc[0..nunc)
 * (taken over). */
static di_status entry_from(const di_grammar_vocab *v, uint32_t *bits, int32_t *unc, int nunc, di_ci_entry **out) {
  di_ci_entry *e = calloc(1, sizeof *e);
  if (!e) {
    free(unc);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  atomic_init(&e->refs, 1);
  e->unc = unc;
  e->nunc = nunc;
  const size_t nw = v->words > 0 ? (size_t)v->words : 0;
  int nacc = 0;
  for (size_t w = 0; w < nw; w++)
    nacc += __builtin_popcount(bits[w]);
  e->nacc = nacc;
  if ((size_t)nacc > nw) {
    e->acc_bits = malloc(sizeof(uint32_t) * nw);
    if (e->acc_bits)
      memcpy(e->acc_bits, bits, sizeof(uint32_t) * nw);
  } else if (nacc > 0 && (e->acc_list = malloc(sizeof(int32_t) * (size_t)nacc))) {
    int n = 0;
    for (size_t w = 0; w < nw; w++)
      for (uint32_t x = bits[w]; x; x &= x - 1)
        e->acc_list[n++] = (int32_t)w * 32 + __builtin_ctz(x);
  }
  if (nacc > 0 && !e->acc_bits && !e->acc_list) {
    di_ci_entry_release(e);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  e->bytes = sizeof *e + sizeof(int32_t) * (size_t)e->nunc +
             (e->acc_bits ? sizeof(uint32_t) * nw : sizeof(int32_t) * (size_t)e->nacc);
  *out = e;
  return DI_OK;
}

static di_status overflow_entry(di_ci_entry **out) {
  di_ci_entry *e = calloc(1, sizeof *e);
  if (!e)
    return di_error_set(DI_ERR_OOM, "out of memory");
  atomic_init(&e->refs, 1);
  e->overflow = 1;
  e->bytes = sizeof *e;
  *out = e;
  return DI_OK;
}

/* The classification of `key` from its source's (count_source): tokens of at most T bytes as the
 * source classified them, the longer ones by a walk that visits only them. Exactly what a walk
 * of `key` gives; an entry abandoned at the bound when the source was (the caller keeps more
 * frames, as for a walk that overflows). Under g->mu. */
static di_status derive_ci(di_grammar *g, struct di_gvcache *c, int key, const di_ci_entry *src, int T, int max_unc,
                           di_ci_entry **out) {
  const di_grammar_vocab *v = c->v;
  if (src->overflow) /* the caller will keep more frames, as after a walk that overflows */
    return overflow_entry(out);
  di_ci_entry *w = NULL;
  DI_TRY(compute_ci(g, c, key, 0, max_unc, T, 0, &w));
  if (w->overflow) {
    *out = w;
    return DI_OK;
  }
  const uint32_t *le = v->len_le + (size_t)T * (size_t)v->words;
  uint32_t *bits = c->bits; /* all zero on entry (compute_ci leaves it so), cleared below */
  if (w->acc_bits)
    memcpy(bits, w->acc_bits, sizeof(uint32_t) * (size_t)v->words);
  else
    for (int i = 0; i < w->nacc; i++)
      bits[w->acc_list[i] >> 5] |= 1u << (w->acc_list[i] & 31);
  if (src->acc_bits) {
    for (int k = 0; k < v->words; k++)
      bits[k] |= src->acc_bits[k] & le[k];
  } else {
    for (int i = 0; i < src->nacc; i++) {
      int id = src->acc_list[i];
      if ((le[id >> 5] >> (id & 31)) & 1u)
        bits[id >> 5] |= 1u << (id & 31);
    }
  }
  /* uncertain: the walk's and the source's short ones, both in trie order, merged */
  int32_t *unc = NULL;
  int nunc = 0, cap = 0, i = 0, k = 0, ok = 1;
  while (ok && (i < w->nunc || k < src->nunc)) {
    if (k < src->nunc) {
      int id = v->sorted[src->unc[k]];
      if (!((le[id >> 5] >> (id & 31)) & 1u)) { /* a longer token: the walk's answer holds */
        k++;
        continue;
      }
    }
    int x;
    if (k >= src->nunc)
      x = w->unc[i++];
    else if (i >= w->nunc || src->unc[k] < w->unc[i])
      x = src->unc[k++];
    else if (w->unc[i] < src->unc[k])
      x = w->unc[i++];
    else { /* visited by both: they agree */
      x = w->unc[i++];
      k++;
    }
    ok = buf_append(&unc, &nunc, &cap, x);
  }
  di_ci_entry_release(w);
  di_status st;
  if (!ok) {
    free(unc);
    st = di_error_set(DI_ERR_OOM, "out of memory");
  } else if (max_unc >= 0 && nunc > max_unc) { /* as a walk would be: abandoned */
    free(unc);
    st = overflow_entry(out);
  } else {
    st = entry_from(v, bits, unc, nunc, out);
  }
  memset(bits, 0, sizeof(uint32_t) * (size_t)v->words);
  return st;
}

/* Fills c->ci[key]: from the vocabulary's shared store when another grammar (or an earlier compile)
 * classified the same language, else derived from its source when key is a position near the end
 * of a counted repetition (count_source), else by a walk (resuming the abandoned walk of the
 * stack with one frame fewer when that was the last one abandoned); then offered to the store. An entry
 * abandoned at its bound of uncertain tokens does not serve a caller that needs it in full. Under
 * g->mu. */
static di_status classify(di_grammar *g, struct di_gvcache *c, int key, int last) {
  enum { MAX_KEY_WORDS = 1 << 16 }; /* larger descriptions (most of a big grammar) are not shared */
  const int max_unc = last ? -1 : c->ci_max_uncertain;
  di_ci_entry *src = NULL;
  int T = 0, src_key = -1;
  if (c->derive && g->chains.n_frames > 0) {
    int r, d = count_frame(&g->rt, &g->chains, key, 64, &r), frame = key;
    for (int k = 0; k < d; k++)
      frame = g->rt.npar[frame];
    if (d >= 0 && !last && g->rt.npar[frame] == DI_GRT_PSEUDO) {
      /* nothing known below the repetition: every token that runs past its end is uncertain (a
       * string's closing quote and what follows), nearly always more than the bound, so the
       * caller keeps more frames at once instead of walking to find out (any depth gives the
       * same masks) */
      DI_TRY(overflow_entry(&c->ci[key]));
      c->ci_bytes += c->ci[key]->bytes;
      return DI_OK;
    }
    int found = count_source(g, c, key, &src_key, &T);
    if (found < 0)
      return DI_ERR_OOM;
    if (found) { /* the source first (its own lookup uses the description scratch) */
      if (!ensure_ci_slots(c, src_key))
        return di_error_set(DI_ERR_OOM, "out of memory");
      if (c->ci[src_key] && c->ci[src_key]->overflow && last) {
        c->ci_bytes -= c->ci[src_key]->bytes;
        di_ci_entry_release(c->ci[src_key]);
        c->ci[src_key] = NULL;
      }
      if (!c->ci[src_key])
        DI_TRY(classify(g, c, src_key, last));
      src = c->ci[src_key];
      if (T >= (1 << 30) && !(src->overflow && last)) { /* every token agrees: the same entry */
        atomic_fetch_add(&src->refs, 1);
        atomic_fetch_add(&((di_grammar_vocab *)c->v)->n_count_same, 1);
        c->ci[key] = src;
        c->ci_bytes += src->bytes;
        return DI_OK;
      }
    }
  }
  int described =
      c->share && di_language_key_make(&c->lkey, &g->rt, c->v->shared_ci, key, c->v->maxlen, MAX_KEY_WORDS);
  if (described) {
    di_ci_entry *e = di_ci_shared_find(c->v->shared_ci, c->lkey.w, c->lkey.n, c->lkey.hash);
    if (e && !(e->overflow && last)) {
      c->ci[key] = e;
      c->ci_bytes += e->bytes;
      return DI_OK;
    }
    di_ci_entry_release(e);
  }
  if (src && T < (1 << 30)) {
    struct timespec t0, t1;
    const int debug = di_switch_get(DI_SW_GRAMMAR_DEBUG) != 0;
    if (debug)
      clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    DI_TRY(derive_ci(g, c, key, src, T, max_unc, &c->ci[key]));
    atomic_fetch_add(&((di_grammar_vocab *)c->v)->n_count_derived, 1);
    if (debug && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1) == 0)
      fprintf(stderr, "ci key %d derived from key %d (tokens of at most %d bytes): accepted %d uncertain %d%s us %.0f\n", key,
              src_key, T, c->ci[key]->nacc, c->ci[key]->nunc, c->ci[key]->overflow ? " (abandoned)" : "",
              (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3);
  } else {
    /* resumed when the walk of the same stack with one frame fewer was the last one abandoned
     * (get_ci's next depth, or the next depth's count source) */
    int frames = 0;
    for (int n = key; n > DI_GRT_PSEUDO; n = g->rt.npar[n])
      frames++;
    const int resume =
        c->part_key >= 0 && !c->part_group && frames > 1 && di_grt_truncated_stack(&g->rt, key, frames - 1) == c->part_key;
    DI_TRY(compute_ci(g, c, key, 0, max_unc, 0, resume, &c->ci[key]));
  }
  c->ci_bytes += c->ci[key]->bytes;
  if (described)
    di_ci_shared_put(c->v->shared_ci, c->lkey.w, c->lkey.n, c->lkey.hash, c->ci[key]);
  return DI_OK;
}

/* The classification used for real stack `id`. Keeping fewer stack frames lets more stacks share
 * one entry (and its trie walk), but leaves more tokens uncertain, to be walked at every mask: so
 * the shallowest truncation with at most ci_max_uncertain uncertain tokens is chosen, trying 1, 2,
 * ... frames (at most ci_depth; a stack that is not deeper is exact and has none uncertain). */
/* Bounds the memory the entries hold: past the cap, all are dropped (they are only caches). */
static void bound_entries(struct di_gvcache *c) {
  if (c->ci_bytes <= c->ci_max_bytes)
    return;
  for (int i = 0; i < c->nci; i++) {
    di_ci_entry_release(c->ci[i]);
    c->ci[i] = NULL;
  }
  memset(c->chosen, 0, sizeof *c->chosen * (size_t)c->nci);
  for (int i = 0; i < c->ngci; i++) {
    di_ci_entry_release(c->gci[i]);
    c->gci[i] = NULL;
  }
  if (c->gchosen)
    memset(c->gchosen, 0, sizeof *c->gchosen * (size_t)c->ngci);
  c->ci_bytes = 0;
}

static di_status get_ci(di_grammar *g, struct di_gvcache *c, int id, di_ci_entry **out) {
  di_grt *rt = &g->rt;
  bound_entries(c);
  if (!ensure_ci_slots(c, id))
    return di_error_set(DI_ERR_OOM, "out of memory");
  if (c->chosen[id]) {
    *out = c->ci[c->chosen[id]];
    return DI_OK;
  }
  for (int depth = 1;; depth++) {
    int key = di_grt_truncated_stack(rt, id, depth);
    if (key < 0)
      return DI_ERR_OOM;
    if (!ensure_ci_slots(c, key) || !ensure_ci_slots(c, id))
      return di_error_set(DI_ERR_OOM, "out of memory");
    int last = key == id || depth >= c->ci_depth;
    if (c->ci[key] && c->ci[key]->overflow && last) { /* abandoned earlier, needed in full now */
      di_ci_entry_release(c->ci[key]);
      c->ci[key] = NULL;
    }
    if (!c->ci[key])
      DI_TRY(classify(g, c, key, last));
    if (last || (!c->ci[key]->overflow && c->ci[key]->nunc <= c->ci_max_uncertain)) {
      c->chosen[id] = key;
      *out = c->ci[key];
      return DI_OK;
    }
  }
}

/* Group keys. A state's stacks (the alternatives of the rules it is inside: a string character's 9
 * forms and the closing quote, a free key's trie bytes, its class and the escapes' alternatives
 * nested in another) are classified as one key: the state of their truncations, walked once. A
 * token the group accepts is accepted by one of its stacks within their frames, one it rejects
 * dies in all of them, the rest are uncertain and walked from the real state at every mask: exactly
 * what one walk per stack gives, for any set of stacks and any truncation of each, since the mask
 * is the union over the stacks. It pays because the group's start state takes any plain text where
 * no single alternative does, so the walk starts from the plain rows (compute_ci) instead of setting
 * a string body's 80k tokens one by one, and visits the trie once. Keys are chosen as for one stack
 * (get_ci: the fewest frames with at most ci_max_uncertain uncertain tokens, every member keeping
 * that many), looked up in the shared store by their description (di_language_key_make_set), and
 * an abandoned walk is resumed by the group key with one frame more. The count-chain derivation
 * (derive_ci) is for single stacks only: a counted group's positions are walked, from row j (its
 * budget, chain_plain_bound). */

static int ensure_g_slots(struct di_gvcache *c, int id) {
  if (id < c->ngci)
    return 1;
  int nc = c->ngci ? c->ngci * 2 : 1024;
  while (nc <= id)
    nc *= 2;
  di_ci_entry **q = realloc(c->gci, sizeof *q * (size_t)nc);
  if (q)
    c->gci = q;
  int32_t *r = realloc(c->gchosen, sizeof *r * (size_t)nc);
  if (r)
    c->gchosen = r;
  if (!q || !r)
    return 0;
  memset(c->gci + c->ngci, 0, sizeof *q * (size_t)(nc - c->ngci));
  memset(c->gchosen + c->ngci, 0, sizeof *r * (size_t)(nc - c->ngci));
  c->ngci = nc;
  return 1;
}

/* Fills c->gci[T] for group key T (a state of truncated stacks); prev: the group key
 * with one frame fewer (-1 at one frame), whose walk this one resumes when it was the last one
 * abandoned. Under g->mu. */
static di_status classify_group(di_grammar *g, struct di_gvcache *c, int T, int prev, int last) {
  enum { MAX_KEY_WORDS = 1 << 16 };
  di_grt *rt = &g->rt;
  const int max_unc = last ? -1 : c->ci_max_uncertain, n = rt->soff[T + 1] - rt->soff[T];
  const int32_t *nodes = rt->sn + rt->soff[T];
  for (int i = 0; c->derive && g->chains.n_frames > 0 && !last && i < n; i++) {
    /* as classify: a stack with a count frame at its bottom leaves nearly every token that runs past
     * the repetition uncertain, so the next frame is taken at once (any depth gives the same masks) */
    int r, d = count_frame(rt, &g->chains, nodes[i], 64, &r), frame = nodes[i];
    for (int k = 0; k < d; k++)
      frame = rt->npar[frame];
    if (d >= 0 && rt->npar[frame] == DI_GRT_PSEUDO) {
      DI_TRY(overflow_entry(&c->gci[T]));
      c->ci_bytes += c->gci[T]->bytes;
      return DI_OK;
    }
  }
  struct timespec t0, t1;
  const int debug = di_switch_get(DI_SW_GRAMMAR_DEBUG) != 0;
  if (debug)
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  int described =
      c->share && di_language_key_make_set(&c->lkey, rt, c->v->shared_ci, nodes, n, c->v->maxlen, MAX_KEY_WORDS);
  if (debug && clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1) == 0)
    fprintf(stderr, "group key %d described in %d words (%s) us %.0f\n", T, described ? c->lkey.n : -1,
            described ? "shared store" : "not shared",
            (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3);
  if (described) {
    di_ci_entry *e = di_ci_shared_find(c->v->shared_ci, c->lkey.w, c->lkey.n, c->lkey.hash);
    if (e && !(e->overflow && last)) {
      c->gci[T] = e;
      c->ci_bytes += e->bytes;
      return DI_OK;
    }
    di_ci_entry_release(e);
  }
  const int resume = prev >= 0 && c->part_key == prev && c->part_group;
  DI_TRY(compute_ci(g, c, T, 1, max_unc, 0, resume, &c->gci[T]));
  c->ci_bytes += c->gci[T]->bytes;
  if (described)
    di_ci_shared_put(c->v->shared_ci, c->lkey.w, c->lkey.n, c->lkey.hash, c->gci[T]);
  return DI_OK;
}

static int stack_height(const di_grt *rt, int id) {
  int h = 0;
  for (; id > DI_GRT_PSEUDO; id = rt->npar[id])
    h++;
  return h;
}

/* The deepest node that lies strictly below every member (their parents' common ancestor, perhaps
 * the ROOT sentinel); -1 when there is none or a member has more than 64 frames above it. */
static int common_below(const di_grt *rt, const int32_t *m, int n) {
  int a = rt->npar[m[0]], ha = stack_height(rt, a);
  for (int i = 1; i < n; i++) {
    int b = rt->npar[m[i]], hb = stack_height(rt, b);
    for (; ha > hb; ha--)
      a = rt->npar[a];
    for (; hb > ha; hb--)
      b = rt->npar[b];
    for (; a != b; ha--) {
      if (a <= DI_GRT_PSEUDO || b <= DI_GRT_PSEUDO)
        return -1; /* different sentinels */
      a = rt->npar[a];
      b = rt->npar[b];
    }
  }
  for (int i = 0; i < n; i++)
    if (stack_height(rt, m[i]) - ha > 64)
      return -1;
  return a;
}

/* The classification used for the stacks members[0..n) (2 <= n <= 64) of a state, as get_ci for
 * one stack, but counting frames from below: level L keeps every frame above the members' common
 * ancestor C and L frames of C's (level 0: the frames above C alone, which is where the members
 * part: a string's characters with its closing quote, a free key's trie with the escapes' nested
 * alternatives; counting from each top would cut the deeper ones short). *out = NULL when the
 * members have no usable C (the caller classifies them one by one). Under g->mu. */
static di_status get_group_ci(di_grammar *g, struct di_gvcache *c, const int32_t *members, int n, di_ci_entry **out) {
  di_grt *rt = &g->rt;
  bound_entries(c);
  *out = NULL;
  const int R = di_grt_state_of(rt, members, n, 0);
  if (R < 0)
    return DI_ERR_OOM;
  if (!ensure_g_slots(c, R))
    return di_error_set(DI_ERR_OOM, "out of memory");
  if (c->gchosen[R] > 0) {
    *out = c->gci[c->gchosen[R] - 1];
    return DI_OK;
  }
  if (c->gchosen[R] < 0) /* no common ancestor: one by one */
    return DI_OK;
  const int C = common_below(rt, members, n);
  if (C < 0) {
    c->gchosen[R] = -1;
    return DI_OK;
  }
  int32_t keys[64];
  for (int level = 0, prev = -1;; level++) {
    const int base = C <= DI_GRT_PSEUDO ? C : level > 0 ? di_grt_truncated_stack(rt, C, level) : DI_GRT_PSEUDO;
    if (base < 0)
      return DI_ERR_OOM;
    const int full = base == C;
    for (int i = 0; i < n; i++)
      if ((keys[i] = full ? members[i] : di_grt_truncated_from(rt, members[i], C, level)) < 0)
        return DI_ERR_OOM;
    const int T = full ? R : di_grt_state_of(rt, keys, n, 0);
    if (T < 0)
      return DI_ERR_OOM;
    if (!ensure_g_slots(c, T))
      return di_error_set(DI_ERR_OOM, "out of memory");
    const int last = full || level + 1 >= c->ci_depth;
    if (c->gci[T] && c->gci[T]->overflow && last) { /* abandoned earlier, needed in full now */
      c->ci_bytes -= c->gci[T]->bytes;
      di_ci_entry_release(c->gci[T]);
      c->gci[T] = NULL;
    }
    if (!c->gci[T])
      DI_TRY(classify_group(g, c, T, prev, last));
    if (last || (!c->gci[T]->overflow && c->gci[T]->nunc <= c->ci_max_uncertain)) {
      c->gchosen[R] = T + 1;
      *out = c->gci[T];
      return DI_OK;
    }
    prev = T;
  }
}

/* A grammar with token references (token_ref.h): text tokens holding the 0xFF mark are never
 * allowed by their text, and every non-stop id whose spelling 0xFF + 4 id bytes the grammar
 * takes from S is allowed. The ids' spellings form an implicit trie walked byte by byte, so a
 * state that takes no token reference costs one step. Under g->mu. */
static di_status add_token_refs(di_grt *rt, const di_grammar_vocab *v, int S, uint32_t *out) {
  for (int i = 0; i < v->nmark; i++)
    out[v->mark_ids[i] >> 5] &= ~(1u << (v->mark_ids[i] & 31));
  int s0 = di_grt_step(rt, S, DI_TOKEN_REF_MARK);
  if (s0 == DI_GRT_ERROR)
    return DI_ERR_OOM;
  const uint32_t n = (uint32_t)v->n;
  for (uint32_t b1 = 0; s0 >= 0 && b1 <= ((n - 1) >> 24); b1++) {
    int s1 = di_grt_step(rt, s0, b1);
    for (uint32_t b2 = 0; s1 >= 0 && b2 < 256 && ((b1 << 24) | (b2 << 16)) < n; b2++) {
      int s2 = di_grt_step(rt, s1, b2);
      for (uint32_t b3 = 0; s2 >= 0 && b3 < 256 && ((b1 << 24) | (b2 << 16) | (b3 << 8)) < n; b3++) {
        int s3 = di_grt_step(rt, s2, b3);
        for (uint32_t b4 = 0; s3 >= 0 && b4 < 256; b4++) {
          uint32_t id = (b1 << 24) | (b2 << 16) | (b3 << 8) | b4;
          if (id >= n)
            break;
          int s4 = di_grt_boundary(rt, di_grt_step(rt, s3, b4));
          if (s4 == DI_GRT_ERROR)
            return DI_ERR_OOM;
          if (s4 >= 0 && !v->is_stop[id])
            out[id >> 5] |= 1u << (id & 31);
        }
        if (s3 == DI_GRT_ERROR)
          return DI_ERR_OOM;
      }
      if (s2 == DI_GRT_ERROR)
        return DI_ERR_OOM;
    }
    if (s1 == DI_GRT_ERROR)
      return DI_ERR_OOM;
  }
  return DI_OK;
}

/* Full mask for state S into out (vocab words); *cheap = 1 when it was one classification's
 * accepted tokens and nothing else (computing it again costs about what a copy from the cache
 * does). Under g->mu. */
static di_status compute_mask(di_grammar *g, struct di_gvcache *c, int S, uint32_t *out, int *cheap) {
  const di_grammar_vocab *v = c->v;
  di_grt *rt = &g->rt;
  int W = v->words;
  memset(out, 0, sizeof(uint32_t) * (size_t)W);
  int nbuf = 0, lists = 0;
  *cheap = 0;
  /* A grammar with a max_tokens lexeme: a token is allowed only when the state after its bytes
   * survives the token boundary (di_grt_boundary), which the context-independent classification
   * does not see (it assumes acceptance depends on the bytes alone). Where the boundary can drop
   * a stack (a stack in a last copy, or a rule with N = 1: di_grt_boundary_safe), every token is
   * walked from the real state and tested at its end; elsewhere no stack can die at the boundary
   * and the classification is exact as it is. Masks are cached per state (states carry the copy).
   * The count-chain derivation and the shared store are off for such grammars (get_vcache). */
  const int walk_all = rt->tok_map && !di_grt_boundary_safe(rt, S);
  if (walk_all) {
    for (int i = 0; i < v->nsorted; i++)
      if (!buf_append(&c->buf, &nbuf, &c->cap_buf, i))
        return di_error_set(DI_ERR_OOM, "out of memory");
  }
  /* the stacks (each copy of a max_tokens lexeme as its last copy: one classification for all)
   * classified as one key (get_group_ci), but for those that lie a few frames below another stack
   * (a string's closing quote below its characters), each alone: their context differs from string
   * to string, the characters' does not, so the characters' group is a key every string shares. */
  enum { MAX_GROUPED = 64 };
  int32_t ids[MAX_GROUPED], anc[MAX_GROUPED];
  const int grouping = c->group && rt->soff[S + 1] - rt->soff[S] <= MAX_GROUPED && rt->soff[S + 1] - rt->soff[S] > 1;
  int nst = rt->soff[S + 1] - rt->soff[S];
  if (grouping && !walk_all) {
    int m = 0;
    for (int k = 0; k < nst; k++) {
      int id = rt->sn[rt->soff[S] + k];
      if (rt->tok_map && rt->tok_canon[rt->npos[id]] >= 0 &&
          (id = di_grt_replace_frame(rt, id, 0, rt->tok_canon[rt->npos[id]])) < 0)
        return DI_ERR_OOM;
      int j = m; /* insertion sort (a state is small here); copies mapped to one stack once */
      for (; j > 0 && ids[j - 1] > id; j--)
        ;
      if (j > 0 && ids[j - 1] == id)
        continue;
      memmove(ids + j + 1, ids + j, sizeof *ids * (size_t)(m - j));
      ids[j] = id;
      m++;
    }
    nst = m;
    /* a stack that lies a few frames below another (its continuation: a string's closing quote
     * under its characters) stays apart (anchor: itself); the others form one group */
    uint8_t below[MAX_GROUPED] = {0};
    for (int k = 0; k < nst; k++) {
      int x = rt->npar[ids[k]];
      for (int up = 0; up < 4 && x > DI_GRT_PSEUDO; up++, x = rt->npar[x]) {
        int lo = 0, hi = nst - 1; /* ids are sorted: binary search */
        while (lo <= hi) {
          const int mid = (lo + hi) / 2;
          if (ids[mid] == x) {
            below[mid] = 1;
            break;
          }
          if (ids[mid] < x)
            lo = mid + 1;
          else
            hi = mid - 1;
        }
      }
    }
    for (int k = 0; k < nst; k++)
      anc[k] = below[k] ? ids[k] : -1;
    for (int k = 1; k < nst; k++) { /* by anchor, then node (insertion sort) */
      const int32_t a = anc[k], id = ids[k];
      int j = k;
      for (; j > 0 && (anc[j - 1] > a || (anc[j - 1] == a && ids[j - 1] > id)); j--) {
        anc[j] = anc[j - 1];
        ids[j] = ids[j - 1];
      }
      anc[j] = a;
      ids[j] = id;
    }
  }
  di_ci_entry *ge = NULL; /* the current group's entry; NULL: its stacks one by one */
  int gend = 0;           /* where the current group ends */
  int nent = 0;           /* entries ORed */
  for (int k = 0, next = 0; !walk_all && k < nst; k = next) {
    di_ci_entry *e = NULL;
    if (grouping && k >= gend) { /* a new group */
      gend = k + 1;
      while (gend < nst && anc[gend] == anc[k])
        gend++;
      ge = NULL;
      if (gend - k > 1)
        DI_TRY(get_group_ci(g, c, ids + k, gend - k, &ge));
    }
    if (grouping && ge) {
      next = gend;
      e = ge;
    } else if (grouping) {
      next = k + 1;
      DI_TRY(get_ci(g, c, ids[k], &e));
    } else {
      next = k + 1;
      int id = rt->sn[rt->soff[S] + k];
      if (rt->tok_map && rt->tok_canon[rt->npos[id]] >= 0) { /* one classification for all copies */
        id = di_grt_replace_frame(rt, id, 0, rt->tok_canon[rt->npos[id]]);
        if (id < 0)
          return DI_ERR_OOM;
      }
      DI_TRY(get_ci(g, c, id, &e));
    }
    nent++;
    if (e->acc_bits) {
      for (int w = 0; w < W; w++)
        out[w] |= e->acc_bits[w];
    } else {
      for (int i = 0; i < e->nacc; i++)
        out[e->acc_list[i] >> 5] |= 1u << (e->acc_list[i] & 31);
    }
    if (e->nunc) {
      lists++;
      for (int i = 0; i < e->nunc; i++)
        if (!buf_append(&c->buf, &nbuf, &c->cap_buf, e->unc[i]))
          return di_error_set(DI_ERR_OOM, "out of memory");
    }
  }
  if (lists > 1) { /* merge: sort, unique */
    int32_t *tmp = NULL;
    if (nbuf > DI_SORT_I32_SMALL && !(tmp = malloc(sizeof(int32_t) * (size_t)nbuf)))
      return di_error_set(DI_ERR_OOM, "out of memory");
    di_sort_i32(c->buf, nbuf, tmp); /* sorted indices, >= 0 */
    free(tmp);
    int m = 0;
    for (int i = 0; i < nbuf; i++)
      if (m == 0 || c->buf[m - 1] != c->buf[i])
        c->buf[m++] = c->buf[i];
    nbuf = m;
  }
  /* walk the uncertain tokens from the real state, reusing the states of the shared prefix with
   * the previous token (they come in trie order) */
  const uint8_t *prev = NULL;
  int prevlen = 0, valid = 0; /* c->st[0..valid] are states for prev's prefix */
  c->st[0] = S;
  for (int i = 0; i < nbuf; i++) {
    int id = v->sorted[c->buf[i]];
    if ((out[id >> 5] >> (id & 31)) & 1u)
      continue;
    const uint8_t *t = v->bytes + v->off[id];
    int len = (int)(v->off[id + 1] - v->off[id]);
    int l = 0;
    if (prev)
      while (l < len && l < prevlen && l < valid && t[l] == prev[l])
        l++;
    int s = c->st[l];
    int d = l;
    for (; d < len; d++) {
      s = di_grt_step(rt, s, t[d]);
      if (s < 0)
        break;
      c->st[d + 1] = s;
    }
    if (s == DI_GRT_ERROR)
      return DI_ERR_OOM;
    valid = d; /* st[0..d] valid */
    prev = t;
    prevlen = len;
    if (s >= 0 && walk_all && (s = di_grt_boundary(rt, s)) == DI_GRT_ERROR)
      return DI_ERR_OOM;
    if (s >= 0)
      out[id >> 5] |= 1u << (id & 31);
  }
  *cheap = !walk_all && nbuf == 0 && nent <= 1 && !g->core.has_token_refs; /* one entry: a stack or a group */
  if (g->core.has_token_refs)
    DI_TRY(add_token_refs(rt, v, S, out));
  if (di_grt_flags(rt, S) & DI_GRT_ACCEPT)
    for (int i = 0; i < v->nstop; i++)
      out[v->stop[i] >> 5] |= 1u << (v->stop[i] & 31);
  return DI_OK;
}

di_status di_grammar_matcher_create(const di_grammar *gc, const di_grammar_vocab *v, di_grammar_matcher **out) {
  if (!gc || !v || !out)
    return di_error_set(DI_ERR_INVALID_ARG, "di_grammar_matcher_create: NULL argument");
  di_grammar *g = (di_grammar *)gc; /* logically const: only its caches change, under g->mu */
  di_grammar_matcher *m = calloc(1, sizeof *m);
  if (!m)
    return di_error_set(DI_ERR_OOM, "out of memory");
  pthread_mutex_lock(&g->mu);
  /* The automaton only grows (states and stacks are never freed while a matcher may hold them):
   * when it has used half of its budget and no matcher is live, start it and the caches afresh. */
  if (g->rt_ready && g->live_matchers == 0 &&
      (g->rt.ns > g->rt.max_states / 2 || g->rt.nn > g->rt.max_nodes / 2)) {
    di_grt_free(&g->rt);
    g->rt_ready = 0;
    di_gvcache_free_all(g->vcaches);
    g->vcaches = NULL;
  }
  di_status st = ensure_rt(g);
  if (st == DI_OK) {
    m->vc = get_vcache(g, v);
    if (!m->vc)
      st = di_error_set(DI_ERR_OOM, "out of memory");
  }
  int start = g->rt_ready ? g->rt.start : 0;
  if (st == DI_OK)
    g->live_matchers++;
  pthread_mutex_unlock(&g->mu);
  m->caph = 64;
  m->hist = malloc(sizeof(int32_t) * (size_t)m->caph);
  m->stop = malloc((size_t)m->caph);
  m->hcs = malloc(sizeof(uint32_t) * (size_t)m->caph);
  if (st == DI_OK && (!m->hist || !m->stop || !m->hcs))
    st = di_error_set(DI_ERR_OOM, "out of memory");
  if (st != DI_OK) {
    if (m->vc) {
      pthread_mutex_lock(&g->mu);
      g->live_matchers--;
      pthread_mutex_unlock(&g->mu);
    }
    free(m->hist);
    free(m->stop);
    free(m->hcs);
    free(m);
    return st;
  }
  m->g = di_grammar_ref_internal(g);
  m->v = v;
  m->hist[0] = start;
  m->stop[0] = 0;
  m->hcs[0] = 0;
  m->nh = 1;
  *out = m;
  return DI_OK;
}

void di_grammar_matcher_free(di_grammar_matcher *m) {
  if (!m)
    return;
  pthread_mutex_lock(&m->g->mu);
  m->g->live_matchers--;
  pthread_mutex_unlock(&m->g->mu);
  di_grammar_free(m->g);
  free(m->hist);
  free(m->stop);
  free(m->hcs);
  free(m);
}

int di_grammar_matcher_is_terminated(const di_grammar_matcher *m) { return m->stop[m->nh - 1]; }

int di_grammar_matcher_can_end(const di_grammar_matcher *m) {
  if (m->stop[m->nh - 1])
    return 1;
  pthread_mutex_lock(&m->g->mu); /* the state table may be growing in another thread */
  int r = (di_grt_flags(&m->g->rt, m->hist[m->nh - 1]) & DI_GRT_ACCEPT) != 0;
  pthread_mutex_unlock(&m->g->mu);
  return r;
}

int di_grammar_matcher_num_accepted(const di_grammar_matcher *m) { return m->nh - 1; }

void di_grammar_matcher_reset(di_grammar_matcher *m) { m->nh = 1; }

static int step_bytes(di_grt *rt, int s, uint32_t *cs, const uint8_t *b, size_t n);

/* Pattern / format strings' and every default string bound (string_bound.h): the mask of state S is
 * the unbounded one, less the tokens that would run a bounded body past its characters or leave it
 * unable to end within them. Only tokens longer than the characters left less the bodies' radius can:
 * far from the bound (a string's first 4,096 - radius - the longest token's characters by default)
 * nothing is checked. Nearer, the candidates are the mask less the vocabulary's row of short ids;
 * at a character boundary inside a body, a token without a quote that has more characters than are
 * left never leaves the body (a body ends only at a quote, json_schema.c), so it is refused without
 * a walk where the state's stacks outside the body refuse its first byte, and one with few enough
 * characters before any quote is taken as it is; the rest are walked with the counter. Under g->mu. */
static di_status sb_filter(di_grammar *g, const di_grammar_vocab *v, int S, uint32_t cs,
                           uint32_t *bits) {
  di_grt *rt = &g->rt;
  const int info = di_sb_info(rt, S);
  if (info < 0)
    return DI_ERR_OOM;
  const long N = g->core.sb_n, R = g->core.sb_radius;
  const int inside = (info & DI_SB_INSIDE) != 0;
  const long left = inside ? N - (long)di_sb_count(cs) : N; /* a body a token opens starts at 0 */
  const long safe = left - R; /* tokens of at most this many bytes are never affected */
  if (safe >= v->maxlen)
    return DI_OK;
  const uint32_t *shorts = safe >= 0 && safe <= v->len_le_max ? v->len_le + (size_t)safe * (size_t)v->words : NULL;
  int shortcut = inside && (cs >> 24) == 0 && N - R >= v->maxlen, outside = DI_GRT_DEAD;
  if (shortcut) {
    if ((outside = di_sb_prune(rt, S)) == DI_GRT_ERROR)
      return DI_ERR_OOM;
  }
  long n_walked = 0;
  for (int w = 0; w < v->words; w++)
    for (uint32_t x = bits[w] & (shorts ? ~shorts[w] : ~0u); x; x &= x - 1) {
      const int id = w * 32 + __builtin_ctz(x);
      if (id >= v->n || v->is_stop[id] || (long)(v->off[id + 1] - v->off[id]) <= safe)
        continue;
      const uint32_t len = v->off[id + 1] - v->off[id];
      const uint8_t *tb = v->bytes + v->off[id];
      if (shortcut && !g->core.has_token_refs) {
        const long q = v->quote_chars[id] & 0xff;
        const int has_quote = (v->quote_chars[id] & 0x100) != 0;
        if (q <= safe) /* its characters in this body leave room; a body after its quote starts at 0 */
          continue;
        if (!has_quote && q > left) {
          const int o = outside >= 0 ? di_grt_step(rt, outside, tb[0]) : DI_GRT_DEAD;
          if (o == DI_GRT_ERROR)
            return DI_ERR_OOM;
          if (o < 0) {
            bits[w] &= ~(1u << (id & 31));
            continue;
          }
        }
      }
      uint32_t c2 = cs;
      int s = DI_GRT_DEAD;
      n_walked++;
      if (g->core.has_token_refs) { /* as accept_token: by its id first */
        uint8_t spell[DI_TOKEN_REF_LEN];
        di_token_ref_spell(id, spell);
        s = step_bytes(rt, S, &c2, spell, DI_TOKEN_REF_LEN);
        if (s == DI_GRT_ERROR)
          return DI_ERR_OOM;
        if (s >= 0)
          continue;
        c2 = cs;
      }
      s = step_bytes(rt, S, &c2, tb, len);
      if (s == DI_GRT_ERROR)
        return DI_ERR_OOM;
      if (s < 0)
        bits[w] &= ~(1u << (id & 31));
    }
  if (di_switch_get(DI_SW_GRAMMAR_DEBUG) != 0)
    fprintf(stderr, "string bound filter: %ld characters left, tokens of more than %ld bytes checked, %ld walked\n",
            left, safe, n_walked);
  return DI_OK;
}

di_status di_grammar_matcher_fill_mask(di_grammar_matcher *m, uint32_t *bitmask) {
  const di_grammar_vocab *v = m->v;
  if (m->stop[m->nh - 1]) {
    memset(bitmask, 0, sizeof(uint32_t) * (size_t)v->words);
    return DI_OK;
  }
  di_grammar *g = m->g;
  struct di_gvcache *c = m->vc;
  int S = m->hist[m->nh - 1];
  const int S0 = S;
  pthread_mutex_lock(&g->mu);
  di_status st = DI_OK;
  if (!(S < c->cap_mask && c->mask[S])) {
    const int moved = mask_state(g, c, S);
    if (moved != S)
      atomic_fetch_add(&((di_grammar_vocab *)v)->n_count_masks, 1);
    S = moved;
  }
  if (S < c->cap_mask && c->mask[S]) {
    memcpy(bitmask, c->mask[S], sizeof(uint32_t) * (size_t)v->words);
  } else {
    int cheap = 0;
    st = compute_mask(g, c, S, bitmask, &cheap);
    /* many states of a document are met once (positions in strings, numbers, formats): a mask that
     * costs no more to compute than to copy is kept (16 KB, fresh memory to fault in) only when its
     * state is asked for a second time */
    int again = 1;
    if (st == DI_OK && cheap) {
      if (S >= c->cap_asked) {
        int nc = c->cap_asked ? c->cap_asked : 1024;
        while (nc <= S)
          nc *= 2;
        uint8_t *q = realloc(c->asked, (size_t)nc);
        if (q) {
          memset(q + c->cap_asked, 0, (size_t)(nc - c->cap_asked));
          c->asked = q;
          c->cap_asked = nc;
        }
      }
      if (S < c->cap_asked) {
        again = c->asked[S];
        c->asked[S] = 1;
      } else {
        again = 1; /* no memory for the marks: cache as before */
      }
    }
    if (st == DI_OK && again && c->nmask < c->max_masks) {
      if (S >= c->cap_mask) {
        int nc = c->cap_mask ? c->cap_mask : 256;
        while (nc <= S)
          nc *= 2;
        uint32_t **q = realloc(c->mask, sizeof *q * (size_t)nc);
        if (q) {
          memset(q + c->cap_mask, 0, sizeof *q * (size_t)(nc - c->cap_mask));
          c->mask = q;
          c->cap_mask = nc;
        }
      }
      if (S < c->cap_mask) {
        c->mask[S] = malloc(sizeof(uint32_t) * (size_t)v->words);
        if (c->mask[S]) {
          memcpy(c->mask[S], bitmask, sizeof(uint32_t) * (size_t)v->words);
          c->nmask++;
        }
      }
    }
  }
  if (st == DI_OK && g->core.sb_cont)
    st = sb_filter(g, v, S0, m->hcs[m->nh - 1], bitmask);
  pthread_mutex_unlock(&g->mu);
  return st;
}

static di_status push_state(di_grammar_matcher *m, int s, int stop, uint32_t cs) {
  if (m->nh == m->caph) {
    int nc = m->caph * 2;
    int32_t *h = realloc(m->hist, sizeof(int32_t) * (size_t)nc);
    if (h)
      m->hist = h;
    uint8_t *t = realloc(m->stop, (size_t)nc);
    if (t)
      m->stop = t;
    uint32_t *x = realloc(m->hcs, sizeof(uint32_t) * (size_t)nc);
    if (x)
      m->hcs = x;
    if (!h || !t || !x)
      return di_error_set(DI_ERR_OOM, "out of memory");
    m->caph = nc;
  }
  m->hist[m->nh] = s;
  m->stop[m->nh] = (uint8_t)stop;
  m->hcs[m->nh] = cs;
  m->nh++;
  return DI_OK;
}

/* n bytes from state s with the bounded strings' counter *cs (string_bound.h), then a token boundary
 * (max_tokens); under g->mu. A state (DI_GRT_DEAD when refused) or DI_GRT_ERROR. */
static int step_bytes(di_grt *rt, int s, uint32_t *cs, const uint8_t *b, size_t n) {
  for (size_t i = 0; i < n && s >= 0; i++)
    s = di_sb_step(rt, s, cs, b[i]);
  s = di_grt_boundary(rt, s); /* one accepted step is one token (max_tokens) */
  if (s >= 0 && rt->g->sb_cont) { /* the string's body must still end within its bound */
    const int ok = di_sb_viable(rt, s, *cs);
    if (ok <= 0)
      s = ok < 0 ? DI_GRT_ERROR : DI_GRT_DEAD;
  }
  return s;
}

static di_status advance(di_grammar_matcher *m, const uint8_t *b, size_t n, int *out, uint32_t *cs) {
  di_grammar *g = m->g;
  pthread_mutex_lock(&g->mu);
  *cs = m->hcs[m->nh - 1];
  int s = step_bytes(&g->rt, m->hist[m->nh - 1], cs, b, n);
  pthread_mutex_unlock(&g->mu);
  if (s == DI_GRT_ERROR)
    return DI_ERR_OOM;
  *out = s;
  return DI_OK;
}

di_status di_grammar_matcher_accept_token(di_grammar_matcher *m, int32_t id) {
  const di_grammar_vocab *v = m->v;
  if (id < 0 || id >= v->n)
    return di_error_set(DI_ERR_INVALID_ARG, "token id %d outside the vocabulary (size %d)", (int)id, v->n);
  if (m->stop[m->nh - 1])
    return di_error_set(DI_ERR_INVALID_ARG, "grammar: token %d after the stop token", (int)id);
  if (v->is_stop[id]) {
    if (!di_grammar_matcher_can_end(m))
      return di_error_set(DI_ERR_INVALID_ARG, "grammar: stop token %d before the grammar can end", (int)id);
    return push_state(m, m->hist[m->nh - 1], 1, m->hcs[m->nh - 1]);
  }
  uint32_t len = v->off[id + 1] - v->off[id];
  int s = DI_GRT_DEAD;
  uint32_t cs = 0;
  if (m->g->core.has_token_refs) { /* by its id where the grammar takes it, else by its text */
    uint8_t spell[DI_TOKEN_REF_LEN];
    di_token_ref_spell(id, spell);
    DI_TRY(advance(m, spell, DI_TOKEN_REF_LEN, &s, &cs));
    if (s >= 0)
      return push_state(m, s, 0, cs);
    if (memchr(v->bytes + v->off[id], DI_TOKEN_REF_MARK, len))
      return di_error_set(DI_ERR_INVALID_ARG, "grammar: token %d is not allowed here", (int)id);
  }
  if (len == 0)
    return di_error_set(DI_ERR_INVALID_ARG, "grammar: token %d has no bytes and is never allowed", (int)id);
  DI_TRY(advance(m, v->bytes + v->off[id], len, &s, &cs));
  if (s < 0)
    return di_error_set(DI_ERR_INVALID_ARG, "grammar: token %d is not allowed here", (int)id);
  return push_state(m, s, 0, cs);
}

di_status di_grammar_matcher_accept_bytes(di_grammar_matcher *m, const char *s, size_t len) {
  if (m->stop[m->nh - 1])
    return di_error_set(DI_ERR_INVALID_ARG, "grammar: bytes after the stop token");
  int st;
  uint32_t cs = 0;
  DI_TRY(advance(m, (const uint8_t *)s, len, &st, &cs));
  if (st < 0)
    return di_error_set(DI_ERR_INVALID_ARG, "grammar: these bytes are not allowed here");
  return push_state(m, st, 0, cs);
}

di_status di_grammar_matcher_rollback(di_grammar_matcher *m, int n) {
  if (n < 0 || n > m->nh - 1)
    return di_error_set(DI_ERR_INVALID_ARG, "grammar: cannot roll back %d steps (%d accepted)", n, m->nh - 1);
  m->nh -= n;
  return DI_OK;
}
