/* tandem tokenize: text -> token ids (JSON array on stdout). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "tokenizer.h"

const char tdm_cli_tokenize_help[] =
    "print the token ids of a text as a JSON array\n"
    "usage: tandem tokenize [-m MODEL.gguf] [--no-special] (--text STR | --file F)\n"
    "  -m MODEL       GGUF whose vocabulary to use (default: the demo model)\n"
    "  --no-special   do not parse control tokens like <|im_start|> in the text\n"
    "                 (user-defined ones like <think> are always split out)\n"
    "  --text STR     the text\n"
    "  --file F       read the text from file F ('-' = stdin), byte for byte\n";

static char *slurp(const char *path, size_t *len)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
    if (!f)
        return NULL;
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    while (b) {
        n += fread(b + n, 1, cap - n, f);
        if (n < cap)
            break;
        char *p = realloc(b, cap *= 2);
        if (!p)
            free(b);
        b = p;
    }
    if (f != stdin)
        fclose(f);
    *len = n;
    return b;
}

int tdm_cli_tokenize(int argc, char **argv)
{
    const char *model = NULL, *text = NULL, *file = NULL;
    unsigned flags = TDM_TOKENIZE_PARSE_SPECIAL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--no-special"))
            flags &= ~TDM_TOKENIZE_PARSE_SPECIAL;
        else if (!strcmp(argv[i], "-m") && i + 1 < argc)
            model = argv[++i];
        else if (!strcmp(argv[i], "--text") && i + 1 < argc)
            text = argv[++i];
        else if (!strcmp(argv[i], "--file") && i + 1 < argc)
            file = argv[++i];
        else {
            fprintf(stderr, "tandem tokenize: unexpected argument '%s'\n%s", argv[i], tdm_cli_tokenize_help);
            return 2;
        }
    }
    if (!text == !file) {
        fprintf(stderr, "tandem tokenize: give exactly one of --text and --file\n%s", tdm_cli_tokenize_help);
        return 2;
    }
    size_t len = 0;
    char *buf = NULL;
    if (file && !(buf = slurp(file, &len))) {
        fprintf(stderr, "tandem tokenize: cannot read '%s'\n", file);
        return 1;
    }
    if (text)
        len = strlen(text);
    tdm_tokenizer *tk;
    tdm_error err;
    if (tdm_tokenizer_open(model ? model : tdm_cli_default_model(), &tk, &err)) {
        fprintf(stderr, "tandem tokenize: %s\n", err.msg);
        free(buf);
        return 1;
    }
    size_t cap = tdm_tokenizer_encode_bound(len), n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    int rc = 0;
    if (!ids || tdm_tokenizer_encode(tk, text ? text : buf, len, flags, ids, cap, &n, &err)) {
        fprintf(stderr, "tandem tokenize: %s\n", ids ? err.msg : "out of memory");
        rc = 1;
    } else {
        putchar('[');
        for (size_t i = 0; i < n; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        puts("]");
    }
    free(ids);
    free(buf);
    tdm_tokenizer_free(tk);
    return rc;
}
