#include "status.h"

#include <stdio.h>
#include <string.h>

tdm_status tdm_error_vset(tdm_error *err, tdm_status code, const char *fmt, va_list ap)
{
    if (err) {
        err->code = code;
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    }
    return code;
}

tdm_status tdm_error_set(tdm_error *err, tdm_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    tdm_error_vset(err, code, fmt, ap);
    va_end(ap);
    return code;
}

tdm_status tdm_error_wrap(tdm_error *err, const char *fmt, ...)
{
    if (!err)
        return TDM_OK;
    char prefix[TDM_ERROR_MSG_MAX], old[TDM_ERROR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err->msg, sizeof old);
    size_t plen = strnlen(prefix, sizeof err->msg - 3);
    memcpy(err->msg, prefix, plen);
    memcpy(err->msg + plen, ": ", 2);
    size_t room = sizeof err->msg - plen - 3;
    size_t olen = strnlen(old, room);
    memcpy(err->msg + plen + 2, old, olen);
    err->msg[plen + 2 + olen] = '\0';
    return err->code;
}

void tdm_error_clear(tdm_error *err)
{
    if (err) {
        err->code = TDM_OK;
        err->msg[0] = '\0';
    }
}

const char *tdm_status_name(tdm_status s)
{
    switch (s) {
    case TDM_OK: return "TDM_OK";
    case TDM_ERR_IO: return "TDM_ERR_IO";
    case TDM_ERR_FORMAT: return "TDM_ERR_FORMAT";
    case TDM_ERR_OOM: return "TDM_ERR_OOM";
    case TDM_ERR_CUDA: return "TDM_ERR_CUDA";
    case TDM_ERR_UNSUPPORTED: return "TDM_ERR_UNSUPPORTED";
    case TDM_ERR_INVALID: return "TDM_ERR_INVALID";
    }
    return "TDM_ERR_?";
}

/* The log sink. Set once at start-up by the CLI or a test, read everywhere. */
static tdm_log_fn g_log_fn;
static void *g_log_user;
static tdm_log_level g_log_min = TDM_LOG_INFO;

void tdm_log_set_sink(tdm_log_fn fn, void *user, tdm_log_level min_level)
{
    g_log_fn = fn;
    g_log_user = user;
    g_log_min = min_level;
}

void tdm_log(tdm_log_level level, const char *fmt, ...)
{
    if (level < g_log_min)
        return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (g_log_fn) {
        g_log_fn(level, buf, g_log_user);
        return;
    }
    static const char *names[] = {"debug", "info", "warn", "error"};
    fprintf(stderr, "tandem %s: %s\n", names[level], buf);
}
