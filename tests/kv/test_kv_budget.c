/* The KV cache's default size: vLLM's gpu_memory_utilization rule on a device backend (the budget is
 * utilization x total memory less what is in use after the largest step's buffers are reserved), a
 * fixed 1 GiB on the host, and the explicit sizes overriding both. Checked on the pure rule, on the
 * block count a budget yields for a real model's shape, and through the engine over a mock device
 * that reports its memory. */
#include "test_util.h"
#include "engine/mock_backend.h"
#include "kv/kv_budget.h"
#include "kv/kv_manager.h"
#include <string.h>

#define GIB ((int64_t)1 << 30)
#define MIB ((int64_t)1 << 20)

static void test_rule(void) {
  int64_t b = 0;
  CHECK(di_kv_budget_from_device(141 * GIB, 31 * GIB, 0.9, &b) == DI_OK);
  CHECKF(b == (int64_t)(0.9 * (double)(141 * GIB)) - 31 * GIB, "budget %lld", (long long)b);
  CHECK(di_kv_budget_from_device(80 * GIB, 0, 1.0, &b) == DI_OK && b == 80 * GIB);
  CHECK_ERR(di_kv_budget_from_device(80 * GIB, 10 * GIB, 0, &b), "must be in (0, 1]");
  CHECK_ERR(di_kv_budget_from_device(80 * GIB, 10 * GIB, 1.5, &b), "must be in (0, 1]");
  /* the weights alone exceed the share: the message gives the numbers and what to change */
  CHECK_ERR(di_kv_budget_from_device(80 * GIB, 60 * GIB, 0.5, &b), "already use 60.00 GiB");
  CHECK_ERR(di_kv_budget_from_device(80 * GIB, 60 * GIB, 0.5, &b), "raise gpu_memory_utilization");
}

/* a budget's block count for the DeepSeek-V2-Lite shape (27 layers of one 576-wide bf16 latent) */
static void test_blocks_of_budget(void) {
  di_kv_group_info g = {.n_layers = 27, .bytes_per_token = 27 * 576 * 2, .tokens_per_entry = 1};
  int64_t nb = 0;
  CHECK(di_kv_plan(&g, 1, GIB, 256, 2048, &nb) == DI_OK);
  CHECKF(nb == GIB / (27 * 576 * 2 * DI_KV_BLOCK_SIZE), "1 GiB: %lld blocks", (long long)nb);
  CHECKF(nb == 539, "1 GiB holds 539 V2-Lite blocks, got %lld", (long long)nb);
  /* an H200 (141 GiB) at 0.9 with 31.2 GiB in use: ~48,000 blocks, 3.1M tokens */
  int64_t budget = 0;
  CHECK(di_kv_budget_from_device(141 * GIB, 31 * GIB + 200 * MIB, 0.9, &budget) == DI_OK);
  CHECK(di_kv_plan(&g, 1, budget, 256, 2048, &nb) == DI_OK);
  CHECKF(nb == budget / (27 * 576 * 2 * DI_KV_BLOCK_SIZE), "%lld blocks", (long long)nb);
  CHECKF(nb > 256 * 192 / DI_KV_BLOCK_SIZE * 10, "256 x 192-token sequences fit many times over: %lld blocks", (long long)nb);
}

/* a mock device with memory to report */
static int64_t g_total, g_used;
static int g_asked_tokens, g_asked_outputs, g_calls;
static di_status mock_memory_info(di_backend *b, int max_step_tokens, int max_outputs, int64_t *total, int64_t *used) {
  (void)b;
  g_calls++;
  g_asked_tokens = max_step_tokens;
  g_asked_outputs = max_outputs;
  *total = g_total;
  *used = g_used;
  return DI_OK;
}

static int64_t engine_blocks(const di_backend_ops *ops, const di_engine_options *opt, di_status *st_out, char *summary,
                             size_t n) {
  mock_backend *mb = mock_backend_new(64);
  mb->base.ops = ops;
  di_engine *e = NULL;
  di_status st = mock_engine(mb, opt, 0, 4096, &e);
  *st_out = st;
  int64_t blocks = -1;
  if (st == DI_OK) {
    di_engine_stats s;
    di_engine_get_stats(e, &s);
    blocks = s.kv_blocks_total;
    snprintf(summary, n, "%s", di_engine_kv_summary(e));
    di_engine_free(e);
  } else {
    snprintf(summary, n, "%s", di_last_error());
  }
  mock_destroy(&mb->base); /* the engine does not own its backend */
  return blocks;
}

