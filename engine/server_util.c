/* server_util: growable buffers, JSON field validation and error bodies. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server_internal.h"

static bool buf_reserve(srv_buf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return true;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + extra + 1) {
        if (cap > SIZE_MAX / 2)
            return false;
        cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p)
        return false;
    b->p = p;
    b->cap = cap;
    return true;
}

bool srv_buf_append(srv_buf *b, const void *data, size_t n)
{
    if (!buf_reserve(b, n))
        return false;
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
    return true;
}

bool srv_buf_puts(srv_buf *b, const char *s)
{
    return srv_buf_append(b, s, strlen(s));
}

bool srv_buf_printf(srv_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char tmp[512];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0)
        return false;
    if ((size_t)n < sizeof tmp)
        return srv_buf_append(b, tmp, (size_t)n);
    if (!buf_reserve(b, (size_t)n))
        return false;
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
    return true;
}

void srv_buf_free(srv_buf *b)
{
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

bool srv_fail(srv_reqerr *e, int status, const char *param, const char *fmt, ...)
{
    e->status = status;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return false;
}

static const cJSON *field(const cJSON *obj, const char *key, bool *present)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (present)
        *present = v && !cJSON_IsNull(v);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

bool srv_json_number(const cJSON *obj, const char *key, double lo, double hi, double *out,
                     bool *present, srv_reqerr *e)
{
    const cJSON *v = field(obj, key, present);
    if (!v)
        return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return srv_fail(e, 400, key, "'%s' must be a number", key);
    if (v->valuedouble < lo || v->valuedouble > hi)
        return srv_fail(e, 400, key, "'%s' must be between %g and %g (got %g)", key, lo, hi,
                        v->valuedouble);
    *out = v->valuedouble;
    return true;
}

bool srv_json_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                  bool *present, srv_reqerr *e)
{
    const cJSON *v = field(obj, key, present);
    if (!v)
        return true;
    double d = cJSON_IsNumber(v) ? v->valuedouble : NAN;
    if (!isfinite(d) || d != floor(d))
        return srv_fail(e, 400, key, "'%s' must be an integer", key);
    if (d < (double)lo || d > (double)hi)
        return srv_fail(e, 400, key, "'%s' must be between %lld and %lld (got %.0f)", key,
                        (long long)lo, (long long)hi, d);
    *out = (int64_t)d;
    return true;
}

bool srv_json_bool(const cJSON *obj, const char *key, bool *out, bool *present, srv_reqerr *e)
{
    const cJSON *v = field(obj, key, present);
    if (!v)
        return true;
    if (!cJSON_IsBool(v))
        return srv_fail(e, 400, key, "'%s' must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return true;
}

bool srv_json_string(const cJSON *obj, const char *key, const char **out, bool *present,
                     srv_reqerr *e)
{
    const cJSON *v = field(obj, key, present);
    if (!v)
        return true;
    if (!cJSON_IsString(v) || !v->valuestring)
        return srv_fail(e, 400, key, "'%s' must be a string", key);
    *out = v->valuestring;
    return true;
}

cJSON *srv_json_strn(const char *text, size_t len)
{
    char small[256];
    char *tmp = len < sizeof small ? small : malloc(len + 1);
    if (!tmp)
        return NULL;
    memcpy(tmp, text, len);
    tmp[len] = '\0';
    cJSON *s = cJSON_CreateString(tmp);
    if (tmp != small)
        free(tmp);
    return s;
}

static char *print_and_free(cJSON *o)
{
    char *s = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return s;
}

char *srv_openai_error_body(int status, const char *msg, const char *param)
{
    const char *type = status == 401   ? "authentication_error"
                       : status == 403 ? "permission_error"
                       : status == 404 ? "not_found_error"
                       : status >= 500 ? "server_error"
                                       : "invalid_request_error";
    const char *code = status == 401   ? "invalid_api_key"
                       : status == 413 ? "request_too_large"
                       : status == 404 ? "not_found"
                       : NULL;
    cJSON *root = cJSON_CreateObject();
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", msg);
    cJSON_AddStringToObject(err, "type", type);
    if (param && *param)
        cJSON_AddStringToObject(err, "param", param);
    else
        cJSON_AddNullToObject(err, "param");
    if (code)
        cJSON_AddStringToObject(err, "code", code);
    else
        cJSON_AddNullToObject(err, "code");
    return print_and_free(root);
}

const char *srv_anthropic_error_type(int status)
{
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status >= 500 ? "api_error" : "invalid_request_error";
    }
}

char *srv_anthropic_error_body(int status, const char *msg)
{
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "type", "error");
    cJSON *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "type", srv_anthropic_error_type(status));
    cJSON_AddStringToObject(err, "message", msg);
    return print_and_free(root);
}

void srv_sse_data_json(srv_job *j, const char *event, cJSON *obj)
{
    char *s = obj ? cJSON_PrintUnformatted(obj) : NULL;
    cJSON_Delete(obj);
    if (!s)
        return; /* out of memory: the event is lost, the stream goes on */
    if (event)
        srv_buf_printf(&j->out, "event: %s\n", event);
    srv_buf_puts(&j->out, "data: ");
    srv_buf_puts(&j->out, s);
    srv_buf_puts(&j->out, "\n\n");
    free(s);
}

