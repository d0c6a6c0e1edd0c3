/* tandem logits: float32 logits of a token sequence from one forward pass. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_gen.h"
#include "forward.h"

const char tdm_cli_logits_help[] =
    "write the logits of a token sequence (one forward pass) as float32\n"
    "usage: tandem logits [-m MODEL] --tokens 1,2,3 --out F.f32 [--all] [--threads N] [--device auto|cpu|cuda]\n"
    "  writes row-major [n_tokens][n_vocab] (every position) with --all, else [n_vocab] of the last one";

int tdm_cli_logits(int argc, char **argv)
{
    cli_gen_opts o;
    int rc = cli_gen_parse(argc, argv, &o, "logits");
    if (rc)
        return rc;
    if (!o.tokens || !o.out) {
        fprintf(stderr, "tandem logits: --tokens and --out are required\n");
        return 2;
    }
    const int cap = 1 << 20;
    int32_t *ids = malloc(cap * sizeof(int32_t));
    int n = ids ? tdm_cli_parse_ids(o.tokens, ids, cap) : -1;
    if (n <= 0) {
        fprintf(stderr, "tandem logits: --tokens must be a comma-separated list of token ids\n");
        free(ids);
        return 2;
    }
    o.ctx = n;
    cli_gen_ctx c;
    if (!cli_gen_open(&c, &o, false)) {
        free(ids);
        return 1;
    }
    rc = 1;
    const int32_t V = tdm_model_hparams(c.model)->n_vocab;
    const size_t rows = o.all ? (size_t)n : 1;
    float *logits = malloc(rows * V * sizeof(float));
    tdm_forward *f = NULL;
    tdm_error err = {0};
    /* the whole sequence as one batch */
    tdm_status st = logits ? tdm_forward_new(c.model, n, n, &f, &err)
                           : tdm_error_set(&err, TDM_ERR_OOM, "%zu logits", rows * V);
    double t0 = cli_gen_now();
    if (!st)
        st = tdm_forward_eval(f, ids, n, 0, logits, o.all, &err);
    double dt = cli_gen_now() - t0;
    if (st) {
        fprintf(stderr, "tandem logits: %s: %s\n", tdm_status_name(st), err.msg);
        goto done;
    }
    FILE *fo = fopen(o.out, "wb");
    if (!fo || fwrite(logits, sizeof(float), rows * V, fo) != rows * V || fclose(fo)) {
        fprintf(stderr, "tandem logits: cannot write %s\n", o.out);
        goto done;
    }
    fprintf(stderr, "logits: %d tokens in %.3f s, wrote [%zu][%d] to %s\n", n, dt, rows, V, o.out);
    rc = 0;
done:
    tdm_forward_free(f);
    free(logits);
    free(ids);
    cli_gen_close(&c);
    return rc;
}
