/* cli: the `tandem` command table and helpers shared by the commands and
 * tools (engine/cli.c is part of the library; the commands are cli_*.c).
 * Each command lives in engine/cli_<name>.c and returns a process exit code
 * (0 ok, 1 failure, 2 usage error). Only main() turns that into exit(). */
#ifndef TDM_CLI_H
#define TDM_CLI_H

#include <stdbool.h>
#include <stdint.h>

#include "model.h"
#include "status.h"

typedef struct tdm_cli_command {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the command name */
    const char *help;                  /* one-line summary, then usage */
} tdm_cli_command;

extern const tdm_cli_command tdm_cli_commands[]; /* NULL-terminated, generated */

/* Path of the demo model shipped with tandem: $TANDEM_MODEL if set, else
 * models/demo/demo-Q4_K_M.gguf next to the executable's source tree
 * (resolved from /proc/self/exe), else the same path under the cwd. */
const char *tdm_cli_default_model(void);

/* Parses "a,b,c" into ids (at most cap). Returns the count, or -1 on bad input. */
int tdm_cli_parse_ids(const char *s, int32_t *ids, int cap);
/* The same, each value within lo..hi (-1 otherwise): thread counts, lengths. */
int tdm_cli_parse_int_list(const char *s, int32_t *out, int cap, int32_t lo, int32_t hi);

/* Whole-string numeric parsing with an inclusive range; false on junk,
 * overflow or out-of-range values (out untouched). */
bool tdm_cli_parse_long(const char *s, long lo, long hi, long *out);
bool tdm_cli_parse_i32(const char *s, long lo, long hi, int32_t *out);
bool tdm_cli_parse_double(const char *s, double lo, double hi, double *out);
bool tdm_cli_parse_float(const char *s, double lo, double hi, float *out);
/* --expert-memory: where the CPU reads the routed experts (model.h
 * tdm_model_copy_experts). auto: the copy when a hybrid GPU run takes a
 * direct share (the GPU reads misses from pinned host memory, which only
 * the copy can be quickly), the file mapping otherwise. */
typedef enum tdm_expert_memory {
    TDM_EXPERT_MEMORY_AUTO,
    TDM_EXPERT_MEMORY_MAP,
    TDM_EXPERT_MEMORY_COPY,
} tdm_expert_memory;
/* "auto", "map" or "copy"; false for anything else. */
bool tdm_cli_parse_expert_memory(const char *s, tdm_expert_memory *out);
/* Copies the experts when `mem` asks for it: copy whenever the CPU reads
 * experts (cpu_reads), auto when it does and the run takes a direct share
 * (direct). An auto copy that memory does not allow leaves the mapping
 * (a note on stderr); an asked-for one fails. */
tdm_status tdm_cli_place_experts(tdm_model *m, tdm_expert_memory mem, bool cpu_reads, bool direct, tdm_error *err);

/* --zero-copy: "auto" (-1) or a count 0..4096 of misses per MoE launch. */
bool tdm_cli_parse_zero_copy(const char *s, int32_t *out);

/* "on" (1) or "off" (0); false for anything else. */
bool tdm_cli_parse_on_off(const char *s, int32_t *out);

/* Parses sizes like "12G", "512M", "1.5G", "1024" (bytes). false on bad input. */
bool tdm_cli_parse_size(const char *s, uint64_t *out);

#endif
