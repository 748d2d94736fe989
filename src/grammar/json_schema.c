/* placeholder, replaced below */
#include "grammar/gram_ir.h"
#include "grammar/grammar.h"
di_status di_json_schema_compile(di_gb *b, const char *src, size_t len, const struct di_grammar_options *opt) {
  return di_error_set(DI_ERR_UNSUPPORTED, "json schema: not yet");
}
di_status di_json_any_compile(di_gb *b, const struct di_grammar_options *opt) {
  return di_error_set(DI_ERR_UNSUPPORTED, "json: not yet");
}
