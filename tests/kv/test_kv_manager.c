/* KV block manager: allocation and freeing, prefix hits (full blocks only, never the last token),
 * LRU eviction order of cached blocks, OOM all-or-nothing, several cache groups (compressed and
 * window groups), a group of 16-token blocks beside 64-token ones (the DSpark drafter's: its own
 * hash chain, prefix hits of 4 blocks per 64 tokens, planning by tokens, bad block sizes refused),
 * pool planning from a byte budget, and a random walk checked against the invariants after every
 * operation. */
#include "test_util.h"
#include "kv/kv_manager.h"
#include "sampler/rng.h"
#include <stdlib.h>
#include <string.h>

static di_kv_group_info main_group(void) {
  return (di_kv_group_info){.n_layers = 2, .bytes_per_token = 1000, .tokens_per_entry = 1, .window = 0};
}

static void test_basic_and_prefix(void) {
  di_kv_group_info g = main_group();
  int64_t nb = 8;
  di_kv_manager *m;
  CHECK(di_kv_manager_create(&g, 1, &nb, 1, &m) == DI_OK);
  int32_t toks[600];
  for (int i = 0; i < 600; i++) toks[i] = i * 7 % 1000;
  di_kv_seq a = {0}, b = {0}, c = {0};
  CHECK(di_kv_match_prefix(m, &a, toks, 130, 0) == 0);
  CHECK(di_kv_allocate(m, &a, 130) == DI_OK);
  CHECK(a.n[0] == 3);
  di_kv_commit(m, &a, toks, 130);
  CHECK(a.n_hashed[0] == 2);
  /* b shares the first two full blocks */
  CHECK(di_kv_match_prefix(m, &b, toks, 200, 0) == 128);
  CHECK(b.n[0] == 2 && b.table[0][0] == a.table[0][0] && b.table[0][1] == a.table[0][1]);
  CHECK(di_kv_check(m, di_kv_seq_refs(m, &a) + di_kv_seq_refs(m, &b)) == DI_OK);
  /* exactly 128 tokens: the last token must be computed, so only one block is a hit */
  CHECK(di_kv_match_prefix(m, &c, toks, 128, 0) == 64);
  di_kv_free_seq(m, &c);
  /* a different token in block 1 stops the match there */
  int32_t other[200];
  memcpy(other, toks, sizeof other);
  other[100] = 999;
  CHECK(di_kv_match_prefix(m, &c, other, 200, 0) == 64);
  di_kv_free_seq(m, &c);
  /* OOM is all or nothing */
  CHECK(di_kv_allocate(m, &b, 600) == DI_ERR_OOM);
  CHECK(b.n[0] == 2);
  CHECK(di_kv_allocate(m, &b, 64 * 7) == DI_OK);
  di_kv_stats st;
  di_kv_get_stats(m, &st);
  CHECK(st.used_blocks == 8 && st.free_blocks == 0);
  CHECK(st.hit_tokens == 128 + 64 + 64);
  di_kv_free_seq(m, &a);
  di_kv_free_seq(m, &b);
  di_kv_get_stats(m, &st);
  CHECK(st.used_blocks == 0 && st.cached_blocks == 2);
  CHECK(di_kv_check(m, 0) == DI_OK);
  /* cached blocks survive until memory is needed, then the least recently used goes first */
  CHECK(di_kv_match_prefix(m, &a, toks, 200, 0) == 128);
  di_kv_free_seq(m, &a);
  CHECK(di_kv_allocate(m, &a, 64 * 6) == DI_OK); /* the six uncached blocks */
  di_kv_get_stats(m, &st);
  CHECK(st.cached_blocks == 2 && st.evictions == 0);
  CHECK(di_kv_allocate(m, &a, 64 * 7) == DI_OK); /* evicts one: the tail block (freed first) */
  di_kv_get_stats(m, &st);
  CHECK(st.evictions == 1 && st.cached_blocks == 1);
  CHECK(di_kv_match_prefix(m, &b, toks, 200, 0) == 64);
  di_kv_free_seq(m, &b);
  di_kv_free_seq(m, &a);
  CHECK(di_kv_check(m, 0) == DI_OK);
  /* prefix caching off: no lookups unless forced (samples of one request) */
  di_kv_manager_free(m);
  CHECK(di_kv_manager_create(&g, 1, &nb, 0, &m) == DI_OK);
  CHECK(di_kv_allocate(m, &a, 130) == DI_OK);
  di_kv_commit(m, &a, toks, 130);
  CHECK(di_kv_match_prefix(m, &b, toks, 200, 0) == 0);
  CHECK(di_kv_match_prefix(m, &b, toks, 200, 1) == 128);
  di_kv_free_seq(m, &a);
  di_kv_free_seq(m, &b);
  CHECK(di_kv_check(m, 0) == DI_OK);
  di_kv_manager_free(m);
}

