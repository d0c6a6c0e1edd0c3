/* tandem detokenize: token ids -> text on stdout. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tokenizer.h"

const char tdm_cli_detokenize_help[] =
    "print the text of token ids\n"
    "usage: tandem detokenize [-m MODEL.gguf] [--no-special] [--raw] --ids 1,2,3\n"
    "  -m MODEL       GGUF whose vocabulary to use (default: the demo model)\n"
    "  --ids LIST     comma-separated token ids\n"
    "  --no-special   control tokens (<|im_start|>...) produce no text\n"
    "  --raw          print the bytes exactly, without the trailing newline\n";

int tdm_cli_detokenize(int argc, char **argv)
{
    const char *model = NULL, *list = NULL;
    unsigned flags = TDM_DECODE_SPECIAL;
    int raw = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-special"))
            flags &= ~TDM_DECODE_SPECIAL;
        else if (!strcmp(argv[i], "--raw"))
            raw = 1;
        else if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--ids") && i + 1 < argc)
            list = argv[++i];
        else {
            fprintf(stderr, "tandem detokenize: unexpected argument '%s'\n%s", argv[i], tdm_cli_detokenize_help);
            return 2;
        }
    }
    if (!list) {
        fprintf(stderr, "tandem detokenize: --ids is required\n%s", tdm_cli_detokenize_help);
        return 2;
    }
    int cap = (int)strlen(list) / 2 + 1;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    int n = ids ? tdm_cli_parse_ids(list, ids, cap) : -1;
    if (n < 0) {
        fprintf(stderr, "tandem detokenize: bad --ids '%s' (want e.g. 1,2,3)\n", list);
        free(ids);
        return 2;
    }
    tdm_tokenizer *tk;
    tdm_error err;
    if (tdm_tokenizer_open(model ? model : tdm_cli_default_model(), &tk, &err)) {
        fprintf(stderr, "tandem detokenize: %s\n", err.msg);
        free(ids);
        return 1;
    }
    size_t len = 0;
    int rc = 0;
    tdm_tokenizer_decode(tk, ids, (size_t)n, flags, NULL, 0, &len, &err); /* measure */
    char *out = malloc(len + 1);
    if (!out || tdm_tokenizer_decode(tk, ids, (size_t)n, flags, out, len + 1, &len, &err)) {
        fprintf(stderr, "tandem detokenize: %s\n", out ? err.msg : "out of memory");
        rc = 1;
    } else {
        fwrite(out, 1, len, stdout);
        if (!raw)
            putchar('\n');
    }
    free(out);
    free(ids);
    tdm_tokenizer_free(tk);
    return rc;
}
