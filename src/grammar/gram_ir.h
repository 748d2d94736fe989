/* The grammar engine's intermediate form, shared by the three front-ends: rules made of
 * alternatives, each a sequence of byte classes (256-bit sets) and rule references. Front-ends
 * work in Unicode code points; di_gb_cpset() lowers a code-point set to UTF-8 byte sequences. */
#ifndef DI_GRAMMAR_IR_H
#define DI_GRAMMAR_IR_H
#include <stdint.h>
#include <stdio.h>
#include "util/status.h"

enum { DI_GE_CLASS = 0, DI_GE_RULE = 1, DI_GE_END = 2 };
typedef struct di_gel {
  int32_t kind; /* DI_GE_* */
  int32_t arg;  /* class id or rule id */
} di_gel;

/* A growable element sequence, what front-ends assemble an alternative in. */
typedef struct di_gseq {
  di_gel *v;
  int n, cap;
} di_gseq;

typedef struct di_gbyteset {
  uint32_t w[8];
} di_gbyteset;

typedef struct di_cprange {
  uint32_t lo, hi; /* inclusive code points */
} di_cprange;

typedef struct di_grule {
  char *name;
  int32_t *alt_off; /* alternatives: offsets into `els`, n_alts + 1 entries */
  int n_alts, cap_alts;
  di_gel *els;
  int n_els, cap_els;
  int defined;
  /* Lark max_tokens copies (regular_set.c di_rlang_bound_tokens): 0 an ordinary rule; r + 1 this
   * rule is a copy of a bounded lexeme's DFA state and rule r the same state with one token fewer
   * left; -1 the copy with one token left (its stacks die at a token boundary). gram_rt.c's
   * di_grt_boundary applies this per accepted token. */
  int32_t tok_link;
  /* > 0: the rule's language is one fixed language named by this number, whatever grammar holds it
   * (the time formats' rules, json_formats.h), so language_key.c writes the number instead of
   * describing the rule and what it reaches; 0 for every other rule. Whoever sets it must never
   * change the rule's language afterwards. canon_minlen: its shortest string in bytes (or a lower
   * bound), which language_key.c takes instead of computing it from the rule's parts. */
  int32_t canon, canon_minlen;
  /* 1: regular operations on rules that reach this one (regular_set.c: lazy, max_chars, max_tokens
   * over rule copies) leave out the alternatives referring to it, its automaton being too large for
   * their products (the leap seconds at non-zero offsets: what remains accepts less, never more); a
   * complemented operand reaching it is an error instead. */
  int32_t product_drop;
  /* 1: the rule is the body of a JSON string under a pattern or format that takes the default length
   * bound (string_bound.h): a character counter beside the automaton state stops it at di_gb.sb_n
   * characters; every reference to it is followed by the string's closing quote */
  int32_t sbound;
} di_grule;

/* The builder; also the compiled grammar's core once di_gb_finish() has flattened it. */
typedef struct di_gb {
  di_grule *rules;
  int n_rules, cap_rules;
  int32_t *name_ht; /* open-addressing index of the rules by name (-1 empty; NULL until the first rule),
                     * so a lookup is O(1): Lark's parameterised rules made the linear scan quadratic */
  int ht_cap;       /* a power of two, at least twice the rules */
  di_gbyteset *classes;
  int n_classes, cap_classes;
  int total_els, max_els;
  int oom;
  int has_token_refs;     /* the grammar has token references (token_ref.h): the matcher tries ids */
  struct di_cpcache *cpc; /* recently lowered code-point sets -> element, to reuse rules */
  int n_cpc, cap_cpc;
  struct di_repcache *rpc; /* repetitions built so far, per repeated element (di_gseq_repeat) */
  int n_rpc, cap_rpc;
  /* flattened form (after di_gb_finish) */
  di_gel *flat;         /* every alternative's elements followed by a DI_GE_END */
  int n_flat;
  int32_t *rule_alts;   /* alternative start positions in `flat`, grouped by rule */
  int32_t *rule_first;  /* n_rules + 1 offsets into rule_alts */
  int root;
  /* the default length bound of pattern / format strings (string_bound.h): sb_n characters (0: no rule
   * has sbound); after di_sbound_prepare, sb_cont marks per flat position the closing quotes that
   * follow a bounded body (NULL: none) and sb_radius bounds the characters any bounded body needs to
   * end from any of its positions */
  int sb_n, sb_radius;
  uint8_t *sb_cont;
  int sb_off; /* front ends: 1 while compiling text whose rules a regular operation copies (Lark's
               * max_chars: copies lose the marks), so json_schema.c writes the bound into the
               * grammar (counted repetitions) there instead */
} di_gb;

