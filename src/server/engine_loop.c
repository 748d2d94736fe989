/* The engine thread of `deepinfer serve` (see engine_loop.h): takes queued jobs, adds their
 * requests, forwards aborts, steps the engine and copies each step's outputs into the jobs' event
 * lists. One mutex guards the queue, the jobs and the stats; the engine itself is touched by this
 * thread alone and never under the mutex, so handlers are never blocked behind a model step. */
#include "server/engine_loop.h"
#include "util/status.h"
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct di_srv_job {
  int n_prompts;
  const di_request_params *params;
  uint64_t *req_ids;
  int state;                 /* 0: queued, 1: added, -1: failed */
  di_status err_st;
  char err[1024];
  int samples_total, samples_done;
  di_srv_event *head, *tail;
  int abort_requested, abort_sent;
  int refs;
  pthread_cond_t cond;
  di_srv_job *next;          /* in the queue */
};

struct di_srv_engine {
  di_engine *e;
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t wake;
  di_srv_job *queue_head, *queue_tail;
  di_srv_job **active;       /* jobs whose requests are in the engine */
  int n_active, cap_active;
  int stop, abort_all;
  int step_failed;           /* the last engine step failed (a backend error): /health says so */
  di_engine_stats stats;
  di_spec_stats spec;
};

void di_srv_event_free(di_srv_event *ev) {
  if (!ev) return;
  free(ev->tokens);
  free(ev->text);
  free(ev->logprobs);
  free(ev->top);
  free(ev->prompt_logprobs);
  free(ev->prompt_top);
  free(ev->prompt_ranks);
  free(ev->error);
  free(ev);
}

static void cond_init_monotonic(pthread_cond_t *c) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(c, &a);
  pthread_condattr_destroy(&a);
}

di_srv_job *di_srv_job_create(int n_prompts, const di_request_params *params) {
  di_srv_job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  j->req_ids = calloc((size_t)(n_prompts > 0 ? n_prompts : 1), sizeof *j->req_ids);
  if (!j->req_ids) { free(j); return NULL; }
  j->n_prompts = n_prompts;
  j->params = params;
  for (int i = 0; i < n_prompts; i++) j->samples_total += params[i].n > 0 ? params[i].n : 1;
  j->refs = 1;
  cond_init_monotonic(&j->cond);
  return j;
}

static void job_free(di_srv_job *j) {
  di_srv_event *ev = j->head;
  while (ev) {
    di_srv_event *nx = ev->next;
    di_srv_event_free(ev);
    ev = nx;
  }
  pthread_cond_destroy(&j->cond);
  free(j->req_ids);
  free(j);
}

/* mutex held */
static void job_unref(di_srv_job *j) {
  if (--j->refs == 0) job_free(j);
}

void di_srv_job_release(di_srv_engine *s, di_srv_job *job) {
  if (!job) return;
  pthread_mutex_lock(&s->mu);
  job_unref(job);
  pthread_mutex_unlock(&s->mu);
}

