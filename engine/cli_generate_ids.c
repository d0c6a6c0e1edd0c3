/* tandem generate-ids: greedy token ids through the incremental decode path. */
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"
#include "cli_gen.h"

const char tdm_cli_generate_ids_help[] =
    "greedy-decode token ids (prompt eval, then one token at a time), printed as a JSON array\n"
    "usage: tandem generate-ids [-m MODEL] --tokens 1,2,3 [-n 24] [--threads N] [--device auto|cpu|cuda]\n"
    "  prints exactly N ids (end-of-generation tokens do not stop it)";

int tdm_cli_generate_ids(int argc, char **argv)
{
    cli_gen_opts o;
    int rc = cli_gen_parse(argc, argv, &o, "generate-ids");
    if (rc)
        return rc;
    if (!o.tokens) {
        fprintf(stderr, "tandem generate-ids: --tokens is required\n");
        return 2;
    }
    const int cap = 1 << 20;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    int n = ids ? tdm_cli_parse_ids(o.tokens, ids, cap) : -1;
    if (n <= 0) {
        fprintf(stderr, "tandem generate-ids: --tokens must be a comma-separated list of token ids\n");
        free(ids);
        return 2;
    }
    o.ctx = n + o.n_predict;
    cli_gen_ctx c;
    if (!cli_gen_open(&c, &o, false)) {
        free(ids);
        return 1;
    }
    tdm_error err = {0};
    rc = 1;
    int32_t t;
    if (tdm_session_eval_greedy(c.sess, ids, n, &t, &err)) {
        fprintf(stderr, "tandem generate-ids: %s\n", err.msg);
        goto done;
    }
    printf("[");
    for (int i = 0; i < o.n_predict; i++) {
        printf("%s%d", i ? ", " : "", t);
        if (i + 1 < o.n_predict && tdm_session_eval_greedy(c.sess, &t, 1, &t, &err)) {
            fprintf(stderr, "\ntandem generate-ids: %s\n", err.msg);
            goto done;
        }
    }
    printf("]\n");
    rc = 0;
done:
    free(ids);
    cli_gen_close(&c);
    return rc;
}
