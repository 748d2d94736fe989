/* The KV cache groups declared by each architecture's registry entry (api/arch_registry.h) are the
 * ones its backend reports to the engine: V2 (dsv2-tiny), V3 with an MTP layer (dsv3-tiny) and V4
 * (dsv4-tiny, several groups) on the CPU, field for field at the CPU's 4-byte values (bytes_per_seq,
 * the backend's own, aside). The entry's declaration scales with the element size, and the CUDA
 * form of V2/V3's (bf16 rows padded to 576 values) is the same declaration with the backend's row. */
#include "api/model_internal.h"
#include "test_util.h"
#include <string.h>

static void check_model(const char *dir, int want_groups) {
  di_model_options opt;
  di_model_options_default(&opt);
  opt.quiet = 1;
  opt.threads = 1;
  opt.accelerator = "cpu";
  di_model *m = NULL;
  di_status st = di_model_load(test_path(dir), &opt, &m);
  CHECKF(st == DI_OK, "%s: %s", dir, di_last_error());
  if (st != DI_OK) return;
  di_kv_group_info be[DI_KV_MAX_GROUPS], ent[DI_KV_MAX_GROUPS], ent2[DI_KV_MAX_GROUPS];
  memset(be, 0, sizeof be);
  memset(ent, 0, sizeof ent);
  memset(ent2, 0, sizeof ent2);
  const int nb = m->backend->ops->kv_groups(m->backend, be, DI_KV_MAX_GROUPS);
  const int ne = m->arch->kv_groups(m, 4, ent, DI_KV_MAX_GROUPS);
  CHECKF(nb == ne && ne == want_groups, "%s: backend %d groups, entry %d, expected %d", dir, nb, ne, want_groups);
  CHECKF(m->arch->kv_groups(m, 2, ent2, DI_KV_MAX_GROUPS) == ne, "%s: group count depends on the element size", dir);
  for (int g = 0; g < ne && g < nb; g++) {
    be[g].bytes_per_seq = 0; /* the backend's (V4's open compressor windows) */
    CHECKF(memcmp(&be[g], &ent[g], sizeof be[g]) == 0,
           "%s group %d: backend kind %d layers %d bytes/token %lld entry %d window %d; entry kind %d layers %d "
           "bytes/token %lld entry %d window %d",
           dir, g, be[g].kind, be[g].n_layers, (long long)be[g].bytes_per_token, be[g].tokens_per_entry, be[g].window,
           ent[g].kind, ent[g].n_layers, (long long)ent[g].bytes_per_token, ent[g].tokens_per_entry, ent[g].window);
    CHECKF(ent2[g].kind == ent[g].kind && ent2[g].n_layers == ent[g].n_layers &&
               ent2[g].window == ent[g].window && ent2[g].tokens_per_entry == ent[g].tokens_per_entry &&
               ent2[g].bytes_per_entry * 2 == ent[g].bytes_per_entry && ent2[g].bytes_per_token * 2 >= ent[g].bytes_per_token &&
               ent2[g].bytes_per_token * 2 <= ent[g].bytes_per_token + 2 * DI_KV_BLOCK_SIZE,
           "%s group %d: 2-byte values give bytes/token %lld, entry %lld (4-byte: %lld, %lld)", dir, g,
           (long long)ent2[g].bytes_per_token, (long long)ent2[g].bytes_per_entry, (long long)ent[g].bytes_per_token,
           (long long)ent[g].bytes_per_entry);
  }
  if (m->cfg.arch != DI_ARCH_DEEPSEEK_V4) {
    /* V2/V3: the latents of every layer and MTP layer, kv_lora_rank + rope values a row */
    const int layers = m->cfg.num_hidden_layers + m->weights.n_mtp;
    CHECK(ent[0].kind == DI_KV_FULL && ent[0].n_layers == layers && ent[0].window == 0);
    CHECK(ent[0].bytes_per_token == (int64_t)layers * (m->cfg.kv_lora_rank + m->cfg.qk_rope_head_dim) * 4);
    di_kv_group_info cu;
    CHECK(di_ds_kv_groups(&m->cfg, 0, 2, 576, &cu, 1) == 1);
    CHECK(cu.n_layers == m->cfg.num_hidden_layers && cu.bytes_per_token == (int64_t)m->cfg.num_hidden_layers * 576 * 2);
  }
  di_model_free(m);
}

int main(void) {
  check_model("tests/data/models/dsv2-tiny", 1);
  check_model("tests/data/models/dsv3-tiny", 1);
  check_model("tests/data/models/dsv4-tiny", 5); /* CSA entries, indexer keys, HCA entries, window, state */
  return test_finish("test_arch_kv_groups");
}
