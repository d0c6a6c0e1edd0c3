/* server: `tandem serve`, an HTTP server (libmicrohttpd) speaking the OpenAI
 * (/v1/chat/completions, /v1/completions, /v1/models) and Anthropic
 * (/v1/messages) APIs, with SSE streaming, a web chat page at /, /health and
 * Prometheus /metrics.
 *
 * Threads: libmicrohttpd runs one thread per connection (parsing, waiting,
 * streaming); ONE worker thread owns the generator and serves the queued
 * requests in FIFO order, so requests never refuse for being busy. A client
 * that goes away (also while queued) cancels its request.
 *
 * Security: binds 127.0.0.1 by default; with an API key every /v1 and
 * /metrics request needs `Authorization: Bearer K` or `x-api-key: K`; Host
 * and Origin must name localhost / 127.0.0.1 / [::1], the bound host or an
 * allowed host (DNS-rebinding guard), else 403; bodies over max_body are 413.
 *
 * Ownership: the server borrows the generator (which must outlive it) and
 * uses it only from its worker thread. The config's strings are copied.
 */
#ifndef TDM_SERVER_H
#define TDM_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "generate.h"
#include "status.h"

#define TDM_SERVER_MAX_ALLOW_HOSTS 16

typedef struct tdm_server_config {
    const char *host;        /* address to bind; default "127.0.0.1" */
    uint16_t port;           /* 0: any free port (see tdm_server_port) */
    const char *api_key;     /* NULL or "": no authentication */
    const char *allow_hosts[TDM_SERVER_MAX_ALLOW_HOSTS]; /* extra Host/Origin names; "*" = any */
    int n_allow_hosts;
    size_t max_body;         /* request body limit in bytes; default 4 MiB */
    int max_connections;     /* simultaneous connections; default 64 */
    const char *model_name;  /* id reported by /v1/models and in responses */
    int32_t default_max_tokens;   /* when a chat request gives none; <= 0: until EOG/context */
    int32_t max_thinking_tokens;  /* default thinking budget; < 0: none */
    int32_t grace_tokens;         /* default TDM_GEN_GRACE_DEFAULT */
} tdm_server_config;

void tdm_server_config_default(tdm_server_config *c);

typedef struct tdm_server tdm_server;

/* Binds and starts serving (the call returns at once). */
tdm_status tdm_server_start(const tdm_server_config *cfg, tdm_generator *gen, tdm_server **out,
                            tdm_error *err);
/* The port actually bound. */
uint16_t tdm_server_port(const tdm_server *s);
/* Expert-cache hit rate in [0,1] reported by /metrics (0 until set; the
 * hybrid executor feeds it). Thread-safe. */
void tdm_server_set_cache_hit_rate(tdm_server *s, double rate);
/* Cancels running and queued requests, closes every connection, frees. */
void tdm_server_stop(tdm_server *s);

#endif