static di_status plan_one_group(const di_kv_group_info *g, int64_t budget, int max_seqs, int64_t *nb) {
  return di_kv_plan(g, 1, budget, max_seqs, 1, nb);
}

static void test_groups(void) {
  /* V4-like: main cache, a compressed cache (1 entry per 4 tokens), a 128-token window; every group
   * pages by 64 positions */
  di_kv_group_info g[3] = {main_group(),
                           {.n_layers = 2, .bytes_per_token = 500, .tokens_per_entry = 4, .window = 0, .kind = DI_KV_COMPRESSED},
                           {.n_layers = 4, .bytes_per_token = 2000, .tokens_per_entry = 1, .window = 128, .kind = DI_KV_SLIDING}};
  int64_t nb[3];
  CHECK(di_kv_plan(g, 3, 64 * 1000 * 100, 4, 1, nb) == DI_OK);
  int64_t bytes = nb[0] * 64000 + nb[1] * 32000 + nb[2] * 128000;
  CHECKF(bytes <= 64 * 1000 * 100 && nb[0] > 20, "plan %lld %lld %lld", (long long)nb[0], (long long)nb[1], (long long)nb[2]);
  CHECK(nb[1] == nb[0]);
  CHECK(nb[2] <= 4 * 4 + 1); /* 4 sequences x (window + a 1-token step + a block) + one step */
  CHECK_ERR(di_kv_plan(g, 3, 100, 4, 1, nb), "not even one block");
  di_kv_manager *m;
  int64_t cnt[3] = {20, 20, 12};
  CHECK(di_kv_manager_create(g, 3, cnt, 1, &m) == DI_OK);
  int grp;
  int64_t need;
  CHECK(di_kv_fits(m, 20 * 64, 1, &grp, &need) == 1);     /* the window group needs its window and a step (4 blocks), not 20 */
  CHECK(di_kv_fits(m, 20 * 64, 640, &grp, &need) == 0 && grp == 2 && need == 13); /* with a 640-token step: 13 */
  CHECK(di_kv_fits(m, 20 * 64 + 1, 1, &grp, &need) == 0 && grp == 0 && need == 21);
  di_kv_seq s = {0};
  CHECK(di_kv_allocate(m, &s, 300) == DI_OK);
  CHECK(s.n[0] == 5 && s.n[1] == 5 && s.n[2] == 5);
  int32_t toks[300];
  for (int i = 0; i < 300; i++) toks[i] = i % 7;
  di_kv_commit(m, &s, toks, 256); /* blocks 0..3 registered in every group */
  di_kv_slide(m, &s, toks, 256, 300); /* window 128: tokens before 172 are not needed: blocks 0, 1 go (still cached) */
  CHECK(s.n_freed[2] == 2 && s.table[2][0] == -1 && s.table[2][1] == -1 && s.table[2][2] >= 0);
  CHECK(di_kv_check(m, di_kv_seq_refs(m, &s)) == DI_OK);
  di_kv_seq t = {0};
  /* a hit of 4 blocks needs only the window group's blocks 2, 3 (the window before position 256) */
  CHECK(di_kv_match_prefix(m, &t, toks, 300, 0) == 256);
  CHECK(t.n[0] == 4 && t.n[2] == 4 && t.n_freed[2] == 2 && t.table[2][1] == -1 && t.table[2][2] == s.table[2][2]);
  CHECK(di_kv_check(m, di_kv_seq_refs(m, &s) + di_kv_seq_refs(m, &t)) == DI_OK);
  di_kv_free_seq(m, &t);
  di_kv_free_seq(m, &s);
  di_kv_stats st;
  di_kv_get_stats(m, &st);
  CHECK(st.used_blocks == 0 && st.total_blocks == 52);
  CHECK(di_kv_check(m, 0) == DI_OK);
  di_kv_manager_free(m);

  /* a window group whose block behind the window was never registered: no hit that needs it */
  CHECK(di_kv_manager_create(g, 3, cnt, 1, &m) == DI_OK);
  memset(&s, 0, sizeof s);
  CHECK(di_kv_allocate(m, &s, 300) == DI_OK);
  di_kv_slide(m, &s, toks, 0, 300); /* blocks 0, 1 given back with no token known: no hash */
  di_kv_commit(m, &s, toks, 300);
  CHECK(di_kv_match_prefix(m, &t, toks, 300, 0) == 256); /* blocks 2, 3 suffice for 4 */
  di_kv_free_seq(m, &t);
  CHECK(di_kv_match_prefix(m, &t, toks, 200, 0) == 0);   /* 3 blocks need block 1: gone */
  CHECK(t.n[0] == 0);
  di_kv_free_seq(m, &s);
  CHECK(di_kv_check(m, 0) == DI_OK);
  di_kv_manager_free(m);

  /* a no_sharing group turns prefix sharing off */
  di_kv_group_info g2[2] = {main_group(), {.n_layers = 1, .bytes_per_token = 10, .tokens_per_entry = 4, .no_sharing = 1}};
  int64_t c2[2] = {16, 16};
  CHECK(di_kv_manager_create(g2, 2, c2, 1, &m) == DI_OK);
  CHECK(di_kv_shares_prefixes(m) == 0);
  int32_t tk[400];
  for (int i = 0; i < 400; i++) tk[i] = i;
  CHECK(di_kv_allocate(m, &s, 400) == DI_OK);
  di_kv_commit(m, &s, tk, 400);
  CHECK(di_kv_match_prefix(m, &t, tk, 400, 1) == 0);
  di_kv_free_seq(m, &s);
  CHECK(di_kv_check(m, 0) == DI_OK);
  di_kv_manager_free(m);
}

