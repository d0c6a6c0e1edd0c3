/* tandem serve: the OpenAI / Anthropic compatible HTTP server and web chat. */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_gen.h"
#include "generate.h"
#include "model.h"
#include "server.h"

const char tdm_cli_serve_help[] =
    "serve the model over HTTP: OpenAI + Anthropic APIs, streaming, web chat at /\n"
    "usage: tandem serve [options]\n"
    "  --model PATH              GGUF file (default: the demo model)\n"
    "  --host ADDR               address to bind (default 127.0.0.1)\n"
    "  --port N                  port (default 8080; 0 = any free port)\n"
    "  --api-key KEY             require 'Authorization: Bearer KEY' or 'x-api-key: KEY'\n"
    "                            (default: $TANDEM_API_KEY, else no key)\n"
    "  --allow-host NAME         also accept this Host/Origin name (repeatable; '*' = any)\n"
    "  --ctx N                   context tokens (prompt + answer; default min(train, 4096))\n"
    "  --device auto|cpu|cuda    where the model runs (default: cuda when a GPU is visible)\n"
    "  --max-body SIZE           request body limit (default 4M)\n"
    "  --max-connections N       simultaneous connections (default 64)\n"
    "  --max-tokens N            default answer cap for chat requests (default: none)\n"
    "  --max-thinking-tokens N   default thinking budget (default: none)\n"
    "  --grace-tokens N          tokens allowed to finish a sentence cut by max_tokens (64)\n"
    "  --model-name NAME         id shown by /v1/models (default: the file name)\n"
    "Threads and the hybrid executor (routed experts in a VRAM cache + CPU pool) as in tandem run;\n"
    "--profile-save is written at shutdown:\n"
    CLI_GEN_HYBRID_HELP
    "Requests are queued and served one at a time. Stop with Ctrl-C / SIGTERM.\n";


/* Default model name: the file name without directories and ".gguf". */
static void name_from_path(const char *path, char *out, size_t cap)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, cap, "%s", b);
    size_t n = strlen(out);
    if (n > 5 && !strcmp(out + n - 5, ".gguf"))
        out[n - 5] = '\0';
}

