/* status: the error model shared by every tandem module.
 *
 * Every fallible call returns a tdm_status and, when it fails, fills the
 * caller's tdm_error (which may be NULL when the caller does not want the text).
 * The message names the offending field or value; the caller owns the struct.
 * assert() is for bugs only; nothing below main() calls exit().
 */
#ifndef TDM_STATUS_H
#define TDM_STATUS_H

#include <stdarg.h>

typedef enum tdm_status {
    TDM_OK = 0,
    TDM_ERR_IO,          /* open/read/mmap/socket failed */
    TDM_ERR_FORMAT,      /* the input is malformed (file, JSON, request) */
    TDM_ERR_OOM,         /* host or device memory (or a budget) exhausted */
    TDM_ERR_CUDA,        /* a CUDA runtime call failed */
    TDM_ERR_UNSUPPORTED, /* valid input this build cannot handle */
    TDM_ERR_INVALID      /* the caller passed a bad argument */
} tdm_status;

#define TDM_ERROR_MSG_MAX 512

typedef struct tdm_error {
    tdm_status code;
    char msg[TDM_ERROR_MSG_MAX];
} tdm_error;

/* Records code and a printf-style message in err (if non-NULL); returns code
 * so that callers can write `return tdm_error_set(err, TDM_ERR_IO, ...)`. */
tdm_status tdm_error_set(tdm_error *err, tdm_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
tdm_status tdm_error_vset(tdm_error *err, tdm_status code, const char *fmt, va_list ap);

/* Prefixes the message already in err with "context: " (for call chains). */
tdm_status tdm_error_wrap(tdm_error *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void tdm_error_clear(tdm_error *err);

/* Stable upper-case name, e.g. "TDM_ERR_FORMAT". */
const char *tdm_status_name(tdm_status s);

/* Log sink: the only global mutable state besides the ISA dispatch table. */
typedef enum tdm_log_level { TDM_LOG_DEBUG, TDM_LOG_INFO, TDM_LOG_WARN, TDM_LOG_ERROR } tdm_log_level;
typedef void (*tdm_log_fn)(tdm_log_level level, const char *msg, void *user);

/* Installs a sink (NULL restores the default: stderr, INFO and above). */
void tdm_log_set_sink(tdm_log_fn fn, void *user, tdm_log_level min_level);
void tdm_log(tdm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Returns the status of `call` from the enclosing function unless it is TDM_OK. */
#define TDM_TRY(call)                                                                          \
    do {                                                                                       \
        tdm_status tdm_try_ = (call);                                                          \
        if (tdm_try_ != TDM_OK)                                                                \
            return tdm_try_;                                                                   \
    } while (0)

#endif
