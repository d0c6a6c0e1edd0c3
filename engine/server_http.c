/* server_http: the libmicrohttpd transport. One thread per connection: the
 * access handler collects the body, checks Host/Origin, the API key and the
 * size limit, routes, and for generation requests queues a job and waits on
 * it (polling the socket so that a client who leaves cancels its job); a
 * stream is an MHD callback response that drains the job's SSE bytes. */
#include <arpa/inet.h>
#include <ctype.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>

#include <microhttpd.h>

#include "server_internal.h"

/* Bodies between max_body and this are read and dropped so that the client
 * sees a clean 413; beyond it the connection is answered at once and closed. */
#define DRAIN_LIMIT (64u << 20)
#define WAIT_SLICE_MS 100
#define KEEPALIVE_SECONDS 15

enum route {
    R_NONE = 0, R_ASSET, R_HEALTH, R_METRICS, R_MODELS, R_MODEL, R_COUNT, R_CHAT, R_COMPLETIONS,
    R_MESSAGES
};

typedef struct http_req {
    enum route route;
    const tdm_web_asset *asset;
    bool anthropic;        /* errors in the Anthropic shape */
    int reject;            /* HTTP status decided before the body was read, 0 if none */
    bool responded;        /* answered before the body (then only drain and close) */
    const char *allow;     /* methods of the route (the Allow header of a 405) */
    char reject_msg[200];
    srv_buf body;
    size_t seen;           /* body bytes received (kept or dropped) */
} http_req;

/* ---- responses ---- */

static enum MHD_Result queue(struct tdm_server *s, struct MHD_Connection *c, int status,
                             struct MHD_Response *r)
{
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    srv_metrics_status(&s->metrics, status);
    return ret;
}

/* A response of body (malloc'd; owned by the response, freed on failure)
 * with its type and no caching; NULL when body is NULL or on failure. */
static struct MHD_Response *body_response(char *body, const char *type)
{
    if (!body)
        return NULL;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(body);
        return NULL;
    }
    MHD_add_response_header(r, "Content-Type", type);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    return r;
}

/* Takes ownership of body (malloc'd). */
static enum MHD_Result send_body(struct tdm_server *s, struct MHD_Connection *c, int status,
                                 const char *type, char *body)
{
    struct MHD_Response *r = body_response(body, type);
    return r ? queue(s, c, status, r) : MHD_NO;
}

static enum MHD_Result send_json(struct tdm_server *s, struct MHD_Connection *c, int status,
                                 cJSON *o)
{
    char *body = o ? cJSON_PrintUnformatted(o) : NULL;
    cJSON_Delete(o);
    return send_body(s, c, status, "application/json", body);
}

static enum MHD_Result send_error(struct tdm_server *s, struct MHD_Connection *c,
                                  const http_req *q, int status, const char *param,
                                  const char *msg)
{
    char *body = q->anthropic ? srv_anthropic_error_body(status, msg)
                              : srv_openai_error_body(status, msg, param);
    struct MHD_Response *r = body_response(body, "application/json");
    if (!r)
        return MHD_NO;
    if (status == 405 && q->allow)
        MHD_add_response_header(r, "Allow", q->allow);
    return queue(s, c, status, r);
}

/* ---- checks ---- */

static bool is_ip_literal(const char *h)
{
    struct in_addr a4;
    struct in6_addr a6;
    if (h[0] == '[') {
        char tmp[64];
        size_t n = strlen(h);
        if (n < 3 || n - 2 >= sizeof tmp || h[n - 1] != ']')
            return false;
        memcpy(tmp, h + 1, n - 2);
        tmp[n - 2] = '\0';
        return inet_pton(AF_INET6, tmp, &a6) == 1;
    }
    return inet_pton(AF_INET, h, &a4) == 1;
}

/* Host names safe from DNS rebinding: loopback names, IP literals (a
 * rebinding attack needs a DNS name), the bound host and --allow-host ones. */
