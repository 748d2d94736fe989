/* The default length bound of JSON strings under a pattern or format (docs/structured-outputs.md,
 * "No runaway values"), kept as a character counter beside the automaton state instead of in it:
 * the pattern's automaton times 4,097 counts would be past any state budget, while a counter costs
 * one number per accepted step.
 *
 * The front end (json_schema.c: string values and keys, pattern / format strings) marks the string's
 * body rule (di_grule.sbound) and every reference to it is followed by the closing quote (or, for a
 * key's trie, what follows the key); di_sbound_prepare marks those positions (di_gb.sb_cont), so a
 * stack is inside a bounded body exactly when one of the frames below its top sits at such a
 * position. The counter (a matcher's step, di_grammar_accepts) counts the characters of the JSON
 * text the body has taken (code points, an escape one, a surrogate pair one, as maxLength counts:
 * JSON's lexical rules, di_sb_lex) and is reset where no stack is inside a body. At a character's
 * first byte with the count at the bound the bounded stacks are dropped (di_sb_prune) before the
 * byte is taken; the string can
 * still end (its closing quote is no character). A token is allowed only when, after it, the body
 * can still end within the characters left (di_sb_viable: the fewest characters from the state to a
 * stack outside the body); tokens that cannot come near the bound (at most sb_n - count - sb_radius
 * bytes: a byte is at most one character, and sb_radius bounds the characters any position of a body
 * needs to end) are never affected, so the mask is the unbounded one except within a token's length
 * and the body's radius of the bound (matcher.c sb_filter). */
#ifndef DI_GRAMMAR_STRING_BOUND_H
#define DI_GRAMMAR_STRING_BOUND_H
#include "grammar/gram_rt.h"

/* di_sb_info bits: the state has a stack inside a bounded body / one outside (or it accepts) */
enum { DI_SB_INSIDE = 1, DI_SB_OUTSIDE = 2, DI_SB_KNOWN = 4 };
/* A body whose positions may need more than this many characters to end is left unbounded (a
 * pattern such as `^a+b{300}$`; documented): the radius sets how far from the bound masks are
 * checked. */
enum { DI_SB_RADIUS_MAX = 256 };

/* The counter (one uint32_t per accepted step): characters of the current body in the low 24 bits,
 * the position inside the current character in the high 8 (di_sb_lex). */
static inline uint32_t di_sb_count(uint32_t cs) { return cs & 0xffffffu; }

/* After di_gb_finish, with each rule's shortest string in bytes (di_language_key_rule_minlen): marks
 * the closing quotes after bounded bodies and computes the radius; bodies past DI_SB_RADIUS_MAX lose
 * their mark. g->sb_n = 0 afterwards when nothing is bounded. */
di_status di_sbound_prepare(di_gb *g, const int32_t *minlen);

int di_sb_info_slow(di_grt *rt, int s);
/* DI_SB_* bits of state s (s >= 0), DI_GRT_ERROR out of memory. */
static inline int di_sb_info(di_grt *rt, int s) {
  if (s < rt->sb_state_cap && rt->sb_info[s])
    return rt->sb_info[s];
  return di_sb_info_slow(rt, s);
}
/* State s without its stacks inside a bounded body (DI_GRT_DEAD when none is left), memoised. */
int di_sb_prune(di_grt *rt, int s);

/* The counter's lexical step for byte c at position lex (JSON's string lexis): *tick = 1 when c is a
 * character's first byte; returns the next position. Positions: 0 a boundary; 1-3 UTF-8
 * continuation bytes left; 4 after a backslash; 5-8 hex digits of a \u escape left (1-4); 11-13 the
 * same of a high surrogate's escape (3-1 left, its first two digits read as d, 8-b); 9 after a high
 * surrogate (its low surrogate's backslash is no new character: a pair is one, as maxLength counts;
 * a lone surrogate is no JSON character the grammars take); 14 that backslash; 15 its \u's four
 * digits left. */
static inline unsigned di_sb_lex(unsigned lex, unsigned c, int *tick) {
  *tick = 0;
  switch (lex) {
  case 9:
    if (c == '\\')
      return 14;
    __attribute__((fallthrough)); /* no low surrogate follows */
  case 0:
    if (c == '"' || (c >= 0x80 && c < 0xC0))
      return 0;
    *tick = 1;
    return c == '\\' ? 4 : c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
  case 4: return c == 'u' ? 8 : 0;
  case 8: return c == 'd' || c == 'D' ? 11 : 7;
  case 11: return (c >= '8' && c <= '9') || (c >= 'a' && c <= 'b') || (c >= 'A' && c <= 'B') ? 12 : 6;
  case 12: return 13;
  case 13: return 9;
  case 14: return c == 'u' ? 15 : 0;
  case 15: return 7;
  case 5: return 0;
  default: return lex - 1; /* 1-3, 6, 7 */
  }
}

/* One byte from state s with the counter *cs (the matcher's step when the grammar has bounded
 * bodies; di_grt_step otherwise). */
static inline int di_sb_step(di_grt *rt, int s, uint32_t *cs, unsigned c) {
  if (!rt->g->sb_cont)
    return di_grt_step(rt, s, c);
  int info = di_sb_info(rt, s);
  if (info < 0)
    return info;
  uint32_t x = 0;
  if (info & DI_SB_INSIDE) {
    uint32_t cnt = *cs & 0xffffffu;
    int tick;
    const unsigned lex = di_sb_lex(*cs >> 24, c, &tick);
    if (tick) {
      if (cnt >= (uint32_t)rt->g->sb_n && (s = di_sb_prune(rt, s)) < 0)
        return s;
      cnt++;
    }
    x = cnt | lex << 24;
  }
  int ns = di_grt_step(rt, s, c);
  if (ns >= 0) {
    int ni = di_sb_info(rt, ns);
    if (ni < 0)
      return ni;
    if (!(ni & DI_SB_INSIDE))
      x = 0;
  }
  *cs = x;
  return ns;
}

/* 1 when state s with counter cs can still leave its bounded body within the characters left (always
 * when no stack is inside one), 0 when not, DI_GRT_ERROR out of memory. */
int di_sb_viable(di_grt *rt, int s, uint32_t cs);
#endif
