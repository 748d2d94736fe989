/* llguidance's parametric Lark rules (docs: llguidance docs/parametric.md): `name::_` rules take a
 * 64-bit parameter; a reference `name::EXPR` computes the callee's parameter from the caller's, and
 * `%if COND` keeps an alternative only for parameters where COND holds. This file reads and
 * evaluates those expressions and conditions; lark.c instantiates the rules per parameter value. */
#ifndef DI_GRAMMAR_LARK_PARAM_H
#define DI_GRAMMAR_LARK_PARAM_H
#include <stddef.h>
#include <stdint.h>

/* A parameter expression at s[*i] for the current parameter p: `_`, a literal (decimal or 0x hex),
 * set_bit(k), clear_bit(k), bit_and(v), bit_or(v), incr(R), decr(R) (saturating, R a bit range
 * `[x:y]` or `_`). Only a literal when !in_param. 1 with *out and *i past it; 0 with *err (a
 * static message) and *i where it went wrong. */
int di_lark_param_expr(const char *s, size_t n, size_t *i, int in_param, uint64_t p, uint64_t *out, const char **err);

/* A condition at s[*i] (after `%if`): true, true(), bit_clear(k), bit_set(k), is_ones(R),
 * is_zeros(R), eq / ne / lt / le / gt / ge (R, v), bit_count_eq / ne / lt / le / gt / ge (R, k),
 * and(c, c), or(c, c), not(c). 1 with *out (0 / 1), else 0 with *err as above. */
int di_lark_param_cond(const char *s, size_t n, size_t *i, uint64_t p, int *out, const char **err);
#endif
