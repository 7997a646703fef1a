/* vramplan CLI: what the command files share. */
#ifndef VRAMPLAN_CLI_H
#define VRAMPLAN_CLI_H

#include "vramplan/vramplan.h"

/* A usage error: message, the pointer to --help; returns exit code 2. */
int cli_usage_error(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* vramplan validate FILE.jsonl... (argv[0] is "validate"). */
int cli_validate(int argc, char **argv);

/* vramplan plan --gpus N ...: cluster planning. */
int cli_plan_cluster(int argc, char **argv);

/* The hardware profile of a GPU: a gpus/NAME.yaml name or a profile file.
 * Returns 0, or prints an error and returns non-zero. */
int cli_gpu_hw(const char *name, vp_hw *out);

#endif