static bool name_allowed(const struct tdm_server *s, const char *hostport, size_t n)
{
    char h[256];
    size_t len = 0;
    if (n && hostport[0] == '[') {
        const char *end = memchr(hostport, ']', n);
        if (!end)
            return false;
        len = (size_t)(end - hostport) + 1;
    } else {
        const char *colon = memchr(hostport, ':', n);
        len = colon ? (size_t)(colon - hostport) : n;
    }
    if (len == 0 || len >= sizeof h)
        return false;
    for (size_t i = 0; i < len; i++)
        h[i] = (char)tolower((unsigned char)hostport[i]);
    h[len] = '\0';
    if (len > 1 && h[len - 1] == '.' && h[0] != '[')
        h[--len] = '\0'; /* "localhost." is "localhost" */
    if (s->allow_any || !strcmp(h, "localhost") || is_ip_literal(h) || !strcasecmp(h, s->host))
        return true;
    for (int i = 0; i < s->n_allow; i++)
        if (!strcasecmp(h, s->allow[i]))
            return true;
    return false;
}

static const char *check_host_origin(const struct tdm_server *s, struct MHD_Connection *c)
{
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (host && !name_allowed(s, host, strlen(host)))
        return "Host header not allowed (use --allow-host to accept it)";
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin) {
        const char *p = strstr(origin, "://");
        if (!p)
            return "Origin not allowed";
        p += 3;
        size_t n = strcspn(p, "/");
        if (!name_allowed(s, p, n))
            return "Origin not allowed (use --allow-host to accept it)";
    }
    return NULL;
}

static bool equal_ct(const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    unsigned char d = (unsigned char)(na != nb);
    for (size_t i = 0; i < na; i++)
        d |= (unsigned char)(a[i] ^ b[i % (nb ? nb : 1)]);
    return d == 0;
}

static bool authorized(const struct tdm_server *s, struct MHD_Connection *c)
{
    if (!s->api_key)
        return true;
    const char *k = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
    if (k && equal_ct(k, s->api_key))
        return true;
    const char *a = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (a && !strncasecmp(a, "Bearer ", 7)) {
        a += 7;
        while (*a == ' ')
            a++;
        return equal_ct(a, s->api_key);
    }
    return false;
}

/* ---- routing ---- */

static bool route_of(const char *url, const char *method, http_req *q, const char **allow)
{
    bool get = !strcmp(method, "GET") || !strcmp(method, "HEAD");
    bool post = !strcmp(method, "POST");
    static const struct { const char *path; enum route r; bool post; } table[] = {
        {"/health", R_HEALTH, false},          {"/metrics", R_METRICS, false},
        {"/v1/models", R_MODELS, false},       {"/v1/chat/completions", R_CHAT, true},
        {"/v1/completions", R_COMPLETIONS, true}, {"/v1/messages", R_MESSAGES, true},
        {"/v1/messages/count_tokens", R_COUNT, true},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        if (strcmp(url, table[i].path))
            continue;
        *allow = table[i].post ? "POST" : "GET, HEAD";
        q->route = table[i].r;
        return table[i].post ? post : get;
    }
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *allow = "GET, HEAD";
        q->route = R_MODEL;
        return get;
    }
    const char *path = !strcmp(url, "/") ? "/index.html" : url;
    for (const tdm_web_asset *a = tdm_web_assets; a->path; a++) {
        if (!strcmp(path, a->path)) {
            *allow = "GET, HEAD";
            q->route = R_ASSET;
            q->asset = a;
            return get;
        }
    }
    q->route = R_NONE;
    return false;
}

/* ---- waiting on a job ---- */

static bool peer_gone(int fd)
{
    if (fd < 0)
        return false;
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL));
}

static void deadline_in(struct timespec *ts, int ms)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_nsec += (long)ms * 1000000L;
    ts->tv_sec += ts->tv_nsec / 1000000000L;
    ts->tv_nsec %= 1000000000L;
}

/* Waits (j->mu held) until pred or the peer leaves; false when it left. */
static bool wait_while(srv_job *j, int fd, bool until_started)
{
    while (!j->done && !(until_started && j->started)) {
        struct timespec ts;
        deadline_in(&ts, WAIT_SLICE_MS);
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (!j->done && peer_gone(fd)) {
            atomic_store(&j->cancelled, true);
            return false;
        }
    }
    return true;
}

