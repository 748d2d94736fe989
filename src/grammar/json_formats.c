/* JSON Schema `format` values as regular expressions (ECMA-262 with the u flag, matched whole),
 * built from the grammars of their RFCs: dates and times (RFC 3339 section 5.6; `duration`, its
 * appendix A), email (RFC 5321 mailbox, simplified: dot-atoms or a quoted local part), ipv4/ipv6
 * (RFC 2673 / RFC 4291 as RFC 3986 writes them), hostname (RFC 1123 labels), uri / uri-reference
 * (RFC 3986), uri-template (RFC 6570 level 4), json-pointer (RFC 6901) and relative-json-pointer.
 * What a regex cannot say is documented in docs/structured-outputs.md: a hostname's 253-character
 * total and the validity of Punycode (xn--) labels are not checked. */
#include <stdio.h>
#include <string.h>
#include "grammar/json_formats.h"

#define DATE_RE                                                                                                  \
  "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))" \
  "|([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)"
/* A leap second (:60) is valid only at 23:59 UTC. The regex takes it written with a zero offset;
 * every other local minute's leap second (15:59:60-08:00) is added by di_json_format_extra (a digit
 * trie, its offsets computed), since pairing the local minute with its offset is 1,440 cases. */
#define TIME_RE                                                                                     \
  "(([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]+)?([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])" \
  "|23:59:60(\\.[0-9]+)?([Zz]|[+-]00:00))"
#define OCTET_RE "(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
#define IPV4_RE OCTET_RE "(\\." OCTET_RE "){3}"
#define H16 "[0-9A-Fa-f]{1,4}"
#define LS32 "(" H16 ":" H16 "|" IPV4_RE ")"
#define H16S(n) "((" H16 ":){0," #n "}" H16 ")?" /* up to n+1 groups before a "::" */
#define IPV6_RE                                                                                          \
  "((" H16 ":){6}" LS32 "|::(" H16 ":){5}" LS32 "|(" H16 ")?::(" H16 ":){4}" LS32 "|" H16S(1) "::(" H16 \
  ":){3}" LS32 "|" H16S(2) "::(" H16 ":){2}" LS32 "|" H16S(3) "::" H16 ":" LS32 "|" H16S(4) "::" LS32   \
  "|" H16S(5) "::" H16 "|" H16S(6) "::)"
#define LABEL_RE "[A-Za-z0-9]([A-Za-z0-9\\-]{0,61}[A-Za-z0-9])?"
#define HOSTNAME_RE LABEL_RE "(\\." LABEL_RE ")*"
/* RFC 3986 */
#define UNRESERVED "A-Za-z0-9\\-._~"
#define SUBDELIMS "!$&'()*+,;="
#define PCT "%[0-9A-Fa-f]{2}"
#define PCHAR "([" UNRESERVED SUBDELIMS ":@]|" PCT ")"
#define SEGMENT PCHAR "*"
#define SEGMENT_NZ PCHAR "+"
#define SEGMENT_NZ_NC "([" UNRESERVED SUBDELIMS "@]|" PCT ")+"
#define USERINFO "([" UNRESERVED SUBDELIMS ":]|" PCT ")*"
#define REGNAME "([" UNRESERVED SUBDELIMS "]|" PCT ")*"
#define IPVFUTURE "[vV][0-9A-Fa-f]+\\.[" UNRESERVED SUBDELIMS ":]+"
#define HOST "(\\[(" IPV6_RE "|" IPVFUTURE ")\\]|" REGNAME ")"
#define AUTHORITY "(" USERINFO "@)?" HOST "(:[0-9]*)?"
#define PATH_ABEMPTY "(/" SEGMENT ")*"
#define PATH_ABSOLUTE "/(" SEGMENT_NZ "(/" SEGMENT ")*)?"
#define PATH_ROOTLESS SEGMENT_NZ "(/" SEGMENT ")*"
#define PATH_NOSCHEME SEGMENT_NZ_NC "(/" SEGMENT ")*"
#define QUERY "([/?]|" PCHAR ")*"
#define QUERY_FRAGMENT "(\\?" QUERY ")?(#" QUERY ")?"
#define URI_RE "[A-Za-z][A-Za-z0-9+\\-.]*:(//" AUTHORITY PATH_ABEMPTY "|" PATH_ABSOLUTE "|" PATH_ROOTLESS ")?" QUERY_FRAGMENT
#define RELATIVE_REF "(//" AUTHORITY PATH_ABEMPTY "|" PATH_ABSOLUTE "|" PATH_NOSCHEME ")?" QUERY_FRAGMENT
/* RFC 6570 */
#define VARCHAR "([A-Za-z0-9_]|" PCT ")"
#define VARSPEC VARCHAR "(\\.?" VARCHAR ")*(:[1-9][0-9]{0,3}|\\*)?"
#define EXPRESSION "\\{[+#./;?&=,!@|]?" VARSPEC "(," VARSPEC ")*\\}"
#define TEMPLATE_LITERAL "([!#$&-;=?-\\[\\]_a-z~\\u00A0-\\uD7FF\\uE000-\\uFFFD\\u{10000}-\\u{10FFFF}]|" PCT ")"
/* RFC 3339 appendix A */
#define DUR_TIME "T([0-9]+H([0-9]+M([0-9]+S)?)?|[0-9]+M([0-9]+S)?|[0-9]+S)"
#define DUR_DATE "([0-9]+D|[0-9]+M([0-9]+D)?|[0-9]+Y([0-9]+M([0-9]+D)?)?)"
#define JSON_POINTER "(/([^/~]|~[01])*)*"
#define EMAIL_LOCAL "[A-Za-z0-9!#$%&'*+/=?^_`{|}~\\-]"