bool srv_parse_stop(srv_job *j, const cJSON *body, const char *key, bool allow_string,
                    srv_reqerr *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(body, key);
    if (!v || cJSON_IsNull(v))
        return true;
    const cJSON *items[TDM_GEN_STOP_MAX];
    int n = 0;
    if (cJSON_IsString(v) && allow_string) {
        items[n++] = v;
    } else if (cJSON_IsArray(v)) {
        const cJSON *it;
        cJSON_ArrayForEach(it, v) {
            if (n == TDM_GEN_STOP_MAX)
                return srv_fail(e, 400, key, "'%s' holds more than %d strings", key,
                                TDM_GEN_STOP_MAX);
            items[n++] = it;
        }
    } else {
        return srv_fail(e, 400, key, "'%s' must be %s", key,
                        allow_string ? "a string or an array of strings" : "an array of strings");
    }
    for (int i = 0; i < n; i++) {
        if (!cJSON_IsString(items[i]) || !items[i]->valuestring)
            return srv_fail(e, 400, key, "'%s[%d]' must be a string", key, i);
        size_t len = strlen(items[i]->valuestring);
        if (len == 0 || len > TDM_GEN_STOP_LEN_MAX)
            return srv_fail(e, 400, key, "'%s[%d]' must be 1 to %d bytes long", key, i,
                            TDM_GEN_STOP_LEN_MAX);
        j->stop[i] = items[i]->valuestring;
    }
    j->params.stop = j->stop;
    j->params.n_stop = n;
    return true;
}

bool srv_parse_sampling(srv_job *j, const cJSON *body, double max_temperature, srv_reqerr *e)
{
    tdm_gen_params *p = &j->params;
    double t = p->temperature, tp = p->top_p, mp = p->min_p;
    int64_t k = p->top_k, seed = 0;
    bool has_seed = false;
    if (!srv_json_number(body, "temperature", 0, max_temperature, &t, NULL, e) ||
        !srv_json_number(body, "top_p", 0, 1, &tp, NULL, e) ||
        !srv_json_number(body, "min_p", 0, 1, &mp, NULL, e) ||
        !srv_json_int(body, "top_k", 0, 1 << 30, &k, NULL, e) ||
        !srv_json_int(body, "seed", -(int64_t)9007199254740991LL, 9007199254740991LL, &seed,
                      &has_seed, e))
        return false;
    p->temperature = (float)t;
    p->top_p = (float)tp;
    p->min_p = (float)mp;
    p->top_k = (int32_t)k;
    bool ignore = false;
    double fp = 0, pp = 0, rp = 1;
    if (!srv_json_bool(body, "ignore_eos", &ignore, NULL, e) ||
        !srv_json_number(body, "frequency_penalty", -2, 2, &fp, NULL, e) ||
        !srv_json_number(body, "presence_penalty", -2, 2, &pp, NULL, e) ||
        !srv_json_number(body, "repeat_penalty", 0.01, 10, &rp, NULL, e))
        return false;
    p->ignore_eog = ignore;
    p->frequency_penalty = (float)fp;
    p->presence_penalty = (float)pp;
    p->repeat_penalty = (float)rp;
    if (has_seed)
        p->seed = (uint64_t)seed;
    return true;
}

cJSON *srv_tandem_info(const srv_job *j)
{
    const tdm_gen_result *r = &j->res;
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "finish", tdm_gen_finish_name(r->finish));
    cJSON_AddBoolToObject(o, "thinking_forced", r->thinking_forced);
    cJSON_AddBoolToObject(o, "fence_closed", r->fence_closed);
    cJSON_AddNumberToObject(o, "prompt_reused", r->n_reused);
    cJSON_AddNumberToObject(o, "prompt_seconds", r->prompt_seconds);
    cJSON_AddNumberToObject(o, "generation_seconds", r->gen_seconds);
    cJSON_AddNumberToObject(o, "tokens_per_second",
                            r->gen_seconds > 0 ? r->n_generated / r->gen_seconds : 0.0);
    return o;
}