void di_gb_init(di_gb *b, int max_elements);
void di_gb_free(di_gb *b);
/* A rule by name, created undefined when new. */
int di_gb_rule(di_gb *b, const char *name);
/* A fresh anonymous rule named after `hint` (hint-N). */
int di_gb_new_rule(di_gb *b, const char *hint);
/* Marks rule r defined (it may have no alternatives); a no-op after an allocation failure, when r
 * may not exist (di_gb_new_rule returns 0 then). */
static inline void di_gb_mark_defined(di_gb *b, int r) {
  if (!b->oom && r >= 0 && r < b->n_rules)
    b->rules[r].defined = 1;
}
/* Appends an alternative to `rule` (marks the rule defined). Fails past the element budget. */
di_status di_gb_add_alt(di_gb *b, int rule, const di_gel *els, int n);
int di_gb_class(di_gb *b, const di_gbyteset *s);

/* Sequence helpers (they record allocation failure in b->oom). */
void di_gseq_push(di_gb *b, di_gseq *s, di_gel e);
void di_gseq_free(di_gseq *s);
void di_gseq_byte(di_gb *b, di_gseq *s, uint8_t c);
void di_gseq_bytes(di_gb *b, di_gseq *s, const char *p, size_t n);
/* Appends matching one code point of the set (ranges need not be sorted or disjoint). */
void di_gseq_cpset(di_gb *b, di_gseq *s, const di_cprange *r, int n, int negate);
/* One code point: its byte when ASCII, else its UTF-8 encoding (a one-range code point set). */
void di_gseq_cp(di_gb *b, di_gseq *s, uint32_t c);
/* Wraps a sequence into a rule of one alternative, returns the RULE element. */
di_gel di_gb_wrap(di_gb *b, const di_gseq *s, const char *hint);
/* Appends x{min,max} (max < 0 = unbounded) where x is one element. */
void di_gseq_repeat(di_gb *b, di_gseq *s, di_gel x, int min, int max);
/* Replaces the elements of s from index `from` on (a postfix operator's operand) by their
 * repetition {min,max}, wrapped as a rule named after `hint`. */
void di_gseq_repeat_tail(di_gb *b, di_gseq *s, int from, int min, int max, const char *hint);
/* Normalises the code-point range list: sort, merge, clip to 0..0x10FFFF minus nothing. Returns n. */
int di_cpset_normalize(di_cprange *r, int n);

/* Checks (every rule defined, none left-recursive, root productive), drops dead alternatives and
 * flattens. `root` is the start rule. Errors name the rule. */
di_status di_gb_finish(di_gb *b, int root);
void di_gb_print(const di_gb *b, FILE *f);

static inline int di_gbyteset_has(const di_gbyteset *s, unsigned c) { return (s->w[c >> 5] >> (c & 31)) & 1u; }
static inline void di_gbyteset_add(di_gbyteset *s, unsigned c) { s->w[c >> 5] |= 1u << (c & 31); }

/* Front-ends (each fills a fresh builder and calls di_gb_finish). */
struct di_grammar_options;
/* root: the start rule's name (NULL or "" = "root") */
di_status di_ebnf_compile(di_gb *b, const char *src, size_t len, const char *root);
/* Lark (lark.c): left recursion is rewritten away before di_gb_finish. */
di_status di_lark_compile(di_gb *b, const char *src, size_t len, const struct di_grammar_options *opt);
/* Regex into rule `rule`. json_string: emit code points as they appear inside a JSON string
 * (quotes, backslashes and control characters escaped). anchored: whole match (else the JSON
 * Schema "pattern" search semantics: unanchored unless ^/$). */
di_status di_regex_compile_into(di_gb *b, int rule, const char *src, size_t len, int json_string, int anchored);
di_status di_regex_compile(di_gb *b, const char *src, size_t len);
/* The same with dialect flags: DI_RE_LARK = Lark terminals' regexes (llguidance: Rust's regex
 * crate syntax, so any ASCII punctuation may be escaped and a brace that starts no quantifier is
 * literal), DI_RE_ICASE = ASCII case-insensitive (the /.../i flag). */
enum { DI_RE_LARK = 1, DI_RE_ICASE = 2, DI_RE_DOTALL = 4 };
di_status di_regex_compile_into_ex(di_gb *b, int rule, const char *src, size_t len, int json_string, int anchored,
                                   int flags);
di_status di_json_schema_compile(di_gb *b, const char *src, size_t len, const struct di_grammar_options *opt);
/* The schema's value as rule *rule of b (not finished: for embedding, e.g. Lark's %json); the
 * reason a schema admits nothing goes to why_empty (when why_cap > 0). */
di_status di_json_schema_compile_into(di_gb *b, const char *src, size_t len, const struct di_grammar_options *opt,
                                      int *rule, char *why_empty, size_t why_cap);
di_status di_json_any_compile(di_gb *b, const struct di_grammar_options *opt);
#endif
