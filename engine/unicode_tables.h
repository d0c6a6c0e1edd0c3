/* Internal: the generated tables behind unicode.c (engine/unicode_tables.c,
 * made by tools/gen_unicode.py). Not a public API. */
#ifndef TDM_UNICODE_TABLES_H
#define TDM_UNICODE_TABLES_H

#include <stdint.h>

#define TDM_UNICODE_FLAG_BITS 9

extern const uint32_t tdm_unicode_flag_ranges_n;
extern const uint32_t tdm_unicode_flag_ranges[];
extern const uint16_t tdm_unicode_flags_latin1[256];
extern const uint32_t tdm_unicode_lower_n;
extern const uint32_t tdm_unicode_lower[][2];

#endif