static const char *const FORMATS[][2] = {
    {"date", DATE_RE},
    {"time", TIME_RE},
    {"date-time", "(" DATE_RE ")[Tt]" TIME_RE},
    {"uuid", "[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"},
    {"email", "(" EMAIL_LOCAL "+(\\." EMAIL_LOCAL "+)*|\"([^\"\\\\]|\\\\.)*\")@(" LABEL_RE "(\\." LABEL_RE
              ")+|\\[" IPV4_RE "\\]|\\[IPv6:" IPV6_RE "\\])"},
    {"ipv4", IPV4_RE},
    {"ipv6", IPV6_RE},
    {"hostname", HOSTNAME_RE},
    {"uri", URI_RE},
    {"uri-reference", "(" URI_RE "|" RELATIVE_REF ")"},
    {"uri-template", "(" TEMPLATE_LITERAL "|" EXPRESSION ")*"},
    {"duration", "P(" DUR_DATE "(" DUR_TIME ")?|" DUR_TIME "|[0-9]+W)"},
    {"json-pointer", JSON_POINTER},
    {"relative-json-pointer", "(0|[1-9][0-9]*)(#|" JSON_POINTER ")"},
};

/* Formats JSON Schema defines that a regex here does not assert (Unicode hostnames, IRIs, ECMA-262
 * regexes): an error unless ignore_unsupported_keywords. Other names are not JSON Schema's and are
 * annotations. */
static const char *const UNENFORCED_FORMATS[] = {"idn-email", "idn-hostname", "iri", "iri-reference", "regex", NULL};

const char *di_json_format_regex(const char *name, int *defined) {
  for (size_t i = 0; i < sizeof FORMATS / sizeof FORMATS[0]; i++)
    if (strcmp(name, FORMATS[i][0]) == 0) {
      *defined = 1;
      return FORMATS[i][1];
    }
  *defined = 0;
  for (int i = 0; UNENFORCED_FORMATS[i]; i++)
    if (strcmp(name, UNENFORCED_FORMATS[i]) == 0)
      *defined = 1;
  return NULL;
}

/* Leap seconds at a non-zero offset (RFC 3339 section 5.7: 23:59:60 UTC; a local time L minutes past
 * midnight with offset o is UTC L - o, so o = L - 1439 (negative) or L + 1 (positive, below 24:00),
 * both taken; L = 23:59 itself, with a zero offset, is in TIME_RE). Any automaton must hold the local
 * minute across the fraction (a fooling set of 1,440 strings), so the rule is a digit trie reading
 * HH:MM (3 / 10 / 6 / 10-way rules: only the alternatives of the digits read so far are live parse
 * items), each local minute one alternative `m2 ":60" FRAC OFF_L`, OFF_L its two offsets made of
 * shared "-hh:" / "+hh:" / "mm" rules: ~15,000 elements, once per grammar. Its rules are numbered
 * fixed languages (di_grule.canon), or every language key within a token's reach of a time would
 * spell the trie out (docs/structured-outputs.md "Formats", PERFORMANCE.md s14-23l). */
/* the classes of the bytes the trie spells, interned once (di_gb_class is a linear search) */
typedef struct {
  di_gb *b;
  int cls[128];
  di_status st; /* the first di_gb_add_alt failure (the element budget, memory) */
} leap_bytes;

