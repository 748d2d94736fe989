/* The registry entry of DeepSeek-V4 (arch_registry.h): its own configuration (di_v4_config, read from
 * the loader's parse of config.json), weights bound by arch/deepseek_v4_weights.c, forward on the V4
 * CPU backend (backend/cpu/cpu_v4_backend.c), or on the CUDA one (backend/cuda/cuda_deepseek_v4.cu) with
 * accelerator cuda (DEEPINFER_CUDA_V4=0 refuses it: the switch back to the CPU-only behaviour). No dummy weights. */
#include "api/arch_registry.h"
#include "api/model_internal.h"
#include "backend/cpu/cpu_deepseek_v4_pages.h"
#include "backend/cpu/cpu_v4_backend.h"
#include "model/safetensors.h"
#include <stdio.h>
#include <strings.h>
#include "util/switches.h"
#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_v4_backend.h"
#endif

static di_status load(di_model *m, const di_arch_load *in) {
  di_status st = di_v4_config_from_tree(in->config, &m->v4cfg);
  if (st != DI_OK)
    return di_error_wrap(st, "%s/config.json (model_type deepseek_v4)", in->dir);
  if (in->dummy)
    return di_error_set(DI_ERR_UNSUPPORTED, "DeepSeek-V4 (model_type deepseek_v4): load format \"dummy\" is not supported; "
                        "load the safetensors weights");
  const char *acc = in->accelerator;
  const int cuda = acc && (strcasecmp(acc, "cuda") == 0 || strcasecmp(acc, "nvidia") == 0);
  if (acc && *acc && strcasecmp(acc, "cpu") != 0 && !(cuda && di_switch_bool(DI_SW_CUDA_V4, 1)))
    return di_error_set(DI_ERR_UNSUPPORTED, "DeepSeek-V4 (model_type deepseek_v4) runs on the cpu or cuda accelerator, not \"%s\"%s",
                        acc, cuda ? " (DEEPINFER_CUDA_V4=0 turns the CUDA path off)" : "");
  di_progress_begin(in->progress, "loading weights", 1);
  DI_TRY(di_tensor_source_open(in->dir, &m->source));
  DI_TRY(di_v4_weights_bind(&m->v4cfg, m->source, &m->v4w));
  di_progress_end(in->progress);
  if (cuda) {
#ifdef DI_HAVE_CUDA
    return di_backend_cuda_v4_create_mode(&m->cfg, &m->v4cfg, &m->v4w, in->batch_invariant, &m->backend);
#else
    return di_error_set(DI_ERR_UNSUPPORTED, "accelerator \"%s\": this build has no CUDA backend (build with nvcc, DI_CUDA=ON)", acc);
#endif
  }
  return di_backend_cpu_v4_create(&m->cfg, &m->v4cfg, &m->v4w, m->threads, &m->backend);
}

/* the groups of cpu_deepseek_v4_pages.h's layout (which kinds the layer mix has, their slots) */
static int kv_groups(const di_model *m, int elem_bytes, di_kv_group_info *g, int cap) {
  di_v4_layout lay;
  di_v4_layout_init(&m->v4cfg, &lay);
  return di_v4_layout_groups(&lay, &m->v4cfg, elem_bytes, g, cap);
}

static void free_state(di_model *m) { di_v4_weights_free(&m->v4w); }

const di_arch_entry di_arch_deepseek_v4 = {"deepseek_v4", DI_ARCH_DEEPSEEK_V4, 1, 1, load, kv_groups, free_state};
