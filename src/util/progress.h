/* Progress reporting while a model loads: a bar redrawn in place on a terminal, or a few plain
 * lines (25%, 50%, 75%, then "done in N s") when stderr is a file or pipe; loads shorter than half a
 * second print only the last line. A NULL progress is silent. */
#ifndef DI_UTIL_PROGRESS_H
#define DI_UTIL_PROGRESS_H
#include <stdint.h>

typedef struct di_progress {
  const char *label;
  int64_t total, done;
  int tty;
  int last_quarter;   /* last quarter printed in line mode */
  int last_width;     /* last bar width drawn on a terminal */
  double t0;
} di_progress;

/* Starts reporting `total` units of work under `label` ("loading weights"). */
void di_progress_begin(di_progress *p, const char *label, int64_t total);
/* Marks `n` more units done. */
void di_progress_add(di_progress *p, int64_t n);
/* Finishes (prints the final state and the elapsed time). */
void di_progress_end(di_progress *p);
#endif
