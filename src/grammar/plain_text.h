/* "Plain text" for skipping whole subtrees of the token trie in a classification walk (matcher.c):
 * well-formed UTF-8 of at most 3 bytes a character (no overlongs, no surrogates; a last character
 * may be cut off) without control characters below 0x20, '"' or '\'. (4-byte characters would
 * make the budget search below build automaton states for three continuation bytes at every
 * counted position, for the few tokens that have them.) The vocabulary records, per trie node,
 * how many characters the token suffixes below it have when they are all plain (vocab.c); the
 * matcher computes, per automaton state, how many plain characters the state takes for certain.
 * When the first is at most the second, every token below the node is accepted without a walk
 * (a string body, counted or not, is where this pays: 80k tokens per position). Both sides use
 * this one decoder, so the skip is exact for any grammar. */
#ifndef DI_GRAMMAR_PLAIN_TEXT_H
#define DI_GRAMMAR_PLAIN_TEXT_H
#include <stdint.h>

enum { DI_PLAIN_STATES = 5, DI_PLAIN_INVALID = -1, DI_PLAIN_NOT = 255, DI_PLAIN_CAP = 254 };

/* Decoder step: from state u (0 = at a character boundary) on byte b, the next state (or
 * DI_PLAIN_INVALID); *starts = 1 when b starts a character. */
static inline int di_plain_step(int u, unsigned b, int *starts) {
  *starts = u == 0;
  switch (u) {
  case 0:
    if (b >= 0x20 && b < 0x80)
      return b == '"' || b == '\\' ? DI_PLAIN_INVALID : 0;
    if (b >= 0xC2 && b <= 0xDF)
      return 1;
    if (b == 0xE0)
      return 3;
    if (b == 0xED)
      return 4;
    if (b >= 0xE1 && b <= 0xEF)
      return 2;
    return DI_PLAIN_INVALID; /* 4-byte characters (emoji, rare scripts): walked, not skipped */
  case 1: return b >= 0x80 && b <= 0xBF ? 0 : DI_PLAIN_INVALID;
  case 2: return b >= 0x80 && b <= 0xBF ? 1 : DI_PLAIN_INVALID;
  case 3: return b >= 0xA0 && b <= 0xBF ? 1 : DI_PLAIN_INVALID; /* after E0: no overlongs */
  case 4: return b >= 0x80 && b <= 0x9F ? 1 : DI_PLAIN_INVALID; /* after ED: no surrogates */
  }
  return DI_PLAIN_INVALID;
}
#endif