static void test_engine_default(void) {
  di_backend_ops dev = MOCK_OPS;
  dev.name = "mock-with-memory";
  dev.memory_info = mock_memory_info;
  const int64_t block_bytes = 1024 * DI_KV_BLOCK_SIZE; /* the mock's 1024 bytes per token */
  char sum[512];
  di_status st;
  di_engine_options o;

  /* device: 0.5 of 1 GiB with 256 MiB in use leaves 256 MiB: 4,096 blocks of 64 KiB */
  g_total = GIB;
  g_used = 256 * MIB;
  di_engine_options_default(&o);
  CHECK(o.kv_cache_memory_bytes <= 0 && o.num_kv_blocks <= 0);
  CHECKF(o.gpu_memory_utilization > 0.899f && o.gpu_memory_utilization < 0.901f, "default %g", o.gpu_memory_utilization);
  o.gpu_memory_utilization = 0.5f;
  o.max_num_batched_tokens = 1536;
  o.max_num_seqs = 48;
  int64_t nb = engine_blocks(&dev, &o, &st, sum, sizeof sum);
  CHECKF(st == DI_OK && nb == 256 * MIB / block_bytes, "%lld blocks: %s", (long long)nb, sum);
  CHECKF(g_asked_tokens == 1536 && g_asked_outputs == 48, "reserved a step of %d tokens, %d outputs", g_asked_tokens,
         g_asked_outputs);
  CHECKF(strstr(sum, "4096 blocks") && strstr(sum, "gpu_memory_utilization 0.50 of 1.0 GiB"), "summary: %s", sum);

  /* the default 0.9: 0.9 GiB - 256 MiB */
  di_engine_options_default(&o);
  nb = engine_blocks(&dev, &o, &st, sum, sizeof sum);
  CHECKF(st == DI_OK && nb == ((int64_t)(0.9f * (double)GIB) - 256 * MIB) / block_bytes, "%lld blocks: %s", (long long)nb, sum);

  /* explicit sizes override the rule and never ask the device */
  g_calls = 0;
  di_engine_options_default(&o);
  o.kv_cache_memory_bytes = 64 * MIB;
  nb = engine_blocks(&dev, &o, &st, sum, sizeof sum);
  CHECKF(st == DI_OK && nb == 64 * MIB / block_bytes && g_calls == 0, "kv_cache_memory: %lld blocks, %d calls", (long long)nb, g_calls);
  di_engine_options_default(&o);
  o.num_kv_blocks = 77;
  nb = engine_blocks(&dev, &o, &st, sum, sizeof sum);
  CHECKF(st == DI_OK && nb == 77 && g_calls == 0, "num_kv_blocks: %lld blocks", (long long)nb);

  /* no room: a clear error at create */
  g_used = 900 * MIB;
  di_engine_options_default(&o);
  o.gpu_memory_utilization = 0.5f;
  nb = engine_blocks(&dev, &o, &st, sum, sizeof sum);
  CHECKF(st != DI_OK && strstr(sum, "no room is left for the KV cache"), "no-room error: %s", sum);
  di_engine_options_default(&o);
  o.gpu_memory_utilization = 1.5f;
  nb = engine_blocks(&dev, &o, &st, sum, sizeof sum);
  CHECKF(st != DI_OK && strstr(sum, "gpu_memory_utilization must be in (0, 1]"), "range error: %s", sum);

  /* a host backend (no memory to report): the fixed 1 GiB */
  di_engine_options_default(&o);
  nb = engine_blocks(&MOCK_OPS, &o, &st, sum, sizeof sum);
  CHECKF(st == DI_OK && nb == DI_KV_CPU_DEFAULT_BYTES / block_bytes && strstr(sum, "fixed host default"), "host: %lld: %s",
         (long long)nb, sum);
}

int main(void) {
  test_rule();
  test_blocks_of_budget();
  test_engine_default();
  return test_finish("test_kv_budget");
}
