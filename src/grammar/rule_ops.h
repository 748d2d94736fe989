/* Operations on regular rules that a front-end asks for while parsing and that run once every rule
 * is defined (an operand may be defined later), with regular_set.c: Lark's lazy / max_chars /
 * max_tokens attributes and its terminals' `A & B` / `~A`, and the same attributes in XGrammar's
 * EBNF (`name[lazy, max_chars=N, max_tokens=N] ::= ...`). Each replaces its target rule's
 * alternatives; rule_ops.c runs them in dependency order. */
#ifndef DI_GRAMMAR_RULE_OPS_H
#define DI_GRAMMAR_RULE_OPS_H
#include "grammar/gram_ir.h"
#include "grammar/regular_set.h"

enum { DI_ROP_LAZY, DI_ROP_CHARS, DI_ROP_AND, DI_ROP_NOT, DI_ROP_TOKENS };
typedef struct di_rule_op {
  int kind, target, k, n; /* n: max_chars / max_tokens */
  int ops[DI_RLANG_MAX_OPERANDS];
  char where[48]; /* where it was written ("line L, column C"), for errors */
} di_rule_op;

typedef struct di_rule_ops {
  di_rule_op *v;
  int n, cap;
} di_rule_ops;

di_status di_rule_ops_push(di_rule_ops *o, int kind, int target, const int *ops, int k, int n, const char *where);
/* Runs every operation, each once the operations its operands reach are done (for one target, in
 * the order pushed: lazy before max_chars before max_tokens); errors start with `dialect` ("lark
 * grammar", "grammar"). */
di_status di_rule_ops_run(di_gb *b, const di_rule_ops *o, const char *dialect);
void di_rule_ops_free(di_rule_ops *o);
#endif
