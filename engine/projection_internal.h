/* projection_internal: helpers shared by the projection's .c files, not part
 * of the public API (engine/projection.h). */
#ifndef TDM_PROJECTION_INTERNAL_H
#define TDM_PROJECTION_INTERNAL_H

#include "status.h"

/* The whole file as a NUL-terminated string (at most 64 MiB) into *out, which
 * the caller frees with free(). TDM_ERR_IO / TDM_ERR_FORMAT (too large). */
tdm_status tdm_proj_read_text(const char *path, char **out, tdm_error *err);

#endif