typedef struct stream_ctx {
    struct tdm_server *s;
    srv_job *j;
    int fd;
} stream_ctx;

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    stream_ctx *x = cls;
    srv_job *j = x->j;
    pthread_mutex_lock(&j->mu);
    time_t idle_since = time(NULL);
    while (j->out_sent == j->out.len && !j->done) {
        struct timespec ts;
        deadline_in(&ts, WAIT_SLICE_MS);
        pthread_cond_timedwait(&j->cv, &j->mu, &ts);
        if (j->out_sent == j->out.len && !j->done) {
            if (peer_gone(x->fd)) {
                atomic_store(&j->cancelled, true);
                pthread_mutex_unlock(&j->mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
            if (time(NULL) - idle_since >= KEEPALIVE_SECONDS) {
                srv_buf_puts(&j->out, ": keep-alive\n\n"); /* an SSE comment */
                idle_since = time(NULL);
            }
        }
    }
    size_t n = j->out.len - j->out_sent;
    if (n == 0) {
        pthread_mutex_unlock(&j->mu);
        return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (n > max)
        n = max;
    memcpy(buf, j->out.p + j->out_sent, n);
    j->out_sent += n;
    if (j->out_sent == j->out.len)
        j->out.len = j->out_sent = 0; /* everything handed over: reuse the buffer */
    pthread_mutex_unlock(&j->mu);
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    stream_ctx *x = cls;
    srv_job *j = x->j;
    pthread_mutex_lock(&j->mu);
    bool unfinished = !j->done;
    pthread_mutex_unlock(&j->mu);
    if (unfinished) /* MHD dropped the connection (send failed / shutdown) */
        atomic_store(&j->cancelled, true);
    srv_job_unref(j);
    free(x);
}

static int connection_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

/* ---- generation requests ---- */

/* Parses the body as JSON; on failure answers 400 and returns NULL. */
static cJSON *parse_body(struct tdm_server *s, struct MHD_Connection *c, const http_req *q,
                         enum MHD_Result *ret)
{
    const char *end = NULL;
    cJSON *body = q->body.len ? cJSON_ParseWithLengthOpts(q->body.p, q->body.len, &end, 0) : NULL;
    if (body && end) { /* only blanks may follow the value */
        const char *p = end, *stop = q->body.p + q->body.len;
        while (p < stop && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n'))
            p++;
        if (p < stop) {
            cJSON_Delete(body);
            body = NULL;
            end = p;
        }
    }
    if (!body) {
        char msg[160];
        if (!q->body.len)
            snprintf(msg, sizeof msg, "the request body is empty (a JSON object is expected)");
        else
            snprintf(msg, sizeof msg, "malformed JSON in the request body near byte %zu",
                     end && end >= q->body.p ? (size_t)(end - q->body.p) : (size_t)0);
        *ret = send_error(s, c, q, 400, NULL, msg);
    }
    return body;
}

/* POST /v1/messages/count_tokens: answered on the connection thread (the
 * tokenizer and template are immutable), never queued. */
static enum MHD_Result serve_count(struct tdm_server *s, struct MHD_Connection *c, http_req *q)
{
    enum MHD_Result ret = MHD_NO;
    cJSON *body = parse_body(s, c, q, &ret);
    if (!body)
        return ret;
    srv_job *j = srv_job_new(SRV_ANTHROPIC);
    if (!j) {
        cJSON_Delete(body);
        return send_error(s, c, q, 500, NULL, "out of memory");
    }
    if (cJSON_IsObject(body) && !cJSON_GetObjectItemCaseSensitive(body, "max_tokens"))
        cJSON_AddNumberToObject(body, "max_tokens", INT32_MAX); /* not part of this request */
    srv_reqerr e = {0};
    bool ok = srv_anthropic_parse(j, body, &s->defaults, &e);
    j->body = body;
    int32_t n = 0;
    tdm_error err = {0};
    tdm_status st = ok ? tdm_generator_count_chat(s->gen, j->msgs, j->n_msgs, j->thinking, &n, &err)
                       : TDM_OK;
    srv_job_unref(j);
    if (!ok)
        return send_error(s, c, q, e.status, e.param, e.msg);
    if (st != TDM_OK)
        return send_error(s, c, q, st == TDM_ERR_INVALID ? 400 : 500, NULL, err.msg);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", n);
    return send_json(s, c, 200, o);
}

static enum MHD_Result serve_generation(struct tdm_server *s, struct MHD_Connection *c,
                                        http_req *q)
{
    enum MHD_Result ret = MHD_NO;
    cJSON *body = parse_body(s, c, q, &ret);
    if (!body)
        return ret;
    srv_api api = q->route == R_CHAT ? SRV_OPENAI_CHAT
                  : q->route == R_COMPLETIONS ? SRV_OPENAI_COMPLETION : SRV_ANTHROPIC;
    srv_job *j = srv_job_new(api);
    if (!j) {
        cJSON_Delete(body);
        return send_error(s, c, q, 500, NULL, "out of memory");
    }
    srv_make_id(s, api == SRV_ANTHROPIC ? "msg_" : api == SRV_OPENAI_CHAT ? "chatcmpl-" : "cmpl-",
                j->id, sizeof j->id);
    j->created = (long long)time(NULL);
    j->model = s->model_name;
    j->params.seed = (uint64_t)atomic_fetch_add(&s->id_counter, 1) * 0x9e3779b97f4a7c15ULL ^ s->id_salt;
    srv_reqerr e = {0};
    bool ok = api == SRV_OPENAI_CHAT ? srv_openai_parse_chat(j, body, &s->defaults, &e)
              : api == SRV_OPENAI_COMPLETION ? srv_openai_parse_completion(j, body, &s->defaults, &e)
                                             : srv_anthropic_parse(j, body, &s->defaults, &e);
    j->body = body; /* the parsed strings live as long as the job */
    if (!ok) {
        srv_job_unref(j);
        return send_error(s, c, q, e.status, e.param, e.msg);
    }
    if (!srv_enqueue(s, j)) {
        srv_job_unref(j);
        return send_error(s, c, q, 503, NULL, "the server is shutting down");
    }
    int fd = connection_fd(c);
    pthread_mutex_lock(&j->mu);
    bool here = wait_while(j, fd, j->stream);
    int st = j->err_status;
    bool started = j->started;
    char msg[TDM_ERROR_MSG_MAX];
    snprintf(msg, sizeof msg, "%s", j->err_msg);
    pthread_mutex_unlock(&j->mu);
    if (!here) {
        srv_job_unref(j);
        return MHD_NO; /* the client left: close */
    }
    if (st && !(j->stream && started)) {
        srv_job_unref(j);
        return send_error(s, c, q, st, NULL, msg);
    }
    if (!j->stream) {
        char *out = j->ops->response(j);
        srv_job_unref(j);
        if (!out)
            return send_error(s, c, q, 500, NULL, "out of memory");
        return send_body(s, c, 200, "application/json", out);
    }
    stream_ctx *x = malloc(sizeof *x);
    if (!x) {
        atomic_store(&j->cancelled, true);
        srv_job_unref(j);
        return MHD_NO;
    }
    *x = (stream_ctx){s, j, fd};
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, x, stream_free);
    if (!r) {
        stream_free(x);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    return queue(s, c, 200, r);
}

/* ---- plain GET routes ---- */

static cJSON *model_object(const struct tdm_server *s, bool anthropic)
{
    cJSON *m = cJSON_CreateObject();
    if (anthropic) {
        cJSON_AddStringToObject(m, "type", "model");
        cJSON_AddStringToObject(m, "id", s->model_name);
        cJSON_AddStringToObject(m, "display_name", s->model_name);
        cJSON_AddStringToObject(m, "created_at", "2025-01-01T00:00:00Z");
    } else {
        cJSON_AddStringToObject(m, "id", s->model_name);
        cJSON_AddStringToObject(m, "object", "model");
        cJSON_AddNumberToObject(m, "created", 1735689600);
        cJSON_AddStringToObject(m, "owned_by", "tandem");
        cJSON_AddNumberToObject(m, "context_length", s->defaults.n_ctx);
    }
    return m;
}

static enum MHD_Result serve_get(struct tdm_server *s, struct MHD_Connection *c, http_req *q,
                                 const char *url)
{
    switch (q->route) {
    case R_ASSET: {
        struct MHD_Response *r = MHD_create_response_from_buffer(
            q->asset->size, (void *)q->asset->data, MHD_RESPMEM_PERSISTENT);
        if (!r)
            return MHD_NO;
        MHD_add_response_header(r, "Content-Type", q->asset->content_type);
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'");
        return queue(s, c, 200, r);
    }
    case R_HEALTH: {
        int depth, busy;
        srv_queue_stats(s, &depth, &busy);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "status", "ok");
        cJSON_AddStringToObject(o, "model", s->model_name);
        cJSON_AddNumberToObject(o, "queue_depth", depth);
        cJSON_AddBoolToObject(o, "busy", busy);
        return send_json(s, c, 200, o);
    }
    case R_METRICS: {
        int depth, busy;
        srv_queue_stats(s, &depth, &busy);
        srv_buf b = {0};
        if (!srv_metrics_render(&s->metrics, depth, busy, &b)) {
            srv_buf_free(&b);
            return send_error(s, c, q, 500, NULL, "out of memory");
        }
        return send_body(s, c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p);
    }
    case R_MODELS: {
        cJSON *o = cJSON_CreateObject();
        cJSON *data = cJSON_CreateArray();
        cJSON_AddItemToArray(data, model_object(s, q->anthropic));
        if (q->anthropic) {
            cJSON_AddItemToObject(o, "data", data);
            cJSON_AddBoolToObject(o, "has_more", 0);
            cJSON_AddStringToObject(o, "first_id", s->model_name);
            cJSON_AddStringToObject(o, "last_id", s->model_name);
        } else {
            cJSON_AddStringToObject(o, "object", "list");
            cJSON_AddItemToObject(o, "data", data);
        }
        return send_json(s, c, 200, o);
    }
    case R_MODEL:
        if (strcmp(url + 11, s->model_name)) {
            char msg[256];
            snprintf(msg, sizeof msg, "model '%.120s' does not exist (this server has '%.40s')",
                     url + 11, s->model_name);
            return send_error(s, c, q, 404, "model", msg);
        }
        return send_json(s, c, 200, model_object(s, q->anthropic));
    default:
        return send_error(s, c, q, 404, NULL, "not found");
    }
}

/* ---- the access handler ---- */

static void first_call(struct tdm_server *s, struct MHD_Connection *c, const char *url,
                       const char *method, http_req *q)
{
    q->anthropic = !strncmp(url, "/v1/messages", 12) ||
                   (!strncmp(url, "/v1/models", 10) &&
                    MHD_lookup_connection_value(c, MHD_HEADER_KIND, "anthropic-version"));
    const char *allow = NULL;
    bool ok = route_of(url, method, q, &allow);
    q->allow = allow;
    const char *why = check_host_origin(s, c);
    if (why) {
        q->reject = 403;
        snprintf(q->reject_msg, sizeof q->reject_msg, "%s", why);
    } else if (q->route == R_NONE) {
        q->reject = 404;
        snprintf(q->reject_msg, sizeof q->reject_msg, "no route for %.80s %.80s", method, url);
    } else if (!ok) {
        q->reject = 405;
        snprintf(q->reject_msg, sizeof q->reject_msg, "method %.40s not allowed on %.80s (allowed: %s)",
                 method, url, allow);
    } else if ((q->route == R_METRICS || q->route >= R_MODELS) && !authorized(s, c)) {
        q->reject = 401;
        snprintf(q->reject_msg, sizeof q->reject_msg,
                 "invalid or missing API key (send 'Authorization: Bearer KEY' or 'x-api-key: KEY')");
    } else {
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        unsigned long long len = cl ? strtoull(cl, NULL, 10) : 0;
        if (len > s->max_body) {
            q->reject = 413;
            snprintf(q->reject_msg, sizeof q->reject_msg,
                     "request body of %llu bytes exceeds the limit of %zu bytes", len, s->max_body);
        }
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version,
                                  const char *upload_data, size_t *upload_size, void **con_cls)
{
    struct tdm_server *s = cls;
    http_req *q = *con_cls;
    if (!q) {
        q = calloc(1, sizeof *q);
        if (!q)
            return MHD_NO;
        *con_cls = q;
        first_call(s, c, url, method, q);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        const char *expect = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_EXPECT);
        /* answer before the body when the client waits for "100 Continue" or
         * announces more than we would drain */
        if (q->reject && (expect || (cl && strtoull(cl, NULL, 10) > DRAIN_LIMIT))) {
            q->responded = true;
            return send_error(s, c, q, q->reject, NULL, q->reject_msg);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        size_t n = *upload_size;
        *upload_size = 0;
        q->seen += n;
        if (q->reject || q->route < R_COUNT) {
            if (q->seen > DRAIN_LIMIT)
                return MHD_NO;
            return MHD_YES; /* dropped */
        }
        if (q->seen > s->max_body) {
            q->reject = 413;
            snprintf(q->reject_msg, sizeof q->reject_msg,
                     "request body exceeds the limit of %zu bytes", s->max_body);
            srv_buf_free(&q->body);
            return MHD_YES;
        }
        return srv_buf_append(&q->body, upload_data, n) ? MHD_YES : MHD_NO;
    }
    if (q->responded)
        return MHD_YES;
    if (q->reject)
        return send_error(s, c, q, q->reject, NULL, q->reject_msg);
    if (q->route == R_COUNT)
        return serve_count(s, c, q);
    if (q->route >= R_CHAT)
        return serve_generation(s, c, q);
    return serve_get(s, c, q, url);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    http_req *q = *con_cls;
    if (!q)
        return;
    srv_buf_free(&q->body);
    free(q);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
        msg[--n] = '\0';
    tdm_log(TDM_LOG_DEBUG, "serve: http: %s", msg);
}

tdm_status srv_http_start(struct tdm_server *s, uint16_t port, tdm_error *err)
{
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *ai = NULL;
    const char *h = s->host;
    char bare[128];
    size_t hl = strlen(h);
    if (h[0] == '[' && hl > 2 && hl - 2 < sizeof bare && h[hl - 1] == ']') {
        memcpy(bare, h + 1, hl - 2);
        bare[hl - 2] = '\0';
        h = bare;
    }
    int rc = getaddrinfo(h, NULL, &hints, &ai);
    if (rc != 0 || !ai)
        return tdm_error_set(err, TDM_ERR_INVALID, "cannot resolve --host '%s': %s", s->host,
                             gai_strerror(rc));
    struct sockaddr_storage addr;
    memset(&addr, 0, sizeof addr);
    memcpy(&addr, ai->ai_addr, ai->ai_addrlen);
    bool v6 = ai->ai_family == AF_INET6;
    freeaddrinfo(ai);
    if (v6)
        ((struct sockaddr_in6 *)&addr)->sin6_port = htons(port);
    else
        ((struct sockaddr_in *)&addr)->sin_port = htons(port);
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL_INTERNAL_THREAD | MHD_USE_ERROR_LOG;
    if (v6)
        flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(
        flags, port, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->max_connections,
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)600, MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
        MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_CONNECTION_MEMORY_LIMIT,
        (size_t)(128 * 1024), MHD_OPTION_END);
    if (!s->daemon)
        return tdm_error_set(err, TDM_ERR_IO, "cannot listen on %s port %u (in use?)",
                             s->host, (unsigned)port);
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->daemon, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di && di->port ? di->port : port;
    return TDM_OK;
}

void srv_http_stop(struct tdm_server *s)
{
    if (s->daemon)
        MHD_stop_daemon(s->daemon);
    s->daemon = NULL;
}
