/* server: lifecycle, the FIFO request queue and the single generation worker.
 * Connection threads (server_http.c) parse a request into a srv_job, queue it
 * and wait on the job's condition variable; the worker runs the generator
 * and feeds the job's output (SSE bytes or accumulated text) back. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "server_internal.h"

void tdm_server_config_default(tdm_server_config *c)
{
    *c = (tdm_server_config){0};
    c->host = "127.0.0.1";
    c->port = 8080;
    c->max_body = 4u << 20;
    c->max_connections = 64;
    c->model_name = "tandem";
    c->default_max_tokens = -1;
    c->max_thinking_tokens = -1;
    c->grace_tokens = TDM_GEN_GRACE_DEFAULT;
}

/* ---- jobs ---- */

srv_job *srv_job_new(srv_api api)
{
    srv_job *j = calloc(1, sizeof *j);
    if (!j)
        return NULL;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca; /* waits use CLOCK_MONOTONIC deadlines */
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    j->refs = 1;
    j->api = api;
    j->ops = api == SRV_ANTHROPIC ? &srv_anthropic_ops
             : api == SRV_OPENAI_COMPLETION ? &srv_openai_completion_ops
                                            : &srv_openai_chat_ops;
    j->block_index = -1;
    atomic_init(&j->cancelled, false);
    tdm_gen_params_default(&j->params);
    j->res.stop_index = -1;
    return j;
}

