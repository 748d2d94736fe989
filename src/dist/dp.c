/* The data-parallel iteration (see dp.h). One iteration: all-gather each rank's load; rank 0 places
 * the next arrivals and broadcasts where they go; each rank adds its own, steps its engine if it has
 * work, then listens until no rank is in a forward. The outputs of every request are all-gathered at
 * the end (rows of max_tokens + 2 ints: length, finish reason, ids), rank 0 keeps them. */
#include "dist/dp.h"
#include "util/status.h"
#include <stdlib.h>
#include <string.h>

typedef struct {
  uint64_t req_id;
  int index, n_out, finished;
  di_finish_reason finish;
  int32_t *ids;
} dp_local;

void di_dp_results_free(di_dp_result *out, int n) {
  for (int i = 0; out && i < n; i++) {
    free(out[i].ids);
    out[i].ids = NULL;
  }
}

static di_status collect(di_step_output *so, dp_local *loc, int n_loc, const di_request_params *reqs) {
  for (int s = 0; so && s < so->n; s++) {
    const di_seq_output *q = &so->seqs[s];
    dp_local *l = NULL;
    for (int i = 0; i < n_loc && !l; i++)
      if (loc[i].req_id == q->req_id)
        l = &loc[i];
    if (!l || q->sample_index != 0)
      continue;
    const int cap = reqs[l->index].max_tokens;
    for (int k = 0; k < q->n_new_tokens && l->n_out < cap; k++)
      l->ids[l->n_out++] = q->new_tokens[k];
    if (q->finish_reason != DI_FINISH_NONE) {
      l->finished = 1;
      l->finish = q->finish_reason;
    }
  }
  return DI_OK;
}

di_status di_dp_generate(di_comm *c, di_engine *e, di_ep *ep, const di_request_params *reqs, int n, int arrivals,
                         di_dp_result *out) {
  const int N = c->size, me = c->rank;
  int cap = 1;
  for (int i = 0; i < n; i++) {
    if (reqs[i].n > 1)
      return di_error_set(DI_ERR_UNSUPPORTED, "data parallel driver: request %d has n = %d (one sample each)", i,
                          reqs[i].n);
    if (reqs[i].max_tokens < 1)
      return di_error_set(DI_ERR_INVALID_ARG, "data parallel driver: request %d needs max_tokens >= 1", i);
    cap = reqs[i].max_tokens > cap ? reqs[i].max_tokens : cap;
  }
  if (arrivals < 1)
    arrivals = 1;
  dp_local *loc = calloc((size_t)n + 1, sizeof *loc);
  int64_t *loads = malloc(sizeof(int64_t) * (size_t)N), *est = malloc(sizeof(int64_t) * (size_t)N);
  int32_t *where = malloc(sizeof(int32_t) * (size_t)n + 4);
  int32_t *rows = calloc((size_t)n * (cap + 2), sizeof(int32_t)), *all = NULL;
  di_status st = DI_OK;
  if (!loc || !loads || !est || !where || !rows) {
    st = di_error_set(DI_ERR_OOM, "data parallel: out of memory");
    goto done;
  }
  int n_loc = 0, next = 0;
  for (;;) {
    int64_t my = 0;
    for (int i = 0; i < n_loc; i++)
      if (!loc[i].finished)
        my += (int64_t)reqs[loc[i].index].n_prompt_ids + loc[i].n_out;
    if (!my && di_engine_has_unfinished(e))
      my = 1;
    if ((st = di_comm_allgather(c, &my, sizeof my, loads)) != DI_OK)
      goto done;
    int busy = 0;
    for (int r = 0; r < N; r++)
      busy |= loads[r] != 0;
    if (!busy && next >= n)
      break;
    const int k = n - next < arrivals ? n - next : arrivals;
    if (k > 0) {
      if (me == 0) { /* least load first; the estimate grows by each placed prompt */
        memcpy(est, loads, sizeof(int64_t) * (size_t)N);
        for (int j = 0; j < k; j++) {
          int best = 0;
          for (int r = 1; r < N; r++)
            if (est[r] < est[best])
              best = r;
          where[next + j] = best;
          est[best] += reqs[next + j].n_prompt_ids;
        }
      }
      if ((st = di_comm_broadcast(c, where + next, sizeof(int32_t) * (size_t)k, 0)) != DI_OK)
        goto done;
      for (int j = 0; j < k; j++) {
        out[next + j].rank = where[next + j];
        if (where[next + j] != me)
          continue;
        dp_local *l = &loc[n_loc];
        l->index = next + j;
        l->ids = rows + (size_t)(next + j) * (cap + 2) + 2;
        if ((st = di_engine_add_request(e, &reqs[next + j], &l->req_id)) != DI_OK)
          goto done;
        n_loc++;
      }
      next += k;
    }
    if (di_engine_has_unfinished(e)) {
      di_step_output *so = NULL;
      if ((st = di_engine_step(e, &so)) != DI_OK || (st = collect(so, loc, n_loc, reqs)) != DI_OK)
        goto done;
    }
    if (ep && (st = di_ep_listen(ep)) != DI_OK)
      goto done;
  }
  for (int i = 0; i < n_loc; i++) {
    int32_t *row = rows + (size_t)loc[i].index * (cap + 2);
    row[0] = loc[i].n_out;
    row[1] = (int32_t)loc[i].finish;
  }
  const size_t row_bytes = sizeof(int32_t) * (size_t)n * (cap + 2);
  all = malloc(row_bytes * (size_t)N);
  if (!all) {
    st = di_error_set(DI_ERR_OOM, "data parallel: out of memory");
    goto done;
  }
  if ((st = di_comm_allgather(c, rows, row_bytes, all)) != DI_OK)
    goto done;
  if (me == 0)
    for (int i = 0; i < n; i++) {
      const int32_t *row = all + (size_t)out[i].rank * n * (cap + 2) + (size_t)i * (cap + 2);
      out[i].n_ids = row[0];
      out[i].finish = (di_finish_reason)row[1];
      out[i].ids = malloc(sizeof(int32_t) * (size_t)(row[0] + 1));
      if (!out[i].ids) {
        st = di_error_set(DI_ERR_OOM, "data parallel: out of memory");
        goto done;
      }
      memcpy(out[i].ids, row + 2, sizeof(int32_t) * (size_t)row[0]);
    }
done:
  free(loc);
  free(loads);
  free(est);
  free(where);
  free(rows);
  free(all);
  return st;
}