static void leap_add(leap_bytes *k, int rule, const di_gel *els, int n) {
  di_status st = di_gb_add_alt(k->b, rule, els, n);
  if (k->st == DI_OK)
    k->st = st;
}

static void leap_byte(leap_bytes *k, di_gseq *s, char c) {
  if (k->cls[(int)c] < 0) {
    di_gbyteset set = {{0}};
    di_gbyteset_add(&set, (unsigned char)c);
    k->cls[(int)c] = di_gb_class(k->b, &set);
  }
  di_gseq_push(k->b, s, (di_gel){DI_GE_CLASS, k->cls[(int)c]});
}

/* Every rule of the trie (and the time rule) is the same language in every grammar: named by
 * di_grule.canon, so that a language key near a time (language_key.c) does not spell out the
 * trie. The numbers: */
enum { /* (shortest strings: the time 9 bytes, HH:MM:SSZ; a leap second 14, HH:MM:60+hh:mm) */
  DI_CANON_TIME = 1,
  DI_CANON_LEAP = 2,
  DI_CANON_LEAP_H = 3,                             /* + the hour's tens digit (3) */
  DI_CANON_LEAP_M = DI_CANON_LEAP_H + 3,           /* + the hour (24) */
  DI_CANON_LEAP_MM = DI_CANON_LEAP_M + 24,         /* + hour * 6 + the minute's tens digit (144) */
  DI_CANON_LEAP_OFFSET = DI_CANON_LEAP_MM + 144,   /* + the local minute (1,440) */
};

/* names rule r's language by `canon`; minlen: its shortest string, in bytes */
static int leap_canon(di_gb *b, int r, int canon, int minlen) {
  if (!b->oom) {
    b->rules[r].canon = canon;
    b->rules[r].canon_minlen = minlen;
  }
  return r;
}

/* a rule of one alternative: its text, with `ref` (when >= 0) after it */
static int leap_text(leap_bytes *k, di_gseq *s, const char *text, int ref) {
  int r = di_gb_new_rule(k->b, "leap");
  s->n = 0;
  for (const char *p = text; *p; p++)
    leap_byte(k, s, *p);
  if (ref >= 0)
    di_gseq_push(k->b, s, (di_gel){DI_GE_RULE, ref});
  leap_add(k, r, s->v, s->n);
  return r;
}

