/* server_metrics: request and token counters, rendered as Prometheus text
 * (exposition format 0.0.4) by GET /metrics. */
#include <stdio.h>

#include "server_internal.h"

static const int status_codes[SRV_N_STATUS - 1] = {200, 400, 401, 403, 404, 405, 413, 429,
                                                   500, 503, 431};

void srv_metrics_init(srv_metrics *m)
{
    *m = (srv_metrics){0};
    pthread_mutex_init(&m->mu, NULL);
}

void srv_metrics_destroy(srv_metrics *m)
{
    pthread_mutex_destroy(&m->mu);
}

void srv_metrics_status(srv_metrics *m, int http_status)
{
    int k = 0;
    while (k < SRV_N_STATUS - 1 && status_codes[k] != http_status)
        k++;
    pthread_mutex_lock(&m->mu);
    m->by_status[k]++; /* k == SRV_N_STATUS - 1: "other" */
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_generation(srv_metrics *m, const tdm_gen_result *r)
{
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (uint64_t)r->n_prompt;
    m->reused_tokens += (uint64_t)r->n_reused;
    m->generated_tokens += (uint64_t)r->n_generated;
    m->thinking_tokens += (uint64_t)r->n_thinking;
    m->prompt_seconds += r->prompt_seconds;
    m->gen_seconds += r->gen_seconds;
    m->requests_done++;
    if (r->n_generated > 0 && r->gen_seconds > 0)
        m->last_gen_tps = r->n_generated / r->gen_seconds;
    int evaluated = r->n_prompt - r->n_reused;
    if (evaluated > 0 && r->prompt_seconds > 0)
        m->last_prompt_tps = evaluated / r->prompt_seconds;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_cancelled(srv_metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->requests_cancelled++;
    pthread_mutex_unlock(&m->mu);
}

void srv_metrics_set_hit_rate(srv_metrics *m, double rate)
{
    if (!(rate >= 0))
        rate = 0;
    if (rate > 1)
        rate = 1;
    pthread_mutex_lock(&m->mu);
    m->cache_hit_rate = rate;
    pthread_mutex_unlock(&m->mu);
}

static void metric(srv_buf *b, const char *name, const char *type, const char *help, double v)
{
    srv_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n%s %.17g\n", name, help, name, type, name, v);
}

bool srv_metrics_render(srv_metrics *m, int queue_depth, int busy, srv_buf *b)
{
    pthread_mutex_lock(&m->mu);
    srv_metrics c = *m; /* a consistent snapshot; the copied mutex is never used */
    pthread_mutex_unlock(&m->mu);
    metric(b, "tandem_prompt_tokens_total", "counter",
           "Prompt tokens of finished requests (evaluated or reused).", (double)c.prompt_tokens);
    metric(b, "tandem_prompt_tokens_reused_total", "counter",
           "Prompt tokens taken from the previous conversation state.", (double)c.reused_tokens);
    metric(b, "tandem_generated_tokens_total", "counter",
           "Tokens generated (thinking included).", (double)c.generated_tokens);
    metric(b, "tandem_thinking_tokens_total", "counter", "Tokens generated inside thinking blocks.",
           (double)c.thinking_tokens);
    metric(b, "tandem_prompt_seconds_total", "counter", "Time spent on prompts.", c.prompt_seconds);
    metric(b, "tandem_generation_seconds_total", "counter", "Time spent generating.",
           c.gen_seconds);
    metric(b, "tandem_last_tokens_per_second", "gauge",
           "Generation speed of the last finished request.", c.last_gen_tps);
    metric(b, "tandem_last_prompt_tokens_per_second", "gauge",
           "Prompt evaluation speed of the last finished request.", c.last_prompt_tps);
    metric(b, "tandem_queue_depth", "gauge", "Requests waiting for the generation worker.",
           queue_depth);
    metric(b, "tandem_requests_running", "gauge", "Requests being generated now (0 or 1).", busy);
    metric(b, "tandem_generations_total", "counter", "Generations finished.",
           (double)c.requests_done);
    metric(b, "tandem_requests_cancelled_total", "counter",
           "Requests whose client went away before the end.", (double)c.requests_cancelled);
    metric(b, "tandem_expert_cache_hit_rate", "gauge",
           "Fraction of routed experts served from the VRAM cache (0 on the CPU path).",
           c.cache_hit_rate);
    srv_buf_puts(b, "# HELP tandem_requests_total HTTP responses by status code.\n"
                    "# TYPE tandem_requests_total counter\n");
    for (int k = 0; k < SRV_N_STATUS; k++) {
        if (k < SRV_N_STATUS - 1)
            srv_buf_printf(b, "tandem_requests_total{status=\"%d\"} %llu\n", status_codes[k],
                           (unsigned long long)c.by_status[k]);
        else
            srv_buf_printf(b, "tandem_requests_total{status=\"other\"} %llu\n",
                           (unsigned long long)c.by_status[k]);
    }
    return b->p != NULL;
}
