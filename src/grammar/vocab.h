/* The grammar vocabulary's internal layout (vocab.c builds it, matcher.c walks it). */
#ifndef DI_GRAMMAR_VOCAB_H
#define DI_GRAMMAR_VOCAB_H
#include <pthread.h>
#include <stdatomic.h>
#include "grammar/grammar.h"

enum { DI_SUBTREE_MIN = 2048 }; /* a subtree this large gets its ids as a bitmap (vocab.c) */
enum { DI_PLAIN_ROWS = 64 };     /* plain_le's last row (vocab.c plain_rows) */
enum { DI_ALNUM_ROWS = 24 };     /* alnum_le's last row (DI_ASCII_RUN_MAX) */

/* One trie node as the classification walk reads it (matcher.c compute_ci): the fields a visit
 * needs side by side. The walk jumps over the subtrees it accepts or rejects whole, so after a jump
 * every array it reads misses the cache: one record is one miss instead of one per array. */
enum { DI_TNODE_NOT_ASCII = 1 }; /* flags: some token suffix below holds a NUL or a non-ASCII byte */
/* flags >> DI_TNODE_WPLAIN_SHIFT: the node's wplain (below) capped at DI_TNODE_WPLAIN_MAX, which also
 * stands for "not all plain" (rows stop below it: DI_PLAIN_ROWS) */
enum { DI_TNODE_WPLAIN_SHIFT = 1, DI_TNODE_WPLAIN_MAX = 127 };
_Static_assert((int)DI_PLAIN_ROWS < (int)DI_TNODE_WPLAIN_MAX, "a row must be below the cap");
enum { DI_TNODE_MAX_DEPTH = 65535, DI_TNODE_MAX_SUBTREES = 32767 };
typedef struct di_tnode { /* 16 bytes: four to a cache line */
  int32_t tnext;     /* the node's subtree ends before node tnext; its tokens: [tok_lo, tn[tnext].tok_lo) */
  int32_t tok_lo;    /* first sorted index at or below the node; tokens ending here: [tok_lo, next node's) */
  uint16_t depth;    /* 1-based: the node's byte is byte depth - 1 of its tokens (tokens are at most
                      * DI_TNODE_MAX_DEPTH bytes: vocab.c) */
  int16_t subtree;   /* its row of subtree_bits, or -1 (fewer than DI_SUBTREE_MIN tokens below, or past
                      * DI_TNODE_MAX_SUBTREES rows) */
  uint8_t byte;      /* the node's byte */
  uint8_t plain;     /* plain_below (DI_PLAIN_NOT: not all plain) */
  uint8_t len_below; /* the longest token suffix below (bytes, at most 255) */
  uint8_t flags;     /* DI_TNODE_* */
} di_tnode;

struct di_grammar_vocab {
  int n, words;           /* vocabulary size, bitmask words */
  uint64_t serial;        /* unique per vocabulary object: keys the per-grammar mask caches */
  uint8_t *bytes;         /* all token bytes */
  uint32_t *off;          /* token i = bytes[off[i] .. off[i+1]) */
  uint8_t *is_stop;
  int32_t *stop;
  int nstop;
  int32_t *sorted;        /* ids of the non-stop tokens with bytes, in byte order (trie preorder) */
  int nsorted, maxlen;
  /* the trie, nodes in preorder: tn[0 .. nnodes) plus a sentinel tn[nnodes] (tok_lo = nsorted) */
  di_tnode *tn;
  int nnodes;
  /* creation only (vocab.c builds tn from them, then frees them: NULL afterwards): node i has byte
   * tbyte[i] at depth tdepth[i] (1-based), its subtree ends before node tnext[i]; tok_lo[i] = first
   * sorted index at or below node i */
  uint8_t *tbyte;
  int32_t *tdepth, *tnext, *tok_lo;
  uint8_t *plain_below;   /* creation only: per trie node, the most characters in any token suffix below it
                           * when all of them are well-formed plain UTF-8 (plain_text.h), else 255 */
  int max_plain;          /* the largest of those below 255: no budget search needs to look further */
  uint64_t *ascii_below;  /* per trie node, 2 words: the ASCII bytes of the token suffixes below it, bit 0 = some
                           * byte below is NUL or not ASCII (ascii_run.h) */
  uint8_t *len_below;     /* creation only: per trie node, the longest token suffix below it (bytes, at most 255) */
  int32_t *subtree_of;    /* creation only: per trie node, its row of subtree_bits, or -1 */
  uint32_t *subtree_bits; /* rows of `words` words: the ids at or below such a node */
  uint8_t *wplain;        /* creation only: per trie node, the most plain characters (plain_text.h) of a whole token at
                           * or below it, DI_PLAIN_NOT when one of them is not plain text (in di_tnode's flags) */
  uint32_t *plain_le;     /* rows of `words` words, row L (0 .. plain_rows): the ids whose whole text is plain with at
                           * most L characters (matcher.c: a walk from a state that takes any L of them) */
  int plain_rows;
  uint8_t *walnum;        /* per trie node: the longest whole token at or below it when all are letters and digits
                           * of at most DI_ALNUM_ROWS bytes, else 255 */
  uint32_t *alnum_le;     /* rows of `words` words, row L (0 .. DI_ALNUM_ROWS): the ids of at most L letters and digits */
  uint32_t *len_le;       /* rows of `words` words, row L (0 .. len_le_max): the non-stop ids of at most L bytes
                           * (count_chain.h: positions near a counted string's end) */
  int len_le_max;
  uint16_t *quote_chars;  /* per id: the characters of its text before its first unescaped quote, read from a JSON
                           * string's character boundary (string_bound.h di_sb_lex), at most 255, | 0x100 when it has
                           * such a quote (matcher.c sb_filter) */
  int32_t *mark_ids;      /* ids whose bytes contain 0xFF, which spells token references (token_ref.h) */
  int nmark;
  /* count_chain.h, for tests: classifications derived / taken as they are, masks taken from the
   * state with the frames moved to the longest token's count */
  _Atomic long n_count_derived, n_count_same, n_count_masks;
  _Atomic long n_resumed; /* walks resumed from the abandoned walk of one frame fewer (matcher.c compute_ci) */
  _Atomic long n_group_walks, n_row_walks; /* walks of group keys; walks started from a plain row (matcher.c) */
  struct di_ci_shared *shared_ci; /* classifications shared by every grammar's matchers (ci_shared.h); NULL = none */
};
#endif