static void test_random_walk(void) {
  di_kv_group_info g = main_group();
  int64_t nb = 24;
  di_kv_manager *m;
  CHECK(di_kv_manager_create(&g, 1, &nb, 1, &m) == DI_OK);
  enum { NS = 12 };
  di_kv_seq s[NS];
  int len[NS];
  memset(s, 0, sizeof s);
  memset(len, 0, sizeof len);
  int32_t base[1024];
  for (int i = 0; i < 1024; i++) base[i] = i % 5;
  int ok = 1;
  for (int it = 0; it < 20000 && ok; it++) {
    int k = (int)(di_rng_u64(1, 2, (uint64_t)it) % NS), op = (int)(di_rng_u64(3, 4, (uint64_t)it) % 4);
    if (op == 0) {
      di_kv_free_seq(m, &s[k]);
      len[k] = 0;
    } else if (op == 1 && len[k] == 0) {
      int n = 1 + (int)(di_rng_u64(5, 6, (uint64_t)it) % 400);
      len[k] = di_kv_match_prefix(m, &s[k], base, n, 0);
      if (di_kv_allocate(m, &s[k], n) == DI_OK) len[k] = n;
      else { di_kv_free_seq(m, &s[k]); len[k] = 0; }
    } else if (len[k] > 0) {
      int n = len[k] + 1 + (int)(di_rng_u64(7, 8, (uint64_t)it) % 80);
      if (n < 1000 && di_kv_allocate(m, &s[k], n) == DI_OK) {
        len[k] = n;
        di_kv_commit(m, &s[k], base, n);
      }
    }
    int64_t refs = 0;
    for (int j = 0; j < NS; j++) refs += di_kv_seq_refs(m, &s[j]);
    if (di_kv_check(m, refs) != DI_OK) { ok = 0; fprintf(stderr, "iteration %d: %s\n", it, di_last_error()); }
  }
  CHECK(ok);
  for (int j = 0; j < NS; j++) di_kv_free_seq(m, &s[j]);
  di_kv_stats st;
  di_kv_get_stats(m, &st);
  CHECK(st.used_blocks == 0 && st.hit_tokens > 0 && st.evictions > 0);
  CHECK(di_kv_check(m, 0) == DI_OK);
  di_kv_manager_free(m);
}

