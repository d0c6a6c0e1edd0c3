/* tandem: command-line entry point. Dispatches to engine/cli_<name>.c. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: tandem <command> [options]   (tandem <command> --help for details)\n\ncommands:\n");
    for (const tdm_cli_command *c = tdm_cli_commands; c->name; c++) {
        const char *nl = strchr(c->help, '\n');
        int len = nl ? (int)(nl - c->help) : (int)strlen(c->help);
        fprintf(f, "  %-14s %.*s\n", c->name, len, c->help);
    }
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    for (const tdm_cli_command *c = tdm_cli_commands; c->name; c++) {
        if (!strcmp(c->name, argv[1])) {
            for (int i = 2; i < argc; i++) {
                if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
                    printf("tandem %s: %s\n", c->name, c->help);
                    return 0;
                }
            }
            return c->run(argc - 1, argv + 1);
        }
    }
    fprintf(stderr, "tandem: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