void srv_job_unref(srv_job *j)
{
    if (!j)
        return;
    pthread_mutex_lock(&j->mu);
    int left = --j->refs;
    pthread_mutex_unlock(&j->mu);
    if (left > 0)
        return;
    cJSON_Delete(j->body);
    free(j->msgs);
    for (int i = 0; i < j->n_owned; i++)
        free(j->owned[i]);
    free(j->owned);
    srv_buf_free(&j->out);
    srv_buf_free(&j->answer);
    srv_buf_free(&j->thinking_text);
    pthread_cond_destroy(&j->cv);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

char *srv_job_strdup(srv_job *j, const char *s, size_t n)
{
    char **owned = realloc(j->owned, (size_t)(j->n_owned + 1) * sizeof *owned);
    if (!owned)
        return NULL;
    j->owned = owned;
    char *c = malloc(n + 1);
    if (!c)
        return NULL;
    memcpy(c, s, n);
    c[n] = '\0';
    j->owned[j->n_owned++] = c;
    return c;
}

void srv_make_id(struct tdm_server *s, const char *prefix, char *out, size_t cap)
{
    uint64_t n = atomic_fetch_add(&s->id_counter, 1);
    /* splitmix64 of counter ^ salt: unique per server, unguessable enough for ids */
    uint64_t z = (n + 1) * 0x9e3779b97f4a7c15ULL ^ s->id_salt;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    z ^= z >> 31;
    snprintf(out, cap, "%s%016llx%04llx", prefix, (unsigned long long)z,
             (unsigned long long)(n & 0xffff));
}

/* ---- queue ---- */

bool srv_enqueue(struct tdm_server *s, srv_job *j)
{
    pthread_mutex_lock(&s->qmu);
    if (s->stopping) {
        pthread_mutex_unlock(&s->qmu);
        return false;
    }
    pthread_mutex_lock(&j->mu);
    j->refs++;
    pthread_mutex_unlock(&j->mu);
    j->next = NULL;
    if (s->qtail)
        s->qtail->next = j;
    else
        s->qhead = j;
    s->qtail = j;
    s->qlen++;
    pthread_cond_signal(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    return true;
}

void srv_queue_stats(struct tdm_server *s, int *depth, int *busy)
{
    pthread_mutex_lock(&s->qmu);
    *depth = s->qlen;
    *busy = s->current != NULL;
    pthread_mutex_unlock(&s->qmu);
}

/* ---- the worker ---- */

static void on_prompt(void *user, int32_t n_prompt, int32_t n_reused)
{
    srv_job *j = user;
    pthread_mutex_lock(&j->mu);
    j->n_prompt = n_prompt;
    j->n_reused = n_reused;
    j->started = true;
    if (j->stream)
        j->ops->stream_begin(j);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void on_text(void *user, tdm_gen_part part, const char *text, size_t len)
{
    srv_job *j = user;
    pthread_mutex_lock(&j->mu);
    if (j->stream)
        j->ops->stream_text(j, part, text, len);
    else
        srv_buf_append(part == TDM_GEN_THINKING ? &j->thinking_text : &j->answer, text, len);
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static bool is_cancelled(void *user)
{
    srv_job *j = user;
    return atomic_load(&j->cancelled);
}

static void finish_job(srv_job *j, int status, const char *msg)
{
    pthread_mutex_lock(&j->mu);
    if (status) {
        j->err_status = status;
        snprintf(j->err_msg, sizeof j->err_msg, "%s", msg);
        if (j->stream && j->started)
            j->ops->stream_error(j, status, msg);
    } else if (j->stream) {
        j->ops->stream_end(j);
    }
    j->done = true;
    pthread_cond_broadcast(&j->cv);
    pthread_mutex_unlock(&j->mu);
}

static void run_job(struct tdm_server *s, srv_job *j)
{
    if (atomic_load(&j->cancelled)) {
        srv_metrics_cancelled(&s->metrics);
        finish_job(j, 499, "the client went away");
        return;
    }
    tdm_gen_callbacks cb = {on_prompt, on_text, is_cancelled, j};
    tdm_error err = {0};
    tdm_status st;
    if (j->api == SRV_OPENAI_COMPLETION)
        st = tdm_generator_complete(s->gen, j->prompt, &j->params, &cb, &j->res, &err);
    else
        st = tdm_generator_chat(s->gen, j->msgs, j->n_msgs, j->thinking, &j->params, &cb, &j->res,
                                &err);
    if (st != TDM_OK) {
        tdm_log(st == TDM_ERR_INVALID ? TDM_LOG_INFO : TDM_LOG_ERROR, "serve: %s: %s", j->id,
                err.msg);
        finish_job(j, st == TDM_ERR_INVALID ? 400 : 500, err.msg);
        return;
    }
    srv_metrics_generation(&s->metrics, &j->res);
    if (j->res.finish == TDM_GEN_FINISH_CANCELLED)
        srv_metrics_cancelled(&s->metrics);
    tdm_log(TDM_LOG_INFO, "serve: %s: %d prompt (%d reused), %d generated, %s, %.1f tok/s", j->id,
            j->res.n_prompt, j->res.n_reused, j->res.n_generated,
            tdm_gen_finish_name(j->res.finish),
            j->res.gen_seconds > 0 ? j->res.n_generated / j->res.gen_seconds : 0.0);
    finish_job(j, 0, NULL);
}

static void *worker_main(void *arg)
{
    struct tdm_server *s = arg;
    pthread_mutex_lock(&s->qmu);
    for (;;) {
        while (!s->qhead && !s->stopping)
            pthread_cond_wait(&s->qcv, &s->qmu);
        if (s->stopping)
            break;
        srv_job *j = s->qhead;
        s->qhead = j->next;
        if (!s->qhead)
            s->qtail = NULL;
        s->qlen--;
        s->current = j;
        pthread_mutex_unlock(&s->qmu);
        run_job(s, j);
        pthread_mutex_lock(&s->qmu);
        s->current = NULL;
        srv_job_unref(j);
    }
    /* shutting down: fail whatever still waits */
    while (s->qhead) {
        srv_job *j = s->qhead;
        s->qhead = j->next;
        s->qlen--;
        finish_job(j, 503, "the server is shutting down");
        srv_job_unref(j);
    }
    s->qtail = NULL;
    pthread_mutex_unlock(&s->qmu);
    return NULL;
}

/* ---- lifecycle ---- */

static char *dup_or_null(const char *s)
{
    return (s && *s) ? strdup(s) : NULL;
}

static uint64_t random_salt(void)
{
    uint64_t v = 0;
    int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        if (read(fd, &v, sizeof v) != (ssize_t)sizeof v)
            v = 0;
        close(fd);
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return v ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^ (uint64_t)getpid();
}

tdm_status tdm_server_start(const tdm_server_config *cfg, tdm_generator *gen, tdm_server **out,
                            tdm_error *err)
{
    *out = NULL;
    if (!cfg || !gen)
        return tdm_error_set(err, TDM_ERR_INVALID, "server: config and generator are required");
    if (cfg->n_allow_hosts < 0 || cfg->n_allow_hosts > TDM_SERVER_MAX_ALLOW_HOSTS)
        return tdm_error_set(err, TDM_ERR_INVALID, "server: at most %d allowed hosts",
                             TDM_SERVER_MAX_ALLOW_HOSTS);
    struct tdm_server *s = calloc(1, sizeof *s);
    if (!s)
        return tdm_error_set(err, TDM_ERR_OOM, "server: out of memory");
    s->host = strdup(cfg->host && *cfg->host ? cfg->host : "127.0.0.1");
    s->api_key = dup_or_null(cfg->api_key);
    s->model_name = strdup(cfg->model_name && *cfg->model_name ? cfg->model_name : "tandem");
    for (int i = 0; i < cfg->n_allow_hosts; i++) {
        if (cfg->allow_hosts[i] && !strcmp(cfg->allow_hosts[i], "*"))
            s->allow_any = true;
        else if (cfg->allow_hosts[i] && *cfg->allow_hosts[i])
            s->allow[s->n_allow++] = strdup(cfg->allow_hosts[i]);
    }
    s->max_body = cfg->max_body ? cfg->max_body : (4u << 20);
    s->max_connections = cfg->max_connections > 0 ? cfg->max_connections : 64;
    s->defaults = (srv_defaults){cfg->default_max_tokens, cfg->max_thinking_tokens,
                                 cfg->grace_tokens, tdm_generator_n_ctx(gen)};
    s->gen = gen;
    s->id_salt = random_salt();
    atomic_init(&s->id_counter, 0);
    pthread_mutex_init(&s->qmu, NULL);
    pthread_cond_init(&s->qcv, NULL);
    srv_metrics_init(&s->metrics);
    if (!s->host || !s->model_name) {
        tdm_server_stop(s);
        return tdm_error_set(err, TDM_ERR_OOM, "server: out of memory");
    }
    if (pthread_create(&s->worker, NULL, worker_main, s) != 0) {
        tdm_server_stop(s);
        return tdm_error_set(err, TDM_ERR_OOM, "server: cannot start the worker thread");
    }
    s->worker_running = true;
    tdm_status st = srv_http_start(s, cfg->port, err);
    if (st != TDM_OK) {
        tdm_server_stop(s);
        return st;
    }
    *out = s;
    return TDM_OK;
}

uint16_t tdm_server_port(const tdm_server *s)
{
    return s->port;
}

void tdm_server_set_cache_hit_rate(tdm_server *s, double rate)
{
    srv_metrics_set_hit_rate(&s->metrics, rate);
}

void tdm_server_stop(tdm_server *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->qmu);
    s->stopping = true;
    if (s->current)
        atomic_store(&s->current->cancelled, true);
    pthread_cond_broadcast(&s->qcv);
    pthread_mutex_unlock(&s->qmu);
    if (s->worker_running)
        pthread_join(s->worker, NULL);
    /* every job is done now, so no connection thread waits forever */
    srv_http_stop(s);
    srv_metrics_destroy(&s->metrics);
    pthread_cond_destroy(&s->qcv);
    pthread_mutex_destroy(&s->qmu);
    free(s->host);
    free(s->api_key);
    free(s->model_name);
    for (int i = 0; i < s->n_allow; i++)
        free(s->allow[i]);
    free(s);
}