static di_srv_event *event_copy(const di_seq_output *o, int prompt_index) {
  di_srv_event *ev = calloc(1, sizeof *ev);
  if (!ev) return NULL;
  ev->prompt_index = prompt_index;
  ev->sample_index = o->sample_index;
  ev->n_tokens = o->n_new_tokens;
  ev->finish = o->finish_reason;
  ev->stop_token = o->stop_token;
  ev->n_prompt_tokens = o->n_prompt_tokens;
  ev->n_cached_tokens = o->n_cached_tokens;
  ev->n_output_tokens = o->n_output_tokens;
  size_t nt = (size_t)(o->n_new_tokens > 0 ? o->n_new_tokens : 0);
  ev->tokens = malloc((nt ? nt : 1) * sizeof *ev->tokens);
  ev->text = malloc(o->new_text_len + 1);
  if (!ev->tokens || !ev->text) goto oom;
  if (nt) memcpy(ev->tokens, o->new_tokens, nt * sizeof *ev->tokens);
  if (o->new_text_len) memcpy(ev->text, o->new_text, o->new_text_len);
  ev->text[o->new_text_len] = 0;
  ev->text_len = o->new_text_len;
  if (o->new_logprobs && nt) {
    ev->logprobs = malloc(nt * sizeof *ev->logprobs);
    if (!ev->logprobs) goto oom;
    memcpy(ev->logprobs, o->new_logprobs, nt * sizeof *ev->logprobs);
    if (o->n_top > 0 && o->top) {
      ev->top = malloc(nt * (size_t)o->n_top * sizeof *ev->top);
      if (!ev->top) goto oom;
      memcpy(ev->top, o->top, nt * (size_t)o->n_top * sizeof *ev->top);
      ev->n_top = o->n_top;
    }
  }
  if (o->prompt_logprobs && o->n_prompt_tokens > 0) {
    size_t np = (size_t)o->n_prompt_tokens, k = (size_t)(o->n_prompt_top > 0 ? o->n_prompt_top : 0);
    ev->prompt_logprobs = malloc(np * sizeof *ev->prompt_logprobs);
    if (!ev->prompt_logprobs) goto oom;
    memcpy(ev->prompt_logprobs, o->prompt_logprobs, np * sizeof *ev->prompt_logprobs);
    if (o->prompt_ranks) {
      ev->prompt_ranks = malloc(np * sizeof *ev->prompt_ranks);
      if (!ev->prompt_ranks) goto oom;
      memcpy(ev->prompt_ranks, o->prompt_ranks, np * sizeof *ev->prompt_ranks);
    }
    if (k && o->prompt_top) {
      ev->prompt_top = malloc(np * k * sizeof *ev->prompt_top);
      if (!ev->prompt_top) goto oom;
      memcpy(ev->prompt_top, o->prompt_top, np * k * sizeof *ev->prompt_top);
      ev->n_prompt_top = (int)k;
    }
  }
  if (o->error && !(ev->error = strdup(o->error))) goto oom;
  return ev;
oom:
  di_srv_event_free(ev);
  return NULL;
}

/* mutex held: the job holding engine request `id`, and which of its prompts it is */
static di_srv_job *find_job(di_srv_engine *s, uint64_t id, int *prompt_index, int *slot) {
  for (int k = 0; k < s->n_active; k++) {
    di_srv_job *j = s->active[k];
    for (int i = 0; i < j->n_prompts; i++)
      if (j->req_ids[i] == id) {
        *prompt_index = i;
        *slot = k;
        return j;
      }
  }
  return NULL;
}

/* mutex held */
static void dispatch(di_srv_engine *s, const di_step_output *out) {
  for (int i = 0; i < out->n; i++) {
    const di_seq_output *o = &out->seqs[i];
    int pi, slot;
    di_srv_job *j = find_job(s, o->req_id, &pi, &slot);
    if (!j) continue; /* a request of a job that failed while being added, aborted since */
    di_srv_event *ev = event_copy(o, pi);
    if (ev) {
      if (j->tail) j->tail->next = ev; else j->head = ev;
      j->tail = ev;
    } else if (!j->err[0]) {
      snprintf(j->err, sizeof j->err, "out of memory for the outputs");
    }
    if (o->finish_reason != DI_FINISH_NONE && ++j->samples_done == j->samples_total) {
      s->active[slot] = s->active[--s->n_active];
      pthread_cond_broadcast(&j->cond);
      job_unref(j);
      continue;
    }
    pthread_cond_broadcast(&j->cond);
  }
}

/* Adds a job's requests (engine thread, no lock held). All or none: a failing prompt aborts the
 * ones added before it. */
static di_status add_job(di_srv_engine *s, di_srv_job *j) {
  for (int i = 0; i < j->n_prompts; i++) {
    di_status st = di_engine_add_request(s->e, &j->params[i], &j->req_ids[i]);
    if (st != DI_OK) {
      char msg[900];
      snprintf(msg, sizeof msg, "%s", di_last_error());
      for (int k = 0; k < i; k++) di_engine_abort(s->e, j->req_ids[k]);
      /* those aborts are reported by a later step: keep the ids from matching anything */
      for (int k = 0; k < j->n_prompts; k++) j->req_ids[k] = UINT64_MAX;
      if (j->n_prompts > 1) snprintf(j->err, sizeof j->err, "prompt %d: %s", i, msg);
      else snprintf(j->err, sizeof j->err, "%s", msg);
      return st;
    }
  }
  return DI_OK;
}