static di_status leap_rule(di_gb *b, int *out) {
  leap_bytes k = {b, {0}, DI_OK};
  for (int i = 0; i < 128; i++)
    k.cls[i] = -1;
  int frac = di_gb_new_rule(b, "leap-frac"); /* "" | "." [0-9]+ */
  di_gseq s = {0};
  leap_add(&k, frac, NULL, 0);
  leap_byte(&k, &s, '.');
  di_gbyteset dig = {{0}};
  for (int d = '0'; d <= '9'; d++)
    di_gbyteset_add(&dig, (unsigned)d);
  di_gseq_repeat(b, &s, (di_gel){DI_GE_CLASS, di_gb_class(b, &dig)}, 1, -1);
  leap_add(&k, frac, s.v, s.n);
  /* shared pieces, so that each of the 1,439 local minutes costs one alternative and one offset
   * rule of two short alternatives: ":60" and the fraction; "-hh:" / "+hh:" per hour; "mm" per
   * minute */
  int sec = leap_text(&k, &s, ":60", frac);
  int neg_h[24], pos_h[24], mm[60];
  char t[16]; /* (room for any int: the compiler cannot see h < 24) */
  for (int h = 0; h < 24; h++) {
    snprintf(t, sizeof t, "-%02d:", h);
    neg_h[h] = leap_text(&k, &s, t, -1);
    snprintf(t, sizeof t, "+%02d:", h);
    pos_h[h] = leap_text(&k, &s, t, -1);
  }
  for (int m = 0; m < 60; m++) {
    snprintf(t, sizeof t, "%02d", m);
    mm[m] = leap_text(&k, &s, t, -1);
  }
  /* the trie, built bottom-up (a rule refers to older rules only: the grammar's shortest-string
   * passes then settle at once) */
  int hr[24];
  for (int h = 0; h < 24 && !b->oom; h++) {
    int m2r[6];
    for (int m1 = 0; m1 < 6 && !b->oom; m1++) {
      int off[10];
      for (int m2 = 0; m2 < 10; m2++) { /* the offsets of local minute L: L - 1439 and L + 1 */
        int L = h * 60 + m1 * 10 + m2, neg = 1439 - L, pos = L + 1;
        if (L == 1439)
          break;
        off[m2] = leap_canon(b, di_gb_new_rule(b, "leap-offset"), DI_CANON_LEAP_OFFSET + L, 6);
        di_gel e[2] = {{DI_GE_RULE, neg_h[neg / 60]}, {DI_GE_RULE, mm[neg % 60]}};
        leap_add(&k, off[m2], e, 2);
        e[0].arg = pos_h[pos / 60];
        e[1].arg = mm[pos % 60];
        leap_add(&k, off[m2], e, 2);
      }
      /* the minute's units digit, then :60, fraction, offsets */
      m2r[m1] = leap_canon(b, di_gb_new_rule(b, "leap-mm"), DI_CANON_LEAP_MM + h * 6 + m1, 10);
      for (int m2 = 0; m2 < 10 && h * 60 + m1 * 10 + m2 < 1439; m2++) {
        s.n = 0;
        leap_byte(&k, &s, (char)('0' + m2));
        di_gseq_push(b, &s, (di_gel){DI_GE_RULE, sec});
        di_gseq_push(b, &s, (di_gel){DI_GE_RULE, off[m2]});
        leap_add(&k, m2r[m1], s.v, s.n);
      }
    }
    hr[h] = leap_canon(b, di_gb_new_rule(b, "leap-m"), DI_CANON_LEAP_M + h, 11); /* the minute's tens digit */
    for (int m1 = 0; m1 < 6; m1++) {
      s.n = 0;
      leap_byte(&k, &s, (char)('0' + m1));
      di_gseq_push(b, &s, (di_gel){DI_GE_RULE, m2r[m1]});
      leap_add(&k, hr[h], s.v, s.n);
    }
  }
  int h1r[3];
  for (int h1 = 0; h1 < 3 && !b->oom; h1++) { /* the hour's units digit and ':' */
    h1r[h1] = leap_canon(b, di_gb_new_rule(b, "leap-h"), DI_CANON_LEAP_H + h1, 13);
    for (int h = h1 * 10; h < 24 && h < h1 * 10 + 10; h++) {
      s.n = 0;
      leap_byte(&k, &s, (char)('0' + h % 10));
      leap_byte(&k, &s, ':');
      di_gseq_push(b, &s, (di_gel){DI_GE_RULE, hr[h]});
      leap_add(&k, h1r[h1], s.v, s.n);
    }
  }
  int top = leap_canon(b, di_gb_new_rule(b, "leap-second"), DI_CANON_LEAP, 14);
  if (!b->oom) /* lexeme operations (Lark's max_chars over a %json) keep the zero-offset form only */
    b->rules[top].product_drop = 1;
  for (int h1 = 0; h1 < 3 && !b->oom; h1++) {
    s.n = 0;
    leap_byte(&k, &s, (char)('0' + h1));
    di_gseq_push(b, &s, (di_gel){DI_GE_RULE, h1r[h1]});
    leap_add(&k, top, s.v, s.n);
  }
  di_gseq_free(&s);
  if (k.st == DI_OK && b->oom)
    k.st = di_error_set(DI_ERR_OOM, "out of memory building the grammar");
  *out = top;
  return k.st;
}

di_status di_json_format_compile(di_gb *b, const char *name, const char *re, int rule, int *time_cache) {
  int date_time = strcmp(name, "date-time") == 0;
  if (!date_time && strcmp(name, "time") != 0)
    return di_regex_compile_into(b, rule, re, strlen(re), 1, 1);
  if (*time_cache < 0) { /* TIME_RE | the leap seconds at other offsets, once per builder */
    int t = di_gb_new_rule(b, "time");
    DI_TRY(di_regex_compile_into(b, t, TIME_RE, sizeof TIME_RE - 1, 1, 1));
    int leap = -1;
    DI_TRY(leap_rule(b, &leap));
    di_gel e = {DI_GE_RULE, leap};
    DI_TRY(di_gb_add_alt(b, t, &e, 1));
    *time_cache = leap_canon(b, t, DI_CANON_TIME, 9);
  }
  di_gel els[2];
  int n = 0;
  if (date_time) { /* the date and its T, then the time */
    int d = di_gb_new_rule(b, "date-t");
    static const char DT[] = "(" DATE_RE ")[Tt]";
    DI_TRY(di_regex_compile_into(b, d, DT, sizeof DT - 1, 1, 1));
    els[n++] = (di_gel){DI_GE_RULE, d};
  }
  els[n++] = (di_gel){DI_GE_RULE, *time_cache};
  return di_gb_add_alt(b, rule, els, n);
}
