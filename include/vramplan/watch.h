/* vramplan: follow a real training job's GPU memory against the plan.
 *
 * vp_watch_run starts a command, samples the memory in use on the GPUs
 * through NVML (libnvidia-ml.so.1, loaded at run time, so nothing is
 * needed to build), and compares it with the budget and with the memory
 * the simulator predicted for each step: it reports crossings of an alert
 * threshold, can stop the job before it reaches the budget (an OOM), and
 * keeps the samples for a CSV and an HTML page of measured against
 * predicted.
 *
 * The memory compared is NVML's "used" bytes of each GPU less what was in
 * use there before the command started (other processes, the driver's
 * reservation): what nvidia-smi shows the job taking, which is what the
 * simulator's device_used predicts (reserved + CUDA context). */
#ifndef VRAMPLAN_WATCH_H
#define VRAMPLAN_WATCH_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vramplan/error.h"

/* ---- NVML ---------------------------------------------------------------- */

typedef struct vp_nvml vp_nvml;

/* Load NVML: path, else $VRAMPLAN_NVML_LIB, else libnvidia-ml.so.1, and
 * initialise it. NULL with *err (VP_EIO: not found, or nvmlInit failed,
 * with NVML's message). Release with vp_nvml_close (NULL is a no-op). */
vp_nvml *vp_nvml_open(const char *path, vp_error *err);
void vp_nvml_close(vp_nvml *n);

/* GPUs NVML sees. */
unsigned vp_nvml_count(const vp_nvml *n);

/* Bytes in use and in all on GPU `index`. VP_EARG for a bad index, VP_EIO
 * with NVML's message when the query fails. */
vp_status vp_nvml_memory(vp_nvml *n, unsigned index, uint64_t *used,
                         uint64_t *total, vp_error *err);

/* The GPU's name ("NVIDIA H200") into buf; VP_EIO on failure. */
vp_status vp_nvml_name(vp_nvml *n, unsigned index, char *buf, size_t size,
                       vp_error *err);

/* ---- thresholds ------------------------------------------------------------ */

#define VP_WATCH_MAX_GPUS 64
#define VP_WATCH_MAX_STEPS 16

typedef struct vp_watch_config {
    uint64_t budget;          /* bytes the job may use per GPU; 0: the
                                 GPU's memory less what was in use before */
    uint32_t alert_ppm;       /* alert at used >= budget x alert (parts per
                                 million; default 900000, 90 %)           */
    uint32_t kill_ppm;        /* stop the job at used >= budget x kill; 0:
                                 never (default)                          */
    uint64_t predicted[VP_WATCH_MAX_STEPS]; /* the plan's device bytes by
                                 the end of steps 1..n (0: no plan); later
                                 steps take the last                      */
    uint32_t n_predicted;
    double interval_s;        /* between samples (default 0.025: 40 Hz)   */
    double grace_s;           /* SIGTERM to SIGKILL (default 5 s)         */
    const char *step_pattern; /* POSIX extended regex over the job's
                                 output lines; its first group is the step
                                 (default "[Ss]tep[ :=#]*([0-9]+)"); ""
                                 turns step matching off                  */
    unsigned gpus[VP_WATCH_MAX_GPUS]; /* NVML indices to watch            */
    unsigned n_gpus;          /* 0: every GPU                             */
    const volatile sig_atomic_t *cancel; /* non-zero: stop the job (NULL:
                                            never)                        */
} vp_watch_config;

void vp_watch_config_init(vp_watch_config *c);

/* The predicted bytes at a step (1-based; 0: unknown, the plan's peak). */
uint64_t vp_watch_predicted(const vp_watch_config *c, uint32_t step);

typedef enum {
    VP_WATCH_SAMPLE,  /* a new peak on a GPU (at most one a second)    */
    VP_WATCH_ALERT,   /* used crossed the alert threshold upwards      */
    VP_WATCH_CLEAR,   /* used fell back under the alert threshold      */
    VP_WATCH_KILL,    /* used reached the kill threshold: job stopped  */
    VP_WATCH_OUTPUT   /* the job wrote to its stdout (fd 1) or stderr  */
} vp_watch_kind;

typedef struct vp_watch_event {
    vp_watch_kind kind;
    unsigned gpu;         /* NVML index                                  */
    double t;             /* seconds since the job started               */
    uint64_t used;        /* the job's bytes on the GPU                  */
    uint64_t budget;      /* the budget on that GPU                      */
    uint64_t predicted;   /* the plan's bytes at this step (0: no plan)  */
    uint32_t step;        /* the last step the job printed (0: none)     */
    int fd;               /* OUTPUT: 1 or 2                              */
    const char *data;     /* OUTPUT: the bytes (not NUL-terminated)      */
    size_t len;
} vp_watch_event;
typedef void (*vp_watch_event_fn)(const vp_watch_event *ev, void *ud);

/* A sample kept for the CSV and the page (only changes are kept, and one
 * a second while nothing changes). */
typedef struct vp_watch_sample {
    double t;
    uint64_t used;
    uint32_t step;
    uint16_t gpu; /* position in result.gpu[] */
} vp_watch_sample;

typedef struct vp_watch_gpu {
    unsigned index;           /* NVML index                               */
    char name[96];
    uint64_t total;           /* the GPU's bytes                          */
    uint64_t before;          /* in use before the job                    */
    uint64_t budget;          /* as applied                               */
    uint64_t peak;            /* the job's largest use                    */
    double peak_t;
    uint32_t peak_step;
    uint32_t alerts;
} vp_watch_gpu;

typedef struct vp_watch_result {
    vp_watch_gpu gpu[VP_WATCH_MAX_GPUS];
    unsigned n_gpus;
    uint64_t samples;          /* NVML queries per GPU                     */
    double seconds;            /* the job's wall time                      */
    bool killed;               /* stopped at the kill threshold            */
    bool cancelled;            /* stopped by *cancel                       */
    unsigned killed_gpu;       /* the GPU that reached it                  */
    int exit_code;             /* the job's, -1 when a signal ended it     */
    int term_signal;
    bool exec_failed;
    int exec_errno;
    uint32_t last_step;
    vp_watch_sample *trace;    /* owned: vp_watch_result_destroy           */
    size_t n_trace, cap_trace;
} vp_watch_result;

/* Run argv (argv[0] from PATH, no shell) in a new process group with its
 * output piped back through on_event, sample every interval until it
 * exits, and fill *out (release with vp_watch_result_destroy, also after
 * a failure). Returns VP_OK whatever the job did (out says), VP_EARG for a
 * bad config or GPU index, VP_EIO when NVML fails or the job cannot be
 * started, VP_ENOMEM. */
vp_status vp_watch_run(char *const *argv, const vp_watch_config *cfg,
                       vp_nvml *nvml, vp_watch_event_fn on_event, void *ud,
                       vp_watch_result *out, vp_error *err);

void vp_watch_result_destroy(vp_watch_result *r);

/* The samples as CSV: t_s,gpu,step,used,predicted,budget. */
vp_status vp_watch_write_csv(const vp_watch_result *r,
                             const vp_watch_config *cfg, FILE *f,
                             vp_error *err);

/* One self-contained HTML page (inline SVG, no script): the job's memory
 * over time on each GPU against the plan's prediction, the budget and the
 * thresholds; title may be NULL. */
vp_status vp_watch_write_html(const vp_watch_result *r,
                              const vp_watch_config *cfg, const char *title,
                              FILE *f, vp_error *err);

#endif
