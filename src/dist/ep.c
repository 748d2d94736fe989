/* Expert-parallel exchange and placement (see ep.h). Per MoE layer call:
 *   1. each used (token, slot) picks a replica of its expert (the n-th use of expert e on rank r takes
 *      replica (n + r) mod replicas, spreading a hot expert's tokens over its replicas) and so a rank;
 *   2. rows per destination are all-gathered (N x N counts), hidden states and expert ids go out by
 *      one alltoallv each;
 *   3. the receiver sorts its rows by expert (stable), runs its experts, and sends the outputs back
 *      in the order they came; the sender puts each back at its (token, slot).
 * A step ends when a call's layer is not above the previous call's; steps drive the EPLB window. */
#include "dist/ep.h"
#include "dist/eplb.h"
#include "util/status.h"
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct di_ep {
  di_comm *comm;
  di_ep_config cfg;
  int N, me, L, E, H, G, P, scratch_per_row;
  int32_t *phy2log;   /* [L][P] */
  int32_t *rep_start; /* [L][E + 1]: replicas of expert e are rep_slot[l][rep_start[e] ..] */
  int32_t *rep_slot;  /* [L][P] */
  int64_t *window;    /* [W][L][E] local loads of the last W steps */
  int64_t step;
  int last_layer, rebalances;
  int32_t *seq;  /* the MoE layers of one forward, in call order (recorded from the first forward) */
  int n_seq, seq_done;
  di_ep_experts_fn listen_fn; /* the experts a listening rank runs for the others (di_ep_set_listener) */
  void *listen_user;
  di_ep_listen_layer_fn listen_layer; /* a backend's own exchange, joined with zero tokens (CUDA) */
  void *listen_layer_user;
  int64_t rows_computed;
  double exchange_s;
  /* grow-only buffers */
  size_t cap_send, cap_recv;
  float *send_x, *recv_x, *sorted, *out_sorted, *back, *scratch;
  int32_t *send_id, *recv_id, *dest, *pos, *order, *occ, *ecount;
  int64_t *counts_all; /* [N][N] */
  size_t *sb, *rb;     /* [N] bytes */
  int32_t *srows, *rrows;
};

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int rank_of_slot(const di_ep *ep, int p) { return (int)((int64_t)p * ep->N / ep->P); }

static void build_replicas(di_ep *ep, int l) {
  const int32_t *p2l = ep->phy2log + (size_t)l * ep->P;
  int32_t *st = ep->rep_start + (size_t)l * (ep->E + 1), *sl = ep->rep_slot + (size_t)l * ep->P;
  memset(st, 0, sizeof(int32_t) * (size_t)(ep->E + 1));
  for (int p = 0; p < ep->P; p++)
    st[p2l[p] + 1]++;
  for (int e = 0; e < ep->E; e++)
    st[e + 1] += st[e];
  int32_t *fill = ep->ecount; /* [E] scratch */
  memcpy(fill, st, sizeof(int32_t) * (size_t)ep->E);
  for (int p = 0; p < ep->P; p++)
    sl[fill[p2l[p]]++] = p;
}

static di_status place(di_ep *ep, int l, const double *load) {
  DI_TRY(di_eplb_rebalance(load, ep->E, ep->P, ep->G, ep->comm->n_nodes > 0 ? ep->comm->n_nodes : 1, ep->N,
                           ep->phy2log + (size_t)l * ep->P, NULL));
  build_replicas(ep, l);
  return DI_OK;
}

