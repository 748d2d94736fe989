/* The table of the architecture registry (see arch_registry.h). */
#include "api/arch_registry.h"
#include <stddef.h>

static const di_arch_entry *const ENTRIES[] = {&di_arch_deepseek_v2, &di_arch_deepseek_v3, &di_arch_deepseek_v4};

const di_arch_entry *di_arch_entry_find(di_arch arch) {
  for (size_t i = 0; i < sizeof ENTRIES / sizeof ENTRIES[0]; i++)
    if (ENTRIES[i]->arch == arch) return ENTRIES[i];
  return NULL;
}
