/* The fixture checkpoints (tests/data/models/, made by HF transformers 5.17) against their golden
 * outputs: logits relative L2 error < 1e-4 at every position; greedy continuations equal wherever
 * the reference top-1/top-2 margin exceeds 1e-3; and token-by-token decode through the paged cache
 * equal to the whole-sequence pass (relative error < 1e-5). */
#include "api/model_internal.h"
#include "model/safetensors.h"
#include "test_util.h"
#include "test_models.h"
#include <math.h>
#include <stdlib.h>
#include <unistd.h>




/* Decodes `ids` one token per step through the cache; logits of every step into `out`. */
static di_status decode_stepwise(di_model *m, const int32_t *ids, int n, float *out) {
  const int nb = (n + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE + 1;
  DI_TRY(m->backend->ops->kv_alloc(m->backend, nb + 3));
  int32_t table[64];
  /* a scrambled block table, so that paging is really exercised */
  for (int i = 0; i < nb; i++)
    table[i] = (nb + 2) - i;
  di_batch_seq s = {table, nb, 0};
  for (int i = 0; i < n; i++) {
    int32_t pos = i, seq = 0, row = 0;
    di_batch b = {.n_tokens = 1, .tokens = ids + i, .positions = &pos, .seq_of = &seq, .n_seqs = 1, .seqs = &s,
                  .n_outputs = 1, .output_rows = &row};
    DI_TRY(di_backend_forward(m->backend, &b, out + (size_t)i * m->cfg.vocab_size));
  }
  return DI_OK;
}

/* `name` is the model folder; `golden_dir` the folder holding golden.safetensors (NULL: the same). */
static void check_case(const char *name, const char *golden_dir) {
  char dir[512], gpath[600];
  snprintf(dir, sizeof dir, "%s", name[0] == '/' ? name : test_path(name));
  snprintf(gpath, sizeof gpath, "%s/golden.safetensors", golden_dir ? test_path(golden_dir) : dir);
  di_model_options opt;
  di_model_options_default(&opt);
  opt.quiet = 1;
  opt.threads = 2;
  di_model *m = NULL;
  di_status st = di_model_load(dir, &opt, &m);
  CHECKF(st == DI_OK, "%s: %s", name, di_last_error());
  if (st != DI_OK)
    return;
  di_st_file g;
  st = di_st_open(gpath, &g);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st != DI_OK) {
    di_model_free(m);
    return;
  }
  const int V = m->cfg.vocab_size;
  for (int p = 0; p < 3; p++) {
    const di_st_tensor *tid = test_st_findf(&g, "p%d.ids", p), *tlog = test_st_findf(&g, "p%d.logits", p);
    const di_st_tensor *tgr = test_st_findf(&g, "p%d.greedy", p), *tmar = test_st_findf(&g, "p%d.margin", p);
    CHECK(tid && tlog && tgr && tmar);
    if (!tid || !tlog || !tgr || !tmar)
      continue;
    const int T = (int)tid->shape[0], G = (int)tgr->shape[0];
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(T + G));
    memcpy(seq, tid->data, sizeof(int32_t) * (size_t)T);
    float *lg = malloc(sizeof(float) * (size_t)(T + G) * V), *lg2 = malloc(sizeof(float) * (size_t)(T + G) * V);
    st = di_model_score(m, seq, T, lg);
    CHECKF(st == DI_OK, "%s", di_last_error());
    double err = test_rel_l2(lg, tlog->data, (size_t)T * V);
    CHECKF(err < 1e-4, "%s p%d: logits rel L2 error %.3e", name, p, err);
    printf("%s p%d T=%d logits rel err %.2e\n", name, p, T, err);
    /* greedy continuation: prefill the prompt, then one cached decode step per token */
    const int32_t *gold = tgr->data;
    const float *margin = tmar->data;
    int n = T;
    {
      const int nb = (T + G + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
      st = m->backend->ops->kv_alloc(m->backend, nb);
      CHECK(st == DI_OK);
      int32_t table[64], *pos = malloc(sizeof(int32_t) * (size_t)(T + G)), *sq = calloc((size_t)(T + G), sizeof(int32_t));
      for (int i = 0; i < nb; i++)
        table[i] = i;
      for (int i = 0; i < T + G; i++)
        pos[i] = i;
      di_batch_seq bs = {table, nb, 0};
      int32_t last = T - 1;
      di_batch pre = {.n_tokens = T, .tokens = seq, .positions = pos, .seq_of = sq, .n_seqs = 1, .seqs = &bs,
                      .n_outputs = 1, .output_rows = &last};
      st = di_backend_forward(m->backend, &pre, lg);
      for (int s2 = 0; s2 < G && st == DI_OK; s2++) {
        int tok = test_argmax(lg, V);
        if (margin[s2] > 1e-3f)
          CHECKF(tok == gold[s2], "%s p%d greedy step %d: got %d, reference %d (margin %.3g)", name, p, s2, tok, gold[s2],
                 margin[s2]);
        seq[n] = gold[s2]; /* follow the reference path so later steps stay comparable */
        int32_t row = 0;
        di_batch one = {.n_tokens = 1, .tokens = seq + n, .positions = pos + n, .seq_of = sq, .n_seqs = 1, .seqs = &bs,
                        .n_outputs = 1, .output_rows = &row};
        n++;
        if (s2 + 1 < G)
          st = di_backend_forward(m->backend, &one, lg);
      }
      CHECKF(st == DI_OK, "%s", di_last_error());
      free(pos);
      free(sq);
    }
    /* token-by-token decode through the cache equals the whole-sequence pass */
    st = di_model_score(m, seq, n, lg);
    CHECK(st == DI_OK);
    st = decode_stepwise(m, seq, n, lg2);
    CHECKF(st == DI_OK, "%s", di_last_error());
    double derr = test_rel_l2(lg2, lg, (size_t)n * V);
    CHECKF(derr < 1e-5, "%s p%d: decode vs prefill rel error %.3e", name, p, derr);
    free(seq);
    free(lg);
    free(lg2);
  }
  di_st_file_close(&g);
  di_model_free(m);
}