di_status di_ep_create(di_comm *comm, int n_layers, int n_experts, int hidden, int n_groups, int scratch_per_row,
                       const di_ep_config *cfg, di_ep **out) {
  *out = NULL;
  di_ep_config c = cfg ? *cfg : (di_ep_config){0};
  if (!c.enable_eplb)
    c.num_redundant_experts = 0;
  if (c.window_size <= 0)
    c.window_size = 1000;
  if (c.step_interval <= 0)
    c.step_interval = 3000;
  const int N = comm->size, P = n_experts + c.num_redundant_experts;
  if (n_experts <= 0 || n_layers <= 0 || c.num_redundant_experts < 0)
    return di_error_set(DI_ERR_INVALID_ARG, "expert parallel: %d experts, %d layers, %d redundant experts",
                        n_experts, n_layers, c.num_redundant_experts);
  if (P < N)
    return di_error_set(DI_ERR_INVALID_ARG,
                        "--enable-expert-parallel: %d expert slots for %d ranks: every rank needs one at least", P, N);
  if (c.enable_eplb && (P % N || (comm->n_nodes > 0 && N % comm->n_nodes)))
    return di_error_set(DI_ERR_INVALID_ARG,
                        "--eplb-config: %d experts + %d redundant = %d slots is not a multiple of the %d ranks",
                        n_experts, c.num_redundant_experts, P, N);
  di_ep *ep = calloc(1, sizeof *ep);
  if (!ep)
    return di_error_set(DI_ERR_OOM, "out of memory");
  *ep = (di_ep){.comm = comm, .cfg = c, .N = N, .me = comm->rank, .L = n_layers, .E = n_experts, .H = hidden,
                .G = n_groups, .P = P, .scratch_per_row = scratch_per_row, .last_layer = -1};
  ep->phy2log = malloc(sizeof(int32_t) * (size_t)n_layers * P);
  ep->rep_start = malloc(sizeof(int32_t) * (size_t)n_layers * (n_experts + 1));
  ep->rep_slot = malloc(sizeof(int32_t) * (size_t)n_layers * P);
  ep->window = calloc((size_t)c.window_size * n_layers * n_experts, sizeof(int64_t));
  ep->occ = malloc(sizeof(int32_t) * (size_t)n_experts);
  ep->ecount = malloc(sizeof(int32_t) * (size_t)(n_experts + 1));
  ep->counts_all = malloc(sizeof(int64_t) * (size_t)N * (N + 1));
  ep->seq = malloc(sizeof(int32_t) * (size_t)n_layers);
  ep->sb = malloc(sizeof(size_t) * (size_t)N);
  ep->rb = malloc(sizeof(size_t) * (size_t)N);
  ep->srows = malloc(sizeof(int32_t) * (size_t)N);
  ep->rrows = malloc(sizeof(int32_t) * (size_t)N);
  if (!ep->phy2log || !ep->rep_start || !ep->rep_slot || !ep->window || !ep->occ || !ep->ecount || !ep->counts_all || !ep->seq ||
      !ep->sb || !ep->rb || !ep->srows || !ep->rrows) {
    di_ep_destroy(ep);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  double *uniform = malloc(sizeof(double) * (size_t)n_experts);
  if (!uniform) {
    di_ep_destroy(ep);
    return di_error_set(DI_ERR_OOM, "out of memory");
  }
  for (int e = 0; e < n_experts; e++)
    uniform[e] = 1.0;
  di_status st = DI_OK;
  for (int l = 0; l < n_layers && st == DI_OK; l++) {
    if (c.enable_eplb) {
      st = place(ep, l, uniform);
    } else { /* contiguous blocks of experts, as many per rank as can be */
      for (int p = 0; p < P; p++)
        ep->phy2log[(size_t)l * P + p] = p;
      build_replicas(ep, l);
    }
  }
  free(uniform);
  if (st != DI_OK) {
    di_ep_destroy(ep);
    return st;
  }
  *out = ep;
  return DI_OK;
}

void di_ep_destroy(di_ep *ep) {
  if (!ep)
    return;
  void *ps[] = {ep->phy2log, ep->rep_start, ep->rep_slot, ep->window, ep->send_x, ep->recv_x, ep->sorted,
                ep->out_sorted, ep->back, ep->scratch, ep->send_id, ep->recv_id, ep->dest, ep->pos, ep->order,
                ep->occ, ep->ecount, ep->counts_all, ep->seq, ep->sb, ep->rb, ep->srows, ep->rrows};
  for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
    free(ps[i]);
  free(ep);
}

/* Every step_interval steps: the window's loads summed over the ranks, a new placement per layer. */
static di_status step_end(di_ep *ep) {
  ep->step++;
  const int W = ep->cfg.window_size;
  const size_t LE = (size_t)ep->L * ep->E;
  if (ep->cfg.enable_eplb && ep->step % ep->cfg.step_interval == 0) {
    double *mine = calloc(LE, sizeof(double)), *all = malloc(sizeof(double) * LE * ep->N);
    if (!mine || !all) {
      free(mine);
      free(all);
      return di_error_set(DI_ERR_OOM, "eplb: out of memory");
    }
    for (int w = 0; w < W; w++)
      for (size_t i = 0; i < LE; i++)
        mine[i] += (double)ep->window[(size_t)w * LE + i];
    di_status st = di_comm_allgather(ep->comm, mine, sizeof(double) * LE, all);
    for (size_t i = 0; st == DI_OK && i < LE; i++) {
      double s = 0;
      for (int r = 0; r < ep->N; r++) /* rank order: the same sum on every rank */
        s += all[(size_t)r * LE + i];
      mine[i] = s;
    }
    for (int l = 0; st == DI_OK && l < ep->L; l++) {
      double total = 0;
      for (int e = 0; e < ep->E; e++)
        total += mine[(size_t)l * ep->E + e];
      if (total > 0)
        st = place(ep, l, mine + (size_t)l * ep->E);
    }
    free(mine);
    free(all);
    DI_TRY(st);
    ep->rebalances++;
  }
  memset(ep->window + (size_t)(ep->step % W) * LE, 0, sizeof(int64_t) * LE);
  return DI_OK;
}

#define GROW(ptr, cap_need, type)                                   \
  do {                                                              \
    size_t n_ = (cap_need);                                        \
    void *np_ = realloc((ptr), sizeof(type) * (n_ > 0 ? n_ : 1)); \
    if (!np_)                                                       \
      return di_error_set(DI_ERR_OOM, "expert parallel: out of memory"); \
    (ptr) = np_;                                                    \
  } while (0)

static di_status reserve(di_ep *ep, size_t n_send, size_t n_recv) {
  const size_t H = (size_t)ep->H;
  if (n_send > ep->cap_send) {
    GROW(ep->send_x, n_send * H, float);
    GROW(ep->back, n_send * H, float);
    GROW(ep->send_id, n_send, int32_t);
    GROW(ep->dest, n_send, int32_t);
    GROW(ep->pos, n_send, int32_t);
    ep->cap_send = n_send;
  }
  if (n_recv > ep->cap_recv) {
    GROW(ep->recv_x, n_recv * H, float);
    GROW(ep->sorted, n_recv * H, float);
    GROW(ep->out_sorted, n_recv * H, float);
    GROW(ep->scratch, n_recv * (size_t)(ep->scratch_per_row > 0 ? ep->scratch_per_row : 1), float);
    GROW(ep->recv_id, n_recv, int32_t);
    GROW(ep->order, n_recv, int32_t);
    ep->cap_recv = n_recv;
  }
  return DI_OK;
}

static di_status exchange(di_ep *ep, const void *send, const int32_t *send_rows, void *recv, const int32_t *recv_rows,
                          size_t row_bytes) {
  for (int r = 0; r < ep->N; r++) {
    ep->sb[r] = (size_t)send_rows[r] * row_bytes;
    ep->rb[r] = (size_t)recv_rows[r] * row_bytes;
  }
  const double t0 = now_s();
  di_status st = di_comm_alltoallv(ep->comm, send, ep->sb, recv, ep->rb);
  ep->exchange_s += now_s() - t0;
  return st;
}

/* The start of a layer's call: ends the step when the layer is not above the previous call's (EPLB
 * may rebalance then), counts the loads and picks each used slot's physical slot (-1: unused). */
static di_status pick_slots(di_ep *ep, int layer, const int32_t *ids, size_t n, int real, int32_t *slot) {
  if (layer < 0 || layer >= ep->L)
    return di_error_set(DI_ERR_INTERNAL, "expert parallel: layer %d of %d", layer, ep->L);
  if (layer <= ep->last_layer) {
    ep->seq_done = 1;
    DI_TRY(step_end(ep));
  }
  if (!ep->seq_done && real)
    ep->seq[ep->n_seq++] = layer;
  ep->last_layer = layer;
  const int E = ep->E;
  const size_t LE = (size_t)ep->L * E;
  int64_t *load = ep->window + (size_t)(ep->step % ep->cfg.window_size) * LE + (size_t)layer * E;
  const int32_t *st = ep->rep_start + (size_t)layer * (E + 1), *sl = ep->rep_slot + (size_t)layer * ep->P;
  memset(ep->occ, 0, sizeof(int32_t) * (size_t)E);
  for (size_t i = 0; i < n; i++) {
    const int e = ids[i];
    if (e < 0) {
      slot[i] = -1;
      continue;
    }
    if (e >= E)
      return di_error_set(DI_ERR_INTERNAL, "expert parallel: expert %d of %d", e, E);
    load[e]++;
    const int nrep = st[e + 1] - st[e];
    slot[i] = sl[st[e] + (ep->occ[e]++ + ep->me) % nrep];
  }
  return DI_OK;
}

di_status di_ep_pick_slots(di_ep *ep, int layer, const int32_t *ids, int n, int32_t *slot) {
  return pick_slots(ep, layer, ids, (size_t)(n > 0 ? n : 0), 1, slot);
}

di_status di_ep_pick_slots_listening(di_ep *ep, int layer) { return pick_slots(ep, layer, NULL, 0, 0, NULL); }

void di_ep_set_listen_layer(di_ep *ep, di_ep_listen_layer_fn fn, void *user) {
  ep->listen_layer = fn;
  ep->listen_layer_user = user;
}

int di_ep_has_forward(const di_ep *ep) { return ep && ep->n_seq > 0; }

void di_ep_count_rows(di_ep *ep, int64_t rows) { ep->rows_computed += rows; }

/* real: called by a forward (1) or by a listening rank (0). *any_real: whether any rank's call was a
 * forward's; when none was, every rank is listening and the exchange stops after the counts. */
static di_status routed(di_ep *ep, int layer, const float *x, int T, const int32_t *ids, int K, float *y,
                        di_ep_experts_fn fn, void *user, int real, int *any_real) {
  const int N = ep->N, H = ep->H, E = ep->E;
  const size_t n_slots = (size_t)T * K;
  DI_TRY(reserve(ep, n_slots, 0));
  /* 1. destination of each used slot */
  DI_TRY(pick_slots(ep, layer, ids, n_slots, real, ep->dest));
  memset(ep->srows, 0, sizeof(int32_t) * (size_t)N);
  for (size_t i = 0; i < n_slots; i++)
    if (ep->dest[i] >= 0) {
      ep->dest[i] = rank_of_slot(ep, ep->dest[i]);
      ep->srows[ep->dest[i]]++;
    }
  /* 2. counts to everyone, then the rows and their expert ids */
  int64_t mine[257]; /* rows to each rank, then the real flag */
  int64_t *mrow = N <= 256 ? mine : malloc(sizeof(int64_t) * (size_t)(N + 1));
  if (!mrow)
    return di_error_set(DI_ERR_OOM, "expert parallel: out of memory");
  for (int r = 0; r < N; r++)
    mrow[r] = ep->srows[r];
  mrow[N] = real;
  const double t0 = now_s();
  di_status s = di_comm_allgather(ep->comm, mrow, sizeof(int64_t) * (size_t)(N + 1), ep->counts_all);
  ep->exchange_s += now_s() - t0;
  if (mrow != mine)
    free(mrow);
  DI_TRY(s);
  size_t n_recv = 0;
  *any_real = 0;
  for (int r = 0; r < N; r++) {
    ep->rrows[r] = (int32_t)ep->counts_all[(size_t)r * (N + 1) + ep->me];
    n_recv += (size_t)ep->rrows[r];
    *any_real |= ep->counts_all[(size_t)r * (N + 1) + N] != 0;
  }
  if (!*any_real)
    return DI_OK;
  DI_TRY(reserve(ep, n_slots, n_recv));
  {
    int32_t off[256], *o = N <= 256 ? off : malloc(sizeof(int32_t) * (size_t)N);
    if (!o)
      return di_error_set(DI_ERR_OOM, "expert parallel: out of memory");
    for (int r = 0, acc = 0; r < N; r++) {
      o[r] = acc;
      acc += ep->srows[r];
    }
    for (size_t i = 0; i < n_slots; i++) {
      if (ep->dest[i] < 0)
        continue;
      const int p = o[ep->dest[i]]++;
      ep->pos[i] = p;
      memcpy(ep->send_x + (size_t)p * H, x + (i / (size_t)K) * H, sizeof(float) * (size_t)H);
      ep->send_id[p] = ids[i];
    }
    if (o != off)
      free(o);
  }
  DI_TRY(exchange(ep, ep->send_x, ep->srows, ep->recv_x, ep->rrows, sizeof(float) * (size_t)H));
  DI_TRY(exchange(ep, ep->send_id, ep->srows, ep->recv_id, ep->rrows, sizeof(int32_t)));
  /* 3. this rank's experts over what came, sorted by expert (stable) */
  int32_t *cnt = ep->ecount, *fill = ep->occ; /* occ is free again after step 1 */
  memset(cnt, 0, sizeof(int32_t) * (size_t)E);
  for (size_t j = 0; j < n_recv; j++) {
    if (ep->recv_id[j] < 0 || ep->recv_id[j] >= E)
      return di_error_set(DI_ERR_INTERNAL, "expert parallel: received expert %d of %d", ep->recv_id[j], E);
    cnt[ep->recv_id[j]]++;
  }
  for (int e = 0, acc = 0; e < E; e++) {
    fill[e] = acc;
    acc += cnt[e];
  }
  for (size_t j = 0; j < n_recv; j++)
    ep->order[fill[ep->recv_id[j]]++] = (int32_t)j;
  for (size_t k = 0; k < n_recv; k++)
    memcpy(ep->sorted + k * H, ep->recv_x + (size_t)ep->order[k] * H, sizeof(float) * (size_t)H);
  ep->rows_computed += (int64_t)n_recv;
  if (n_recv && !fn)
    return di_error_set(DI_ERR_UNSUPPORTED, "expert parallel: rows for a rank whose model set no listener "
                                            "(data parallel is not supported for this architecture yet)");
  if (n_recv)
    DI_TRY(fn(user, layer, ep->sorted, cnt, (int)n_recv, ep->out_sorted, ep->scratch));
  for (size_t k = 0; k < n_recv; k++)
    memcpy(ep->recv_x + (size_t)ep->order[k] * H, ep->out_sorted + k * H, sizeof(float) * (size_t)H);
  /* 4. outputs back to where the rows came from */
  DI_TRY(exchange(ep, ep->recv_x, ep->rrows, ep->back, ep->srows, sizeof(float) * (size_t)H));
  for (size_t i = 0; i < n_slots; i++)
    if (ep->dest[i] >= 0)
      memcpy(y + i * H, ep->back + (size_t)ep->pos[i] * H, sizeof(float) * (size_t)H);
  return DI_OK;
}

di_status di_ep_routed(di_ep *ep, int layer, const float *x, int T, const int32_t *ids, int K, float *y,
                       di_ep_experts_fn fn, void *user) {
  int any_real;
  return routed(ep, layer, x, T, ids, K, y, fn, user, 1, &any_real);
}

void di_ep_set_listener(di_ep *ep, di_ep_experts_fn fn, void *user) {
  ep->listen_fn = fn;
  ep->listen_user = user;
}

di_status di_ep_listen(di_ep *ep) {
  if (!ep->n_seq)
    return di_error_set(DI_ERR_INTERNAL, "expert parallel: a rank listens before any forward (run one first)");
  for (;;)
    for (int i = 0; i < ep->n_seq; i++) {
      int any_real = 0;
      if (ep->listen_layer)
        DI_TRY(ep->listen_layer(ep->listen_layer_user, ep->seq[i], &any_real));
      else
        DI_TRY(routed(ep, ep->seq[i], NULL, 0, NULL, 1, NULL, ep->listen_fn, ep->listen_user, 0, &any_real));
      if (!any_real)
        return DI_OK; /* only at a round's first layer: rounds are aligned with the forwards */
    }
}

di_status di_ep_imbalance(di_ep *ep, double *imbalance, int64_t *local_rows) {
  int64_t *all = malloc(sizeof(int64_t) * (size_t)ep->N);
  if (!all)
    return di_error_set(DI_ERR_OOM, "out of memory");
  di_status st = di_comm_allgather(ep->comm, &ep->rows_computed, sizeof(int64_t), all);
  if (st == DI_OK) {
    double mx = 0, sum = 0;
    for (int r = 0; r < ep->N; r++) {
      sum += (double)all[r];
      mx = (double)all[r] > mx ? (double)all[r] : mx;
    }
    *imbalance = sum > 0 ? mx / (sum / ep->N) : 1.0;
  }
  if (local_rows)
    *local_rows = ep->rows_computed;
  free(all);
  return st;
}

void di_ep_reset_stats(di_ep *ep) {
  ep->rows_computed = 0;
  ep->exchange_s = 0;
}
int di_ep_rebalances(const di_ep *ep) { return ep->rebalances; }
int di_ep_slot_expert(const di_ep *ep, int layer, int slot) { return ep->phy2log[(size_t)layer * ep->P + slot]; }
int di_ep_slots(const di_ep *ep) { return ep->P; }
double di_ep_exchange_seconds(const di_ep *ep) { return ep->exchange_s; }