int tdm_cli_serve(int argc, char **argv)
{
    tdm_server_config cfg;
    tdm_server_config_default(&cfg);
    const char *model_path = tdm_cli_default_model();
    const char *env_key = getenv("TANDEM_API_KEY");
    cfg.api_key = env_key && *env_key ? env_key : NULL;
    long ctx = 0, v = 0;
    cli_gen_opts go;
    cli_gen_opts_init(&go);
    go.model = model_path;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes = a[0] == '-' && a[1] == '-';
        if (takes && !val) {
            fprintf(stderr, "tandem serve: %s needs a value\n", a);
            return 2;
        }
        bool ok = true;
        if (!strcmp(a, "--model")) {
            go.model = model_path = val;
        } else if (!strcmp(a, "--host")) {
            cfg.host = val;
        } else if (!strcmp(a, "--port") && tdm_cli_parse_long(val, 0, 65535, &v)) {
            cfg.port = (uint16_t)v;
        } else if (!strcmp(a, "--api-key")) {
            cfg.api_key = val;
        } else if (!strcmp(a, "--allow-host")) {
            if (cfg.n_allow_hosts == TDM_SERVER_MAX_ALLOW_HOSTS) {
                fprintf(stderr, "tandem serve: at most %d --allow-host\n", TDM_SERVER_MAX_ALLOW_HOSTS);
                return 2;
            }
            cfg.allow_hosts[cfg.n_allow_hosts++] = val;
        } else if (!strcmp(a, "--ctx") && tdm_cli_parse_long(val, 16, INT32_MAX, &v)) {
            ctx = v;
        } else if (!strcmp(a, "--device") && tdm_device_parse(val, &go.device)) {
            /* parsed */
        } else if (cli_gen_cache_option(a, val, &go, &ok) && ok) {
            /* parsed */
        } else if (!strcmp(a, "--max-body")) {
            uint64_t sz;
            if (!tdm_cli_parse_size(val, &sz) || sz < 1024 || sz > (1ull << 31)) {
                fprintf(stderr, "tandem serve: bad --max-body '%s' (1K..2G)\n", val);
                return 2;
            }
            cfg.max_body = (size_t)sz;
        } else if (!strcmp(a, "--max-connections") && tdm_cli_parse_long(val, 1, 10000, &v)) {
            cfg.max_connections = (int)v;
        } else if (!strcmp(a, "--max-tokens") && tdm_cli_parse_long(val, 1, INT32_MAX, &v)) {
            cfg.default_max_tokens = (int32_t)v;
        } else if (!strcmp(a, "--max-thinking-tokens") && tdm_cli_parse_long(val, 0, INT32_MAX, &v)) {
            cfg.max_thinking_tokens = (int32_t)v;
        } else if (!strcmp(a, "--grace-tokens") && tdm_cli_parse_long(val, 0, 4096, &v)) {
            cfg.grace_tokens = (int32_t)v;
        } else if (!strcmp(a, "--model-name")) {
            cfg.model_name = val;
        } else {
            fprintf(stderr, "tandem serve: bad option or value: %s%s%s%s (see tandem serve --help)\n", a,
                    takes ? " '" : "", takes ? val : "", takes ? "'" : "");
            return 2;
        }
        i++;
    }
    if (cli_gen_check(&go, "serve"))
        return 2;
    char name[256];
    bool named = false;
    for (int i = 1; i + 1 < argc; i += 2)
        named |= !strcmp(argv[i], "--model-name");
    if (!named) {
        name_from_path(model_path, name, sizeof name);
        cfg.model_name = name;
    }

    /* Block the stop signals before any thread starts, so that every thread
     * inherits the mask and only sigwait() below receives them. */
    sigset_t stop_set;
    sigemptyset(&stop_set);
    sigaddset(&stop_set, SIGINT);
    sigaddset(&stop_set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &stop_set, NULL);
    signal(SIGPIPE, SIG_IGN);

    tdm_error err = {0};
    cli_gen_ctx c = {0};
    tdm_generator *gen = NULL;
    tdm_server *srv = NULL;
    if (tdm_model_load(model_path, &c.model, &err) != TDM_OK) {
        fprintf(stderr, "tandem serve: %s\n", err.msg);
        return 1;
    }
    go.ctx = ctx > 0 ? (int32_t)ctx : tdm_generator_default_ctx(c.model);
    if (!cli_gen_open_session(&c, &go)) {
        cli_gen_close(&c);
        return 1;
    }
    tdm_status st = tdm_generator_new_session(c.model, c.sess, &gen, &err);
    c.sess = NULL; /* the generator owns it now, also after a failure */
    if (st != TDM_OK || tdm_server_start(&cfg, gen, &srv, &err) != TDM_OK) {
        fprintf(stderr, "tandem serve: %s\n", err.msg);
        tdm_generator_free(gen);
        cli_gen_close(&c);
        return 1;
    }
    const char *h = cfg.host ? cfg.host : "127.0.0.1";
    bool v6 = strchr(h, ':') && h[0] != '[';
    fprintf(stderr, "tandem serve: listening on http://%s%s%s:%u (model %s, context %d)\n",
            v6 ? "[" : "", h, v6 ? "]" : "", (unsigned)tdm_server_port(srv), cfg.model_name,
            tdm_generator_n_ctx(gen));
    fflush(stderr);
    int sig = 0;
    sigwait(&stop_set, &sig);
    fprintf(stderr, "tandem serve: %s, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    tdm_server_stop(srv);
    const bool saved = cli_gen_finish(&c, &go); /* before the session (and its executor) goes */
    tdm_generator_free(gen);
    cli_gen_close(&c);
    return saved ? 0 : 1;
}
