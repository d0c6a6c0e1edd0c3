/* bench_json: every benchmark ends by writing its cJSON result the same way. */
#ifndef TDM_BENCH_JSON_H
#define TDM_BENCH_JSON_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

/* Writes root (pretty, newline-terminated) to path and deletes it; prints
 * "wrote PATH" or the failure. Returns 0, or 1 when the file was not written. */
static __attribute__((unused)) int bench_write_json(cJSON *root, const char *path)
{
    char *txt = cJSON_Print(root);
    cJSON_Delete(root);
    FILE *f = txt ? fopen(path, "w") : NULL;
    const int ok = f && fputs(txt, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f))
        f = NULL;
    free(txt);
    if (!ok || !f) {
        fprintf(stderr, "cannot write %s\n", path);
        return 1;
    }
    printf("wrote %s\n", path);
    return 0;
}

#endif
