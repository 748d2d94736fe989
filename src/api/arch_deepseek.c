/* The registry entries of DeepSeek-V2 and V3 (arch_registry.h): di_model_config holds their whole
 * configuration; weights bound by arch/deepseek_weights.c (or dummies); forward on the CPU backend
 * (backend/cpu/cpu_deepseek.c) or the CUDA one (backend/cuda/cuda_deepseek2.cu). */
#include "api/arch_registry.h"
#include "api/model_internal.h"
#include "backend/cpu/cpu_backend.h"
#include "model/safetensors.h"
#include <stdio.h>
#include <string.h>
#include <strings.h>
#ifdef DI_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif

di_status di_backend_create(const char *accelerator, const di_model_config *cfg, const di_ds_weights *w, int threads,
                            int batch_invariant, di_backend **out) {
  if (!accelerator || !*accelerator || strcasecmp(accelerator, "cpu") == 0)
    return di_backend_cpu_create(cfg, w, threads, out);
  if (strcasecmp(accelerator, "cuda") == 0 || strcasecmp(accelerator, "nvidia") == 0) {
#ifdef DI_HAVE_CUDA
    return di_backend_cuda_create(cfg, w, batch_invariant, out);
#else
    (void)batch_invariant;
    return di_error_set(DI_ERR_UNSUPPORTED, "accelerator \"%s\": this build has no CUDA backend (build with nvcc, DI_CUDA=ON)",
                        accelerator);
#endif
  }
  return di_error_set(DI_ERR_INVALID_ARG, "unknown accelerator \"%s\" (cpu, cuda)", accelerator);
}

static di_status load(di_model *m, const di_arch_load *in) {
  di_progress *pp = in->progress;
  di_progress_begin(pp, in->dummy ? "making dummy weights" : "loading weights", di_ds_weights_progress_units(&m->cfg));
  di_status st;
  if (in->dummy) {
    st = di_ds_weights_dummy(&m->cfg, in->dummy_seed, &m->weights, pp);
  } else {
    st = di_tensor_source_open(in->dir, &m->source);
    if (st == DI_OK)
      st = di_ds_weights_bind(&m->cfg, m->source, &m->weights, pp);
  }
  if (st != DI_OK) {
    if (pp && pp->tty)
      fputc('\n', stderr);
    return st;
  }
  if (in->quantize_fp8 && (st = di_ds_weights_quantize_fp8(&m->cfg, &m->weights)) != DI_OK)
    return st;
  di_progress_end(pp);
  DI_TRY(di_backend_create(in->accelerator, &m->cfg, &m->weights, in->threads, in->batch_invariant, &m->backend));
  if (in->kv_fp8) {
    if (!m->backend->ops->set_kv_fp8)
      return di_error_set(DI_ERR_UNSUPPORTED, "--kv-cache-dtype fp8: the %s backend keeps its latent cache in its own "
                          "dtype (fp8: the cpu and cuda backends)", m->backend->ops->name);
    DI_TRY(m->backend->ops->set_kv_fp8(m->backend));
  }
  return DI_OK;
}

static int kv_groups(const di_model *m, int elem_bytes, di_kv_group_info *g, int cap) {
  return di_ds_kv_groups(&m->cfg, m->weights.n_mtp, elem_bytes, 0, g, cap);
}

static void free_state(di_model *m) { di_ds_weights_free(&m->weights); }

const di_arch_entry di_arch_deepseek_v2 = {"deepseek_v2", DI_ARCH_DEEPSEEK_V2, 0, 0, load, kv_groups, free_state};
const di_arch_entry di_arch_deepseek_v3 = {"deepseek_v3", DI_ARCH_DEEPSEEK_V3, 0, 0, load, kv_groups, free_state};
