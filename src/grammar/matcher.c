/* placeholder */
#include "grammar/grammar_impl.h"
void di_gvcache_free_all(struct di_gvcache *c) { (void)c; }