/* no_sharing (DeepSeek-V4: the state is not in the blocks): nothing is ever matched, not even for
 * samples of one request (force); bytes_per_seq comes off the planned budget first */
static void test_no_sharing_and_per_seq(void) {
  di_kv_group_info g = main_group();
  g.no_sharing = 1;
  int64_t nb = 16;
  di_kv_manager *m;
  CHECK(di_kv_manager_create(&g, 1, &nb, 1, &m) == DI_OK);
  CHECK(di_kv_shares_prefixes(m) == 0);
  int32_t tk[200];
  for (int i = 0; i < 200; i++) tk[i] = i;
  di_kv_seq s = {0}, t = {0};
  CHECK(di_kv_allocate(m, &s, 200) == DI_OK);
  di_kv_commit(m, &s, tk, 200);
  CHECK(di_kv_match_prefix(m, &t, tk, 200, 0) == 0);
  CHECK(di_kv_match_prefix(m, &t, tk, 200, 1) == 0);
  CHECK(t.n[0] == 0);
  di_kv_free_seq(m, &s);
  CHECK(di_kv_check(m, 0) == DI_OK);
  di_kv_manager_free(m);
  /* sharing groups still share */
  g.no_sharing = 0;
  CHECK(di_kv_manager_create(&g, 1, &nb, 1, &m) == DI_OK);
  CHECK(di_kv_shares_prefixes(m) == 1);
  di_kv_manager_free(m);
  /* plan: 1000 B/token = 64,000 B per block; 10 sequences of 100,000 B set aside first */
  g.bytes_per_seq = 100000;
  int64_t n_blocks;
  CHECK(plan_one_group(&g, 64000 * 20 + 1000000, 10, &n_blocks) == DI_OK && n_blocks == 20);
  g.bytes_per_seq = 0;
  CHECK(plan_one_group(&g, 64000 * 20 + 1000000, 10, &n_blocks) == DI_OK && n_blocks > 20);
  g.bytes_per_seq = 200000;
  CHECK_ERR(plan_one_group(&g, 1000000, 10, &n_blocks), "per-sequence state of 10 sequences");
}