static void *engine_main(void *arg) {
  di_srv_engine *s = arg;
  uint64_t *aborts = NULL;
  int cap_aborts = 0;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    di_srv_job *queued = s->queue_head;
    s->queue_head = s->queue_tail = NULL;
    int n_aborts = 0;
    for (int k = 0; k < s->n_active; k++) {
      di_srv_job *j = s->active[k];
      if ((j->abort_requested || s->abort_all || s->stop) && !j->abort_sent) {
        j->abort_sent = 1;
        if (n_aborts + j->n_prompts > cap_aborts) {
          int c = (n_aborts + j->n_prompts) * 2;
          uint64_t *b = realloc(aborts, (size_t)c * sizeof *b);
          if (!b) { j->abort_sent = 0; break; }
          aborts = b;
          cap_aborts = c;
        }
        for (int i = 0; i < j->n_prompts; i++) aborts[n_aborts++] = j->req_ids[i];
      }
    }
    s->abort_all = 0;
    int busy = di_engine_has_unfinished(s->e);
    if (!queued && !n_aborts && !busy) {
      if (s->stop) break;
      pthread_cond_wait(&s->wake, &s->mu);
      continue;
    }
    pthread_mutex_unlock(&s->mu);

    while (queued) {
      di_srv_job *j = queued;
      queued = j->next;
      j->next = NULL;
      di_status st = DI_ERR_ABORTED;
      if (s->stop) snprintf(j->err, sizeof j->err, "the server is shutting down");
      else st = add_job(s, j);
      pthread_mutex_lock(&s->mu);
      if (st == DI_OK && s->n_active == s->cap_active) {
        int c = s->cap_active ? 2 * s->cap_active : 64;
        di_srv_job **b = realloc(s->active, (size_t)c * sizeof *b);
        if (b) { s->active = b; s->cap_active = c; }
        else {
          for (int i = 0; i < j->n_prompts; i++) di_engine_abort(s->e, j->req_ids[i]);
          snprintf(j->err, sizeof j->err, "out of memory");
          st = DI_ERR_OOM;
        }
      }
      if (st == DI_OK) {
        j->state = 1;
        s->active[s->n_active++] = j;
      } else {
        j->state = -1;
        j->err_st = st;
        job_unref(j); /* the engine's reference */
      }
      pthread_cond_broadcast(&j->cond);
      pthread_mutex_unlock(&s->mu);
    }
    for (int k = 0; k < n_aborts; k++) di_engine_abort(s->e, aborts[k]); /* NOT_FOUND: finished meanwhile */
    if (di_engine_has_unfinished(s->e)) {
      di_step_output *out = NULL;
      di_status st = di_engine_step(s->e, &out);
      pthread_mutex_lock(&s->mu);
      s->step_failed = st != DI_OK;
      if (st != DI_OK) {
        /* the engine itself failed (backend error): fail everything in flight rather than spin */
        fprintf(stderr, "deepinfer serve: engine step failed: %s\n", di_last_error());
        for (int k = 0; k < s->n_active; k++)
          if (!s->active[k]->err[0]) snprintf(s->active[k]->err, sizeof s->active[k]->err, "engine step failed: %s", di_last_error());
        s->abort_all = 1;
      } else if (out) {
        dispatch(s, out);
      }
      di_engine_get_stats(s->e, &s->stats);
      di_engine_get_spec_stats(s->e, &s->spec);
    } else {
      pthread_mutex_lock(&s->mu);
    }
  }
  pthread_mutex_unlock(&s->mu);
  free(aborts);
  return NULL;
}

di_status di_srv_engine_start(di_engine *e, di_srv_engine **out) {
  di_srv_engine *s = calloc(1, sizeof *s);
  if (!s) return di_error_set(DI_ERR_OOM, "out of memory");
  s->e = e;
  pthread_mutex_init(&s->mu, NULL);
  pthread_cond_init(&s->wake, NULL);
  di_engine_get_stats(e, &s->stats);
  di_engine_get_spec_stats(e, &s->spec);
  if (pthread_create(&s->thread, NULL, engine_main, s) != 0) {
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->wake);
    free(s);
    return di_error_set(DI_ERR_INTERNAL, "cannot start the engine thread");
  }
  *out = s;
  return DI_OK;
}

