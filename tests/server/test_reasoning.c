/* The <think>...</think> split of DeepSeek-R1-style replies (src/server/reasoning.c): with and
 * without the opening tag, no closing tag (all reasoning), and the hold-back of a marker that may be
 * starting while the reply streams; streamed pieces add up to the final split. */
#include "server/reasoning.h"
#include "test_util.h"
#include <string.h>

static di_reasoning_split split(const char *t, int final) {
  di_reasoning_split s;
  di_reasoning_split_text(t, strlen(t), final, &s);
  return s;
}

int main(void) {
  const char *t = "Let me think.</think>The answer.";
  di_reasoning_split s = split(t, 1);
  CHECK(s.ended && s.r_begin == 0 && s.r_end == 13 && s.c_begin == 21);
  s = split("<think>\nhmm</think>ok", 1);
  CHECK(s.ended && s.r_begin == 7 && s.r_end == 11 && s.c_begin == 19);
  s = split("junk<think>r</think>", 1);
  CHECK(s.r_begin == 11 && s.r_end == 12 && s.c_begin == 20);
  s = split("no end at all", 1);
  CHECK(!s.ended && s.r_begin == 0 && s.r_end == 13 && s.c_begin == 13);
  s = split("", 1);
  CHECK(!s.ended && s.r_end == 0 && s.c_begin == 0);
  /* streaming: a tail that might start </think> or <think> is held back */
  s = split("abc</thi", 0);
  CHECK(!s.ended && s.r_end == 3 && s.c_begin == 8);
  s = split("<thi", 0);
  CHECK(s.r_end == 0);
  s = split("abc<", 0);
  CHECK(s.r_end == 3);
  s = split("abc</thi", 1);
  CHECK(s.r_end == 8);
  /* every prefix of a reply: what is released never shrinks and ends as the final split */
  const char *full = "<think>a</think>b</think>c";
  size_t n = strlen(full), last_r = 0, last_c = 0;
  int monotone = 1;
  for (size_t k = 0; k <= n; k++) {
    char buf[64];
    memcpy(buf, full, k);
    buf[k] = 0;
    di_reasoning_split p = split(buf, k == n);
    size_t r = p.r_end, c = p.ended ? k : 0;
    if (r < last_r || c < last_c) monotone = 0;
    last_r = r;
    last_c = c;
    if (k == n) CHECK(p.r_begin == 7 && p.r_end == 8 && p.c_begin == 16);
  }
  CHECK(monotone);
  return test_finish("test_reasoning");
}
