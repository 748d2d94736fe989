/* The DeepSeek-V4 CPU backend: serves the cached forward (cpu_deepseek_v4_cache.h) through the
 * engine's backend interface. V4's per-sequence state (window ring, compressed entries, indexer keys,
 * the compressors' pending rows) is not paged: the backend keeps one state per di_batch_seq.key. */
#ifndef DI_BACKEND_CPU_V4_BACKEND_H
#define DI_BACKEND_CPU_V4_BACKEND_H
#include "arch/deepseek_v4.h"
#include "backend/backend.h"

/* cfg (the generic fields), v4 and w must outlive the backend. threads: the sequences of a step run
 * in parallel on this many threads (<= 0: one per core; 1: none started). */
di_status di_backend_cpu_v4_create(const di_model_config *cfg, const di_v4_config *v4, const di_v4_weights *w,
                                   int threads, di_backend **out);
/* Sequences whose state the backend holds (for tests: 0 once every sequence was released). */
int di_backend_cpu_v4_live_states(const di_backend *b);
#endif