void di_srv_engine_stop(di_srv_engine *s) {
  if (!s) return;
  pthread_mutex_lock(&s->mu);
  s->stop = 1;
  pthread_cond_signal(&s->wake);
  pthread_mutex_unlock(&s->mu);
  pthread_join(s->thread, NULL);
  /* jobs still referenced by handlers are freed by their last release; drop the engine's refs */
  pthread_mutex_lock(&s->mu);
  for (int k = 0; k < s->n_active; k++) {
    di_srv_job *j = s->active[k];
    j->samples_done = j->samples_total;
    pthread_cond_broadcast(&j->cond);
    job_unref(j);
  }
  s->n_active = 0;
  pthread_mutex_unlock(&s->mu);
  free(s->active);
  pthread_mutex_destroy(&s->mu);
  pthread_cond_destroy(&s->wake);
  free(s);
}

di_status di_srv_submit(di_srv_engine *s, di_srv_job *job) {
  pthread_mutex_lock(&s->mu);
  if (s->stop) {
    pthread_mutex_unlock(&s->mu);
    return di_error_set(DI_ERR_ABORTED, "the server is shutting down");
  }
  job->refs++; /* the engine thread's reference */
  if (s->queue_tail) s->queue_tail->next = job; else s->queue_head = job;
  s->queue_tail = job;
  pthread_cond_signal(&s->wake);
  while (job->state == 0) pthread_cond_wait(&job->cond, &s->mu);
  di_status st = DI_OK;
  if (job->state < 0) st = di_error_set(job->err_st, "%s", job->err);
  pthread_mutex_unlock(&s->mu);
  return st;
}

int di_srv_next_event(di_srv_engine *s, di_srv_job *job, int timeout_ms, di_srv_event **ev) {
  struct timespec until;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += timeout_ms / 1000;
  until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
  if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
  int rc = 0;
  pthread_mutex_lock(&s->mu);
  for (;;) {
    if (job->head) {
      *ev = job->head;
      job->head = job->head->next;
      if (!job->head) job->tail = NULL;
      (*ev)->next = NULL;
      rc = 1;
      break;
    }
    if (job->state < 0 || job->samples_done >= job->samples_total) { rc = -1; break; }
    if (pthread_cond_timedwait(&job->cond, &s->mu, &until) == ETIMEDOUT) {
      rc = 0;
      break;
    }
  }
  pthread_mutex_unlock(&s->mu);
  return rc;
}

void di_srv_abort(di_srv_engine *s, di_srv_job *job) {
  pthread_mutex_lock(&s->mu);
  job->abort_requested = 1;
  pthread_cond_signal(&s->wake);
  pthread_mutex_unlock(&s->mu);
}

void di_srv_abort_all(di_srv_engine *s) {
  pthread_mutex_lock(&s->mu);
  s->abort_all = 1;
  pthread_cond_signal(&s->wake);
  pthread_mutex_unlock(&s->mu);
}

void di_srv_stats(di_srv_engine *s, di_engine_stats *st, int *jobs_running, int *jobs_waiting) {
  pthread_mutex_lock(&s->mu);
  *st = s->stats;
  if (jobs_running) *jobs_running = s->n_active;
  if (jobs_waiting) {
    int n = 0;
    for (di_srv_job *j = s->queue_head; j; j = j->next) n++;
    *jobs_waiting = n;
  }
  pthread_mutex_unlock(&s->mu);
}

void di_srv_spec_stats(di_srv_engine *s, di_spec_stats *spec) {
  pthread_mutex_lock(&s->mu);
  *spec = s->spec;
  pthread_mutex_unlock(&s->mu);
}

void di_srv_job_error(di_srv_engine *s, di_srv_job *job, char *buf, size_t cap) {
  pthread_mutex_lock(&s->mu); /* the engine thread may write it (a failed step) while others run */
  snprintf(buf, cap, "%s", job->err);
  pthread_mutex_unlock(&s->mu);
}

int di_srv_healthy(di_srv_engine *s) {
  pthread_mutex_lock(&s->mu);
  int ok = !s->step_failed;
  pthread_mutex_unlock(&s->mu);
  return ok;
}