/* The transformers>=5 dialect (rope_parameters) of dsv3-odd: its config.json with dsv3-odd's weights. */
static void check_v5_dialect(void) {
  char tmpl[] = "/tmp/di_v5cfg_XXXXXX";
  char *d = mkdtemp(tmpl);
  CHECK(d != NULL);
  if (!d)
    return;
  char a[1200], b[600];
  const char *files[][2] = {{"tests/data/models/dsv3-odd-v5config/config.json", "config.json"},
                            {"tests/data/models/dsv3-odd/model.safetensors", "model.safetensors"}};
  for (int i = 0; i < 2; i++) {
    snprintf(a, sizeof a, "%s", test_path(files[i][0]));
    if (a[0] != '/') { /* make relative paths absolute for the link */
      char cwd[400], t[sizeof a];
      if (getcwd(cwd, sizeof cwd) && strlen(cwd) + strlen(a) + 2 < sizeof t) {
        size_t lc = strlen(cwd), la = strlen(a);
        memcpy(t, a, la + 1);
        memcpy(a, cwd, lc);
        a[lc] = '/';
        memcpy(a + lc + 1, t, la + 1);
      }
    }
    snprintf(b, sizeof b, "%s/%s", d, files[i][1]);
    CHECK(symlink(a, b) == 0);
  }
  check_case(d, "tests/data/models/dsv3-odd");
  for (int i = 0; i < 2; i++) {
    snprintf(b, sizeof b, "%s/%s", d, files[i][1]);
    unlink(b);
  }
  rmdir(d);
}

int main(void) {
  const char *cases[] = {"tests/data/models/dsv3-tiny",      "tests/data/models/dsv3-tiny-fp8", "tests/data/models/dsv2-lite-tiny",
                         "tests/data/models/dsv2-tiny",      "tests/data/models/dsv3-odd",      "tests/data/models/dsv2-yarn-tied",
                         "tests/data/models/dsv3-halfsplit", "tests/data/models/dsv3-fp8-16x12"};
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
    check_case(cases[i], NULL);
  check_v5_dialect();
  return test_finish("test_fixtures");
}
