/* See threadpool.h. Workers watch a job word `state` = (generation << 32) | joined-workers: they
 * spin on it for a while after each job (decode steps issue hundreds of small parallel loops back to
 * back, and a futex wake-up per loop costs more than the loop) and only then sleep on a condition
 * variable. A worker takes part in a job only if it joins before the caller closes it; the caller
 * works through the chunks itself and then waits only for workers that joined. So a worker that the
 * OS has descheduled (another process on its core) never holds a loop up unless it is mid-chunk. */
#include "util/threadpool.h"
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

struct di_threadpool {
  int n;
  pthread_t *threads;
  pthread_mutex_t mu;
  pthread_cond_t cv_work, cv_done;
  /* current job */
  di_parallel_fn fn;
  void *ctx;
  int64_t total, chunk;
  atomic_llong next;
  atomic_ullong state; /* generation << 32 | joined workers; low word CLOSED once the job ended */
  atomic_int sleepers;
  atomic_int stop;
  /* per thread index: a scratch buffer (di_threadpool_scratch) */
  void **scratch;
  size_t *scratch_bytes;
};

typedef struct {
  di_threadpool *tp;
  int index;
} worker_arg;

#define JOB_CLOSED 0xffffffffull
#define GEN(s) ((s) >> 32)
#define JOINED(s) ((s) & 0xffffffffull)

static void run_chunks(di_threadpool *tp, int thread) {
  for (;;) {
    int64_t b = atomic_fetch_add(&tp->next, tp->chunk);
    if (b >= tp->total)
      break;
    int64_t e = b + tp->chunk < tp->total ? b + tp->chunk : tp->total;
    tp->fn(tp->ctx, b, e, thread);
  }
}

static void *worker(void *p) {
  worker_arg *a = p;
  di_threadpool *tp = a->tp;
  int index = a->index;
  free(a);
  uint64_t seen = 0;
  for (;;) {
    int spins = 0;
    while (GEN(atomic_load(&tp->state)) == seen && !atomic_load(&tp->stop) && spins < 20000) {
      if (spins < 4000)
        __builtin_ia32_pause();
      else
        sched_yield();
      spins++;
    }
    if (GEN(atomic_load(&tp->state)) == seen && !atomic_load(&tp->stop)) {
      pthread_mutex_lock(&tp->mu);
      atomic_fetch_add(&tp->sleepers, 1);
      while (!atomic_load(&tp->stop) && GEN(atomic_load(&tp->state)) == seen)
        pthread_cond_wait(&tp->cv_work, &tp->mu);
      atomic_fetch_sub(&tp->sleepers, 1);
      pthread_mutex_unlock(&tp->mu);
    }
    if (atomic_load(&tp->stop))
      return NULL;
    /* join the current job unless it is already closed */
    unsigned long long s = atomic_load(&tp->state);
    seen = GEN(s);
    for (;;) {
      if (GEN(s) != seen || JOINED(s) == JOB_CLOSED)
        break;
      if (atomic_compare_exchange_weak(&tp->state, &s, s + 1)) {
        run_chunks(tp, index);
        atomic_fetch_sub(&tp->state, 1);
        break;
      }
    }
  }
}

di_status di_threadpool_create(int n_threads, di_threadpool **out) {
  if (n_threads <= 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    n_threads = c > 0 ? (int)c : 1;
  }
  di_threadpool *tp = calloc(1, sizeof *tp);
  if (!tp)
    return di_error_set(DI_ERR_OOM, "thread pool: out of memory");
  tp->n = n_threads;
  pthread_mutex_init(&tp->mu, NULL);
  pthread_cond_init(&tp->cv_work, NULL);
  pthread_cond_init(&tp->cv_done, NULL);
  tp->threads = calloc((size_t)n_threads, sizeof(pthread_t));
  tp->scratch = calloc((size_t)n_threads, sizeof(void *));
  tp->scratch_bytes = calloc((size_t)n_threads, sizeof(size_t));
  if (!tp->threads || !tp->scratch || !tp->scratch_bytes) {
    free(tp->threads);
    free(tp->scratch);
    free(tp->scratch_bytes);
    free(tp);
    return di_error_set(DI_ERR_OOM, "thread pool: out of memory");
  }
  for (int i = 1; i < n_threads; i++) {
    worker_arg *a = malloc(sizeof *a);
    a->tp = tp;
    a->index = i;
    if (pthread_create(&tp->threads[i], NULL, worker, a) != 0) {
      free(a);
      tp->n = i;
      break;
    }
  }
  *out = tp;
  return DI_OK;
}

void di_threadpool_free(di_threadpool *tp) {
  if (!tp)
    return;
  pthread_mutex_lock(&tp->mu);
  atomic_store(&tp->stop, 1);
  pthread_cond_broadcast(&tp->cv_work);
  pthread_mutex_unlock(&tp->mu);
  for (int i = 1; i < tp->n; i++)
    pthread_join(tp->threads[i], NULL);
  pthread_mutex_destroy(&tp->mu);
  pthread_cond_destroy(&tp->cv_work);
  pthread_cond_destroy(&tp->cv_done);
  free(tp->threads);
  for (int i = 0; i < tp->n; i++)
    free(tp->scratch[i]);
  free(tp->scratch);
  free(tp->scratch_bytes);
  free(tp);
}

void *di_threadpool_scratch(di_threadpool *tp, int thread, size_t bytes) {
  if (!tp || thread < 0 || thread >= tp->n)
    return NULL;
  if (tp->scratch_bytes[thread] < bytes) {
    free(tp->scratch[thread]);
    const size_t rounded = (bytes + 63) & ~(size_t)63;
    tp->scratch[thread] = aligned_alloc(64, rounded);
    tp->scratch_bytes[thread] = tp->scratch[thread] ? rounded : 0;
  }
  return tp->scratch[thread];
}

int di_threadpool_size(const di_threadpool *tp) { return tp ? tp->n : 1; }

void di_parallel_for(di_threadpool *tp, int64_t n, int64_t grain, di_parallel_fn fn, void *ctx) {
  if (n <= 0)
    return;
  if (grain < 1)
    grain = 1;
  int nt = tp ? tp->n : 1;
  if (nt == 1 || n <= grain) {
    fn(ctx, 0, n, 0);
    return;
  }
  int64_t chunk = (n + nt * 4 - 1) / (nt * 4);
  if (chunk < grain)
    chunk = grain;
  tp->fn = fn;
  tp->ctx = ctx;
  tp->total = n;
  tp->chunk = chunk;
  atomic_store(&tp->next, 0);
  unsigned long long gen = GEN(atomic_load(&tp->state)) + 1;
  atomic_store(&tp->state, gen << 32); /* publishes the job: open, nobody joined */
  if (atomic_load(&tp->sleepers) > 0) {
    pthread_mutex_lock(&tp->mu);
    pthread_cond_broadcast(&tp->cv_work);
    pthread_mutex_unlock(&tp->mu);
  }
  run_chunks(tp, 0);
  /* close the job once no joined worker is still inside a chunk */
  unsigned long long open_idle = gen << 32;
  for (int spin = 0;; spin++) {
    unsigned long long expect = open_idle;
    if (atomic_compare_exchange_weak(&tp->state, &expect, open_idle | JOB_CLOSED))
      break;
    if (spin < 4000)
      __builtin_ia32_pause();
    else
      sched_yield();
  }
}
