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

/* ---- named GPU profiles and models (resolve.c) ---- */

/* --gpu-dir DIR: searched first for GPU profile names (NULL: none). */
void cli_set_gpu_dir(const char *dir);
const char *cli_gpu_dir(void);

/* MODEL as given: an existing file or a path is returned as it is; a name
 * (llama-3-8b) is looked up in the search path (resource.h) and its file
 * written to buf. NULL after printing why the name was not found (exit
 * status 2). */
const char *cli_model_path(const char *arg, char *buf, size_t size);

/* --gpu NAME: a profile file is returned as it is; a name is looked up in
 * --gpu-dir and the search path into buf. NULL after printing why. */
const char *cli_gpu_path(const char *arg, char *buf, size_t size);

/* ---- estimate --snapshot and --html (pictures.c) ---- */

typedef struct cli_pictures cli_pictures;

/* Recorders for --snapshot FILE and --html FILE (either may be NULL), in
 * front of `next` (the --timeline writer, may be NULL). Returns -1 to go
 * on (*out is set; close it), or the exit code after printing why. */
int cli_pictures_open(cli_pictures **out, const char *snapshot,
                      const char *html, const vp_setup *setup,
                      vp_sim_event_fn next, void *next_ud);
/* The event callback for vp_simulate (ud: the cli_pictures). */
void cli_pictures_event(const vp_sim_event *ev, void *ud);
/* Write the files after the run; failure: why the run stopped (out of
 * memory), or NULL. Returns -1 or an exit code after printing why. */
int cli_pictures_write(const cli_pictures *p, const char *model,
                       const vp_setup *setup, const vp_estimate *est,
                       const char *failure);
void cli_pictures_close(cli_pictures *p);

/* ---- a progress line for long work (progress.c) ---- */

/* From the first second on, a line on stderr with the simulations run and
 * the seconds spent, when stderr is a terminal (nothing otherwise); stdout
 * is held until cli_progress_end, which erases the line. */
void cli_progress_begin(const char *command);
void cli_progress_end(void);

/* vramplan watch [--model MODEL [SETUP]] [OPTIONS] -- CMD ARGS...
 * (watch_cmd.c). */
int cli_watch(int argc, char **argv);

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
