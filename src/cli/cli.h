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

/* ---- serving, batching, MIG slices (serve_cmd.c, batching_cmd.c,
 * mig_cmd.c) ------------------------------------------------------------ */

#include <stdbool.h>
#include <stdio.h>

/* vramplan serve MODEL --gpu NAME ... (argv[0] is "serve"). */
int cli_serve(int argc, char **argv);
/* vramplan batching MODEL --lengths FILE --gpu NAME ... */
int cli_batching(int argc, char **argv);
/* maxbatch / plan with --gpu-family: the smallest MIG slice that fits
 * (argv[0] is "maxbatch" or "plan"). */
int cli_mig_maxbatch(int argc, char **argv);
int cli_mig_plan(int argc, char **argv);

/* A long option of the small scanner these files share. */
typedef struct cli_opt {
    const char *name; /* without the dashes                             */
    const char *arg;  /* value name in help; NULL for a flag           */
    const char *help;
} cli_opt;
/* Options of one command go to fn with their index in opts and their
 * value (NULL for a flag); fn returns 0 or an exit code. */
typedef int (*cli_opt_fn)(void *ud, int id, const char *val);
/* Scan argv[1..]: --name VALUE, --name=VALUE and at most one operand
 * (*operand, NULL if none). Returns 0, -1 when the option named "help" was
 * given (print the help), or an exit code once a usage error is printed. */
int cli_parse(int argc, char **argv, const cli_opt *opts, size_t n,
              cli_opt_fn fn, void *ud, const char **operand);
void cli_opts_help(FILE *f, const cli_opt *opts, size_t n);
/* --precision, --optimizer, --attention, --inference, --seq into a setup;
 * 0 or an exit code. */
int cli_setup_option(vp_setup *s, const char *opt, const char *val);
/* A decimal integer in [min, max]; prints the usage error on failure. */
bool cli_u64(const char *opt, const char *text, uint64_t min, uint64_t max,
             uint64_t *out);
/* Print a library error (file:line:col: error: msg) and return its exit
 * code: 1 does not fit, 3 invalid input, 2 otherwise. */
int cli_lib_error(const struct vp_error *err);
/* Try the MIG slices of family with fits(), print the slices tried and the
 * smallest that fits; exit code 0 found, 1 none, 2/3 errors (mig_cmd.c). */
int cli_mig_smallest(const char *family, vp_mig_fit_fn fits, void *ud);

#endif
