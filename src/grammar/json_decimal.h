/* Decimal bounds for JSON numbers (json_schema.c's minimum/maximum with fractions): a bound as
 * integer part + fraction digits, and the fraction parts that lie between two bounds as a regex. */
#ifndef DI_GRAMMAR_JSON_DECIMAL_H
#define DI_GRAMMAR_JSON_DECIMAL_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
  int64_t i;   /* integer part (>= 0) */
  char f[20];  /* fraction digits without trailing zeros ("" for an integer) */
} di_decimal;

/* |x| as a decimal, to 15 fraction digits (a bound given more finely is rounded there); 0 when
 * |x| >= 9e15. */
int di_decimal_from_double(double x, di_decimal *out);
/* The fraction part (".ddd" or nothing) of numbers whose fraction 0.ddd lies above lo (NULL: no
 * lower bound; exclusive when lo_ex) and below hi (NULL: below 1; exclusive when hi_ex), as an
 * ECMA-262 regex written to out: "" (no fraction at all), "\.(...)" or "(\.(...))?". Fraction
 * digits beyond the bounds' own are at most max_digits (< 0: unbounded). Returns 0 when no
 * fraction fits, -1 when out is too small, else 1. */
int di_decimal_fraction_regex(const char *lo, int lo_ex, const char *hi, int hi_ex, int max_digits, char *out,
                              size_t cap);
#endif
