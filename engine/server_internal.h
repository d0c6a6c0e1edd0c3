/* server_internal: what the server's translation units share (not a public
 * header: only engine/server*.c include it).
 *   server.c            lifecycle, the request queue and the generation worker
 *   server_http.c       libmicrohttpd transport: routing, auth, Host/Origin, limits, SSE
 *   server_openai.c     OpenAI request parsing and response / chunk shapes
 *   server_anthropic.c  Anthropic request parsing and response / event shapes
 *   server_metrics.c    counters and the Prometheus text
 *   server_util.c       growable buffers, JSON field validation, error bodies
 */
#ifndef TDM_SERVER_INTERNAL_H
#define TDM_SERVER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "generate.h"
#include "server.h"

/* ---- growable byte buffer (per request; freed with it) ---- */
typedef struct srv_buf {
    char *p;    /* [cap], NUL-terminated when len < cap */
    size_t len;
    size_t cap;
} srv_buf;

bool srv_buf_append(srv_buf *b, const void *data, size_t n);
bool srv_buf_puts(srv_buf *b, const char *s);
bool srv_buf_printf(srv_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void srv_buf_free(srv_buf *b);

/* ---- request errors: status + message + offending parameter ---- */
typedef struct srv_reqerr {
    int status;        /* HTTP status */
    char msg[400];
    char param[64];    /* "" when none */
} srv_reqerr;

bool srv_fail(srv_reqerr *e, int status, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Field readers: a missing field or JSON null leaves *out unchanged and
 * returns true with *present false (present may be NULL); a wrong type or a
 * value out of [lo, hi] fills e and returns false. */
bool srv_json_number(const cJSON *obj, const char *key, double lo, double hi, double *out,
                     bool *present, srv_reqerr *e);
bool srv_json_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                  bool *present, srv_reqerr *e);
bool srv_json_bool(const cJSON *obj, const char *key, bool *out, bool *present, srv_reqerr *e);
bool srv_json_string(const cJSON *obj, const char *key, const char **out, bool *present,
                     srv_reqerr *e);

/* A JSON string of text[0..len) (NULL on OOM). */
cJSON *srv_json_strn(const char *text, size_t len);

/* Error bodies in each API's shape (malloc'd, caller frees). */
char *srv_openai_error_body(int status, const char *msg, const char *param);
char *srv_anthropic_error_body(int status, const char *msg);
const char *srv_anthropic_error_type(int status);

/* ---- one request, shared by its connection thread and the worker ---- */
typedef enum srv_api { SRV_OPENAI_CHAT = 0, SRV_OPENAI_COMPLETION, SRV_ANTHROPIC } srv_api;

typedef struct srv_job srv_job;

/* How an API shapes a request's output. Stream functions run on the worker
 * with job->mu held and append SSE bytes to job->out. */
typedef struct srv_api_ops {
    void (*stream_begin)(srv_job *j);
    void (*stream_text)(srv_job *j, tdm_gen_part part, const char *text, size_t len);
    void (*stream_end)(srv_job *j);
    void (*stream_error)(srv_job *j, int status, const char *msg);
    char *(*response)(srv_job *j); /* non-streaming body, malloc'd (NULL on OOM) */
} srv_api_ops;

extern const srv_api_ops srv_openai_chat_ops;
extern const srv_api_ops srv_openai_completion_ops;
extern const srv_api_ops srv_anthropic_ops;

struct srv_job {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                  /* connection + queue/worker; under mu */
    srv_job *next;             /* FIFO link, under the server's qmu */

    srv_api api;
    const srv_api_ops *ops;
    bool stream;
    bool include_usage;        /* OpenAI stream_options.include_usage */

    /* the request: pointers into body or owned[] */
    cJSON *body;
    tdm_gen_message *msgs;     /* [n_msgs] */
    int32_t n_msgs;
    const char *prompt;        /* completions */
    char **owned;              /* [n_owned] strings built while parsing */
    int n_owned;
    tdm_gen_thinking thinking;
    tdm_gen_params params;
    const char *stop[TDM_GEN_STOP_MAX];
    char id[64];
    long long created;         /* unix seconds */
    const char *model;         /* the server's model name */

    /* progress, under mu */
    atomic_bool cancelled;     /* the client left (read lock-free by the worker) */
    bool started;              /* the prompt fits: a stream may begin */
    bool done;
    srv_buf out;               /* streaming: SSE bytes not yet handed to MHD */
    size_t out_sent;
    srv_buf answer, thinking_text; /* non-streaming */
    int block_index;           /* Anthropic stream: open block (-1 none) */
    int block_part;            /* its part */
    int n_blocks;
    int32_t n_prompt;          /* known at on_prompt */
    int32_t n_reused;
    tdm_gen_result res;
    int err_status;            /* 0 ok, else HTTP status of the failure */
    char err_msg[TDM_ERROR_MSG_MAX];
};

srv_job *srv_job_new(srv_api api);
void srv_job_unref(srv_job *j);
/* Copies s into a string the job owns; NULL on OOM. */
char *srv_job_strdup(srv_job *j, const char *s, size_t n);

/* Request parsers: fill j from body (which j takes over only on success). */
typedef struct srv_defaults {
    int32_t max_tokens;
    int32_t max_thinking_tokens;
    int32_t grace_tokens;
    int32_t n_ctx;
} srv_defaults;

bool srv_openai_parse_chat(srv_job *j, cJSON *body, const srv_defaults *d, srv_reqerr *e);
bool srv_openai_parse_completion(srv_job *j, cJSON *body, const srv_defaults *d, srv_reqerr *e);
bool srv_anthropic_parse(srv_job *j, cJSON *body, const srv_defaults *d, srv_reqerr *e);
/* Shared by both parsers: "stop"-like field (string or array of strings). */
bool srv_parse_stop(srv_job *j, const cJSON *body, const char *key, bool allow_string,
                    srv_reqerr *e);
/* Shared sampling fields: temperature, top_p, top_k, min_p, seed, the
 * penalties and ignore_eos (an extension: never end at an EOG token). */
bool srv_parse_sampling(srv_job *j, const cJSON *body, double max_temperature, srv_reqerr *e);

/* The "tandem" extension object of a finished response: thinking_forced,
 * fence_closed, prompt_reused, finish, tokens_per_second. */
cJSON *srv_tandem_info(const srv_job *j);

/* SSE helpers (append to j->out). */
void srv_sse_data_json(srv_job *j, const char *event, cJSON *obj); /* frees obj */

/* ---- metrics ---- */
#define SRV_N_STATUS 12
typedef struct srv_metrics {
    pthread_mutex_t mu;
    uint64_t prompt_tokens, reused_tokens, generated_tokens, thinking_tokens;
    uint64_t requests_done, requests_cancelled;
    uint64_t by_status[SRV_N_STATUS];
    double gen_seconds, prompt_seconds;
    double last_gen_tps, last_prompt_tps;
    double cache_hit_rate;
} srv_metrics;

void srv_metrics_init(srv_metrics *m);
void srv_metrics_destroy(srv_metrics *m);
void srv_metrics_status(srv_metrics *m, int http_status);
void srv_metrics_generation(srv_metrics *m, const tdm_gen_result *r);
void srv_metrics_cancelled(srv_metrics *m);
void srv_metrics_set_hit_rate(srv_metrics *m, double rate);
/* Prometheus text exposition into b. */
bool srv_metrics_render(srv_metrics *m, int queue_depth, int busy, srv_buf *b);

/* ---- the server ---- */
struct MHD_Daemon;

struct tdm_server {
    char *host, *api_key, *model_name;
    char *allow[TDM_SERVER_MAX_ALLOW_HOSTS];
    int n_allow;
    bool allow_any;
    size_t max_body;
    int max_connections;
    srv_defaults defaults;

    struct MHD_Daemon *daemon;
    uint16_t port;
    tdm_generator *gen;

    pthread_t worker;
    bool worker_running;
    pthread_mutex_t qmu;
    pthread_cond_t qcv;
    srv_job *qhead, *qtail;    /* waiting jobs */
    int qlen;
    srv_job *current;          /* running job or NULL */
    bool stopping;

    srv_metrics metrics;
    atomic_uint_fast64_t id_counter;
    uint64_t id_salt;
};

/* Queues j (takes one reference). false when the server is stopping. */
bool srv_enqueue(struct tdm_server *s, srv_job *j);
void srv_queue_stats(struct tdm_server *s, int *depth, int *busy);
void srv_make_id(struct tdm_server *s, const char *prefix, char *out, size_t cap);

/* HTTP transport. */
tdm_status srv_http_start(struct tdm_server *s, uint16_t port, tdm_error *err);
void srv_http_stop(struct tdm_server *s);

/* ---- the web page, embedded by tools/embed_web.sh into the build dir ---- */
typedef struct tdm_web_asset {
    const char *path;          /* "/index.html" */
    const char *content_type;
    const unsigned char *data; /* [size] */
    size_t size;
} tdm_web_asset;

extern const tdm_web_asset tdm_web_assets[]; /* terminated by a NULL path */

#endif