/* a drafter-like group of 16-token blocks beside the 64-token main group */
static void test_small_blocks(void) {
  di_kv_group_info g[2] = {main_group(), {.n_layers = 1, .bytes_per_token = 100, .tokens_per_entry = 1, .block_tokens = 16}};
  int64_t nb[2];
  CHECK(di_kv_plan(g, 2, 64 * 1100 * 10, 4, 1, nb) == DI_OK);
  CHECKF(nb[0] == 10 && nb[1] == 40, "plan by tokens: %lld blocks of 64, %lld of 16", (long long)nb[0], (long long)nb[1]);
  di_kv_manager *m;
  int64_t cnt[2] = {8, 24};
  CHECK(di_kv_manager_create(g, 2, cnt, 1, &m) == DI_OK);
  CHECK(di_kv_group(m, 0)->block_tokens == 64 && di_kv_group(m, 1)->block_tokens == 16);
  int grp;
  int64_t need;
  CHECK(di_kv_fits(m, 384, 1, &grp, &need) == 1);                                /* 6 + 24 blocks */
  CHECK(di_kv_fits(m, 385, 1, &grp, &need) == 0 && grp == 1 && need == 25);       /* the 16-token group runs out first */
  di_kv_seq s = {0}, t = {0};
  CHECK(di_kv_allocate(m, &s, 100) == DI_OK);
  CHECK(s.n[0] == 2 && s.n[1] == 7);
  int32_t toks[300];
  for (int i = 0; i < 300; i++) toks[i] = (i * 7) % 11;
  di_kv_commit(m, &s, toks, 100); /* full blocks: 1 of 64, 6 of 16 */
  CHECK(s.n_hashed[0] == 1 && s.n_hashed[1] == 6);
  di_kv_truncate(m, &s, 70); /* keeps the hashed blocks: 2 and 6 (70 tokens need 5 of 16, 6 are hashed) */
  CHECK(s.n[0] == 2 && s.n[1] == 6);
  /* a hit of 64 tokens takes block 0 of the main group and blocks 0..3 of the small one */
  CHECK(di_kv_match_prefix(m, &t, toks, 200, 0) == 64);
  CHECK(t.n[0] == 1 && t.n[1] == 4 && t.n_hashed[1] == 4 && t.table[0][0] == s.table[0][0]);
  for (int i = 0; i < 4; i++) CHECK(t.table[1][i] == s.table[1][i]);
  CHECK(di_kv_check(m, di_kv_seq_refs(m, &s) + di_kv_seq_refs(m, &t)) == DI_OK);
  /* t goes on: its next blocks come fresh, its commit continues the 16-token chain */
  CHECK(di_kv_allocate(m, &t, 130) == DI_OK && t.n[0] == 3 && t.n[1] == 9);
  di_kv_commit(m, &t, toks, 130);
  CHECK(t.n_hashed[0] == 2 && t.n_hashed[1] == 8);
  di_kv_free_seq(m, &t);
  di_kv_free_seq(m, &s);
  /* both blocks of 64 tokens are cached in both groups: a 128-token hit */
  CHECK(di_kv_match_prefix(m, &t, toks, 200, 0) == 128 && t.n[1] == 8);
  di_kv_free_seq(m, &t);
  /* a hit needs every group: evict the small group's cached blocks (all 24 handed out), no hit */
  CHECK(di_kv_allocate(m, &s, 384) == DI_OK);
  di_kv_free_seq(m, &s);
  CHECK(di_kv_match_prefix(m, &t, toks, 200, 0) == 0 && t.n[0] == 0 && t.n[1] == 0);
  di_kv_stats st;
  di_kv_get_stats(m, &st);
  CHECK(st.used_blocks == 0 && st.total_blocks == 32);
  CHECK(di_kv_check(m, 0) == DI_OK);
  di_kv_manager_free(m);
  /* block sizes that do not divide 64, or on a window group, are refused */
  g[1].block_tokens = 24;
  CHECK_ERR(di_kv_manager_create(g, 2, cnt, 1, &m), "divisor");
  CHECK_ERR(di_kv_plan(g, 2, 1 << 20, 4, 1, nb), "divisor");
  g[1].block_tokens = 16;
  g[1].window = 128;
  g[1].kind = DI_KV_SLIDING;
  CHECK_ERR(di_kv_manager_create(g, 2, cnt, 1, &m), "full groups");
}

int main(void) {
  test_basic_and_prefix();
  test_groups();
  test_small_blocks();
  test_no_sharing_and_per_seq();
  test_random_walk();
  return test_finish("test_kv_manager");
}
