/* See progress.h. */
#include "util/progress.h"
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static double seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

#define BAR 30

static void draw(di_progress *p) {
  const int64_t total = p->total > 0 ? p->total : 1;
  if (p->tty) {
    int w = (int)(BAR * p->done / total);
    if (w == p->last_width && p->done < p->total)
      return;
    p->last_width = w;
    char bar[BAR + 1];
    for (int i = 0; i < BAR; i++)
      bar[i] = i < w ? '#' : '.';
    bar[BAR] = 0;
    fprintf(stderr, "\rdeepinfer: %s [%s] %3d%%", p->label, bar, (int)(100 * p->done / total));
    fflush(stderr);
  } else {
    /* lines only for loads long enough to want them (a small model loads in milliseconds) */
    int q = (int)(4 * p->done / total);
    int quiet = seconds() - p->t0 < 0.5;
    while (p->last_quarter < q) {
      p->last_quarter++;
      if (!quiet && p->last_quarter < 4)
        fprintf(stderr, "deepinfer: %s %d%%\n", p->label, 25 * p->last_quarter);
    }
  }
}

void di_progress_begin(di_progress *p, const char *label, int64_t total) {
  if (!p)
    return;
  p->label = label;
  p->total = total;
  p->done = 0;
  p->tty = isatty(2);
  p->last_quarter = 0;
  p->last_width = -1;
  p->t0 = seconds();
  if (p->tty)
    draw(p);
}

void di_progress_add(di_progress *p, int64_t n) {
  if (!p)
    return;
  p->done += n;
  if (p->done > p->total)
    p->done = p->total;
  draw(p);
}

void di_progress_end(di_progress *p) {
  if (!p)
    return;
  p->done = p->total;
  draw(p);
  if (p->tty)
    fprintf(stderr, " (%.1f s)\n", seconds() - p->t0);
  else
    fprintf(stderr, "deepinfer: %s done in %.1f s\n", p->label, seconds() - p->t0);
}
