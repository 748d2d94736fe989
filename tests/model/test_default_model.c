/* The shipped default model (models/default/, issue 7) against its reference fixtures
 * (tests/data/default-model/): main-model logits vs transformers 5.17 (rel L2 < 1e-4), final hidden
 * states vs the training code, and the MTP module (CPU backend) vs the training code's PyTorch MTP
 * forward, fed the fixture's hidden states and the next tokens (rel L2 < 1e-4). */
#include "api/model_internal.h"
#include "backend/cpu/cpu_backend.h"
#include "model/safetensors.h"
#include "test_util.h"
#include "test_models.h"
#include <math.h>
#include <stdlib.h>
#include <string.h>


/* One prompt: main forward with logits and hidden states of every row, then the MTP layer over rows
 * 0..T-2 (token ids[i+1], hidden h[i]) in the same block table. */
static void check_prompt(di_model *m, const di_st_file *g, const di_st_file *mg, int p) {
  const di_st_tensor *tid = test_st_findf(g, "p%d.ids", p), *tlog = test_st_findf(g, "p%d.logits", p);
  const di_st_tensor *thid = test_st_findf(mg, "p%d.hidden", p), *tmtp = test_st_findf(mg, "p%d.mtp_logits", p);
  CHECKF(tid && tlog && thid, "p%d: fixture tensors missing", p);
  if (!tid || !tlog || !thid)
    return;
  const int T = (int)tid->shape[0], V = m->cfg.vocab_size, H = m->cfg.hidden_size;
  const int32_t *ids = tid->data;
  const int nb = (T + DI_KV_BLOCK_SIZE - 1) / DI_KV_BLOCK_SIZE;
  di_status st = m->backend->ops->kv_alloc(m->backend, nb + 1);
  CHECKF(st == DI_OK, "%s", di_last_error());
  int32_t *table = malloc(sizeof(int32_t) * (size_t)nb), *pos = malloc(sizeof(int32_t) * (size_t)T);
  int32_t *seq = calloc((size_t)T, sizeof(int32_t)), *rows = malloc(sizeof(int32_t) * (size_t)T);
  float *lg = malloc(sizeof(float) * (size_t)T * V), *hid = malloc(sizeof(float) * (size_t)T * H);
  for (int i = 0; i < nb; i++)
    table[i] = nb - i; /* not the identity, so paging is exercised */
  for (int i = 0; i < T; i++)
    pos[i] = rows[i] = i;
  di_batch_seq bs = {table, nb, 0};
  di_batch b = {.n_tokens = T, .tokens = ids, .positions = pos, .seq_of = seq, .n_seqs = 1, .seqs = &bs,
                .n_outputs = T, .output_rows = rows};
  st = m->backend->ops->submit(m->backend, &b);
  if (st == DI_OK)
    st = m->backend->ops->wait(m->backend, lg, hid);
  CHECKF(st == DI_OK, "%s", di_last_error());
  if (st == DI_OK) {
    double e1 = test_rel_l2(lg, tlog->data, (size_t)T * V), e2 = test_rel_l2(hid, thid->data, (size_t)T * H);
    CHECKF(e1 < 1e-4, "p%d: logits rel L2 %.3e", p, e1);
    CHECKF(e2 < 1e-4, "p%d: hidden rel L2 %.3e", p, e2);
    printf("default p%d T=%d: logits rel err %.2e, hidden rel err %.2e\n", p, T, e1, e2);
  }
  if (T > 1 && st == DI_OK) {
    CHECKF(tmtp != NULL, "p%d.mtp_logits missing", p);
    CHECK(strcmp(m->backend->ops->name, "cpu") == 0);
    if (tmtp && strcmp(m->backend->ops->name, "cpu") == 0) {
      /* Row i: token ids[i+1] at position i, previous hidden = the fixture's h[i]. */
      di_batch mb = {.n_tokens = T - 1, .tokens = ids + 1, .positions = pos, .seq_of = seq, .n_seqs = 1, .seqs = &bs,
                     .n_outputs = T - 1, .output_rows = rows};
      st = di_cpu_deepseek_mtp_forward((di_cpu_backend *)m->backend, 0, &mb, thid->data, lg, NULL);
      CHECKF(st == DI_OK, "%s", di_last_error());
      if (st == DI_OK) {
        double e3 = test_rel_l2(lg, tmtp->data, (size_t)(T - 1) * V);
        CHECKF(e3 < 1e-4, "p%d: MTP logits rel L2 %.3e", p, e3);
        printf("default p%d: MTP logits rel err %.2e\n", p, e3);
      }
    }
  }
  free(table);
  free(pos);
  free(seq);
  free(rows);
  free(lg);
  free(hid);
}

int main(void) {
  di_model_options opt;
  di_model_options_default(&opt);
  opt.quiet = 1;
  opt.threads = 2;
  di_model *m = NULL;
  di_status st = di_model_load(test_path("models/default"), &opt, &m);
  CHECKF(st == DI_OK, "models/default: %s", di_last_error());
  if (st != DI_OK)
    return test_finish("default_model");
  CHECK(m->cfg.vocab_size == 8192);
  CHECK(m->weights.n_mtp == 1);
  di_st_file g, mg;
  st = di_st_open(test_path("tests/data/default-model/golden.safetensors"), &g);
  CHECKF(st == DI_OK, "%s", di_last_error());
  di_status st2 = di_st_open(test_path("tests/data/default-model/mtp_golden.safetensors"), &mg);
  CHECKF(st2 == DI_OK, "%s", di_last_error());
  if (st == DI_OK && st2 == DI_OK)
    for (int p = 0; p < 3; p++)
      check_prompt(m, &g, &mg, p);
  if (st == DI_OK)
    di_st_file_close(&g);
  if (st2 == DI_OK)
    di_st_file_close(&mg);
  di_model_free(m);
  return test_finish("default_model");
}
