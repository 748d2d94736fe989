/* JSON Schema `format` values as regular expressions (ECMA-262 with the u flag, matched whole),
 * built from the grammars of their RFCs: dates and times (RFC 3339 section 5.6; `duration`, its
 * appendix A), email (RFC 5321 mailbox, simplified: dot-atoms or a quoted local part), ipv4/ipv6
 * (RFC 2673 / RFC 4291 as RFC 3986 writes them), hostname (RFC 1123 labels), uri / uri-reference
 * (RFC 3986), uri-template (RFC 6570 level 4), json-pointer (RFC 6901) and relative-json-pointer.
 * What a regex cannot say is documented in docs/structured-outputs.md: a hostname's 253-character
 * total and the validity of Punycode (xn--) labels are not checked. */
#include <string.h>
#include "grammar/json_formats.h"

#define DATE_RE                                                                                                  \
  "([0-9]{4}-((0[13578]|1[02])-(0[1-9]|[12][0-9]|3[01])|(0[469]|11)-(0[1-9]|[12][0-9]|30)|02-(0[1-9]|1[0-9]|2[0-8]))" \
  "|([0-9]{2}(0[48]|[2468][048]|[13579][26])|([02468][048]|[13579][26])00)-02-29)"
/* a leap second (:60) only at 23:59 UTC written with a zero offset: exact, but leap seconds written
 * in other offsets (15:59:60-08:00) are refused, their check pairing the time with the offset
 * (1,440 cases) being too large a regex for every time format */
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
