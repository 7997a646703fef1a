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

/* vramplan probe [OPTIONS] -- CMD ARGS... (probe_cmd.c). */
int cli_probe(int argc, char **argv);

/* vramplan replay MODEL [SETUP] --budget SIZE (replay_cmd.c). */
int cli_replay(int argc, char **argv);

/* vramplan calibrate [OPTIONS] (calibrate_cmd.c): run vp-calibrate, fit,
 * write a GPU profile. */
int cli_calibrate(int argc, char **argv);

/* vramplan fit MEASURED.jsonl... [OPTIONS] (fit_cmd.c): fit the framework
 * constants to measured runs. */
int cli_fit(int argc, char **argv);

/* Print a library error (file:line:col: error: msg) and return the exit
 * code for it: 3 for invalid input, else 2 (calibrate_cmd.c). */
struct vp_error;
int cli_gpu_error(const struct vp_error *err);

/* ---- plans for clusters (cluster_cmd.c; cli_plan_cluster above) ---- */

/* vramplan compare MODEL --gpus N,N... --gpu NAME,... (argv[0] is
 * "compare"): the best plan per cluster size and GPU. */
int cli_compare(int argc, char **argv);

/* vramplan export MODEL --gpus N --gpu NAME --to FMT (argv[0] is
 * "export"): plan for one engine and write its configuration. */
int cli_export(int argc, char **argv);

#endif
