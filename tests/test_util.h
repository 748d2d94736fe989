/* Minimal test harness shared by the C tests: CHECK macros that count, and a closing line
 * "N passed, N failed" that CI reads. A test binary exits nonzero when any check failed. */
#ifndef DI_TEST_UTIL_H
#define DI_TEST_UTIL_H
#include <stdint.h>
#include <stdio.h>
#include <string.h>

extern int di_test_passed, di_test_failed;

#define CHECK(c)                                                                   \
  do {                                                                             \
    if (c) {                                                                       \
      di_test_passed++;                                                            \
    } else {                                                                       \
      di_test_failed++;                                                            \
      fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c);                 \
    }                                                                              \
  } while (0)

#define CHECKF(c, ...)                                                             \
  do {                                                                             \
    if (c) {                                                                       \
      di_test_passed++;                                                            \
    } else {                                                                       \
      di_test_failed++;                                                            \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #c);                 \
      fprintf(stderr, __VA_ARGS__);                                                \
      fputc('\n', stderr);                                                         \
    }                                                                              \
  } while (0)

/* Checks that `st` failed and di_last_error() contains `needle`. */
#define CHECK_ERR(st, needle)                                                      \
  do {                                                                             \
    di_status st_ = (st);                                                          \
    const char *m_ = di_last_error();                                              \
    CHECKF(st_ != DI_OK && strstr(m_, (needle)) != NULL,                           \
           "status %d, message \"%s\", expected to contain \"%s\"", (int)st_, m_,  \
           (needle));                                                              \
  } while (0)

/* Path of a file under the source tree ($DI_SOURCE_DIR or "."); static buffer, rotating. */
const char *test_path(const char *rel);
/* Calls fn for every file (names starting with '.' skipped) of the folder `rel_dir` under the source
 * tree, with its name, its path relative to the tree, and its bytes (NUL-terminated, freed after the
 * call). Returns the number of files, or -1 (and a failed check) when the folder cannot be opened. */
typedef void (*test_file_fn)(const char *name, const char *rel_path, const char *data, size_t len, void *ctx);
int test_for_each_file(const char *rel_dir, test_file_fn fn, void *ctx);
/* Replays a config parser's fuzz corpus: every file of `rel_dir` through `fuzz_one` (the target's
 * LLVMFuzzerTestOneInput), which sets *accepted when the parser read the input; a file named ok_*
 * must be read, one named bad_* refused (a failed check names the file). Counts them into *ok / *bad;
 * returns the number of files, as test_for_each_file. */
int test_replay_ok_bad(const char *rel_dir, int (*fuzz_one)(const uint8_t *, size_t), const int *accepted, int *ok,
                       int *bad);
/* Replays every file of a fuzz corpus `rel_dir` through the fuzz target's own entry point `fuzz_one`
 * (a test that also checks verdicts of its own calls this too, so that whatever the target checks,
 * its abort()s and traps, holds for every input kept): a file whose replay aborts or traps is named
 * on stderr before the process dies of it. Returns the number of files. */
int test_fuzz_replay(const char *rel_dir, int (*fuzz_one)(const uint8_t *, size_t));
/* ||got - ref|| / ||ref|| in double precision; infinite when got holds a NaN. */
double test_rel_l2(const float *got, const float *ref, size_t n);
/* Index of the largest of v[0..n) (the first on ties, as greedy decoding). */
int test_argmax(const float *v, int n);
/* Prints the closing line and returns the exit code. */
int test_finish(const char *name);
#endif
