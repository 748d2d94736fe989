/* The listener hook of the expert-parallel exchange (src/dist/ep.c) that the CUDA backends use
 * (cuda_ep.cu: their own exchange, joined with zero tokens by a data-parallel rank with no work), on
 * one rank without MPI: a placement records the MoE layer order of its first forward (and only of
 * forwards: a listening call does not extend it), di_ep_listen replays that order through the hook
 * round after round and stops at the first layer of a round where no rank was in a forward, and
 * without a recorded forward it refuses with a message. Slots without EPLB are the experts. */
#include "dist/comm.h"
#include "dist/ep.h"
#include "test_util.h"
#include <stdint.h>
#include <string.h>

typedef struct {
  int layers[32], n, rounds_real; /* calls seen; how many calls report a forward somewhere */
} hook_log;

static di_status hook(void *user, int layer, int *any_real) {
  hook_log *h = user;
  if (h->n < 32)
    h->layers[h->n] = layer;
  *any_real = h->n++ < h->rounds_real;
  return DI_OK;
}

int main(void) {
  di_comm *c = NULL;
  CHECK(di_comm_self_create(&c) == DI_OK);
  di_ep *ep = NULL;
  CHECK(di_ep_create(c, 6, 8, 4, 1, 0, NULL, &ep) == DI_OK);
  CHECK(!di_ep_has_forward(ep));
  CHECK_ERR(di_ep_listen(ep), "before any forward");
  /* a forward over MoE layers 1, 3, 4 (layers 0 and 2 dense): slot == expert, unused stays -1 */
  const int32_t ids[4] = {5, -1, 0, 7};
  int32_t slot[4];
  const int order[3] = {1, 3, 4};
  for (int i = 0; i < 3; i++) {
    CHECK(di_ep_pick_slots(ep, order[i], ids, 4, slot) == DI_OK);
    CHECK(slot[0] == 5 && slot[1] == -1 && slot[2] == 0 && slot[3] == 7);
  }
  CHECK(di_ep_has_forward(ep));
  /* a listening call (the next step) must not add to the order */
  CHECK(di_ep_pick_slots_listening(ep, 1) == DI_OK);
  CHECK(di_ep_pick_slots_listening(ep, 3) == DI_OK);
  hook_log h = {.rounds_real = 3};
  di_ep_set_listen_layer(ep, hook, &h);
  CHECK(di_ep_listen(ep) == DI_OK);
  /* one round where another rank was in a forward (layers 1 3 4), then the next round's first call
   * finds none: the listen returns there */
  CHECKF(h.n == 4, "%d hook calls", h.n);
  const int want[4] = {1, 3, 4, 1};
  for (int i = 0; i < 4 && i < h.n; i++)
    CHECKF(h.layers[i] == want[i], "call %d: layer %d, want %d", i, h.layers[i], want[i]);
  /* no forward anywhere: one call, at the round's first layer */
  h = (hook_log){.rounds_real = 0};
  CHECK(di_ep_listen(ep) == DI_OK);
  CHECK(h.n == 1 && h.layers[0] == 1);
  di_ep_set_listen_layer(ep, NULL, NULL);
  di_ep_destroy(ep);
  di_comm_destroy(c);
  return test_finish("test_ep_listen_hook");
}
