/* vramplan: probing the largest batch on the real GPU.
 *
 * A probe runs the user's own training command once per trial, with the
 * batch to try written into its arguments, and decides from how each run
 * ends whether the batch fits: a clean exit is "ok", a non-zero exit whose
 * standard error shows a CUDA or PyTorch out-of-memory message is "oom",
 * any other failure is an "error" and a run past its time limit a
 * "timeout" (both stop the search). The search itself is independent of
 * processes: vp_probe_search drives any trial function, so it can be tested
 * with a fake one, and vp_probe_exec runs one trial of a command.
 *
 *   vp_probe_config c;  vp_probe_config_init(&c);
 *   c.predicted = 10;                      // from vp_maxbatch, 0 = none
 *   vp_probe_result r;
 *   vp_probe_search(&c, my_trial, ud, NULL, NULL, &r, &err);
 *   // r.max_batch, r.recommended, r.trials[0 .. r.n_trials-1]
 *   vp_probe_result_destroy(&r);
 *
 * The library never prints: progress goes through a callback. */
#ifndef VRAMPLAN_PROBE_H
#define VRAMPLAN_PROBE_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"

#define VP_TRIAL_OUTCOME_MAP(XX)                                        \
    XX(OK, "ok")           /* exited 0: the batch fits                */ \
    XX(OOM, "oom")         /* failed with an out-of-memory message    */ \
    XX(ERROR, "error")     /* any other failure; the search stops     */ \
    XX(TIMEOUT, "timeout") /* killed at the time limit; search stops  */ \
    XX(CANCELLED, "cancelled") /* stopped by the caller (Ctrl-C)      */

typedef enum {
#define VP__TRIAL(name, str) VP_TRIAL_##name,
    VP_TRIAL_OUTCOME_MAP(VP__TRIAL)
#undef VP__TRIAL
    VP_TRIAL__COUNT
} vp_trial_outcome;

/* "ok", "oom", ...; "?" for an unknown value. */
const char *vp_trial_outcome_name(vp_trial_outcome o);

/* ---- the search -------------------------------------------------------- */

typedef struct vp_probe_config {
    uint64_t min, max;      /* batches tried lie in [min, max]; 1 <= min
                               <= max (defaults 1 and 1<<20)               */
    uint64_t predicted;     /* predicted largest batch (vp_maxbatch), 0 =
                               none. With a prediction p the search tries
                               p, then p+1 (or p-1), widening by 2, 4, 8...
                               until the boundary is bracketed, then
                               bisects; without one it doubles from min,
                               then bisects                                */
    uint32_t margin_ppm;    /* safety margin in parts per million, below
                               1000000 (default 50000 = 5 %)              */
    uint32_t max_trials;    /* stop after this many trials, 0 = no limit   */
} vp_probe_config;

/* Defaults: min 1, max 1<<20, no prediction, margin 5 %, no trial limit. */
void vp_probe_config_init(vp_probe_config *c);

typedef struct vp_trial {
    uint64_t batch;
    vp_trial_outcome outcome;
    double seconds;         /* wall time of the trial                     */
} vp_trial;

typedef struct vp_probe_result {
    uint64_t max_batch;     /* largest batch that ran ok, 0 if none       */
    uint64_t recommended;   /* floor(max_batch * (1 - margin)), at least 1
                               when max_batch >= 1                        */
    uint64_t fail_batch;    /* smallest batch that failed for memory (oom),
                               0 if none                                  */
    bool complete;          /* the boundary was found: max_batch + 1 ran
                               out of memory, or max_batch is cfg.max, or
                               min ran out of memory (max_batch 0)       */
    vp_trial_outcome stop;  /* why the search stopped early: ERROR,
                               TIMEOUT or CANCELLED; OK when complete or
                               when max_trials was reached                */
    vp_trial *trials;       /* in the order run; owned, see _destroy      */
    size_t n_trials;
} vp_probe_result;

/* One trial: run the batch and set *outcome (and *seconds, its wall
 * time). Return VP_OK, or an error status (with *err set) for a failure of
 * the harness itself, which ends the search with that status. */
typedef vp_status (*vp_probe_trial_fn)(uint64_t batch,
                                       vp_trial_outcome *outcome,
                                       double *seconds, void *ud,
                                       vp_error *err);

/* Progress, for a line on a terminal. Called with done == false before a
 * trial runs (trial->outcome and ->seconds not yet set), and with done ==
 * true after it. lo is the largest batch known to fit (0: none yet), hi the
 * smallest known to fail (0: none yet); n is the trial's 1-based number. */
typedef struct vp_probe_progress {
    uint32_t n;
    bool done;
    const vp_trial *trial;
    uint64_t lo, hi;
} vp_probe_progress;
typedef void (*vp_probe_progress_fn)(const vp_probe_progress *p, void *ud);

/* Find the largest batch for which try_fn reports "ok", assuming that
 * whether a batch fits is monotone in the batch. Fills *out (release with
 * vp_probe_result_destroy, also after a failure). Returns VP_OK when the
 * search ran, also when it stopped at an "error" or "timeout" trial
 * (out->stop says so; out->max_batch is the largest that ran so far);
 * VP_EARG for an invalid config; VP_ENOMEM; or the status of a failing
 * try_fn. `progress` may be NULL. */
vp_status vp_probe_search(const vp_probe_config *cfg,
                          vp_probe_trial_fn try_fn, void *ud,
                          vp_probe_progress_fn progress, void *pud,
                          vp_probe_result *out, vp_error *err);

/* Release out->trials (NULL-safe, idempotent). */
void vp_probe_result_destroy(vp_probe_result *r);

/* floor(max_batch * (1 - margin_ppm / 1e6)) without rounding error, and
 * at least 1 when max_batch >= 1; 0 for max_batch 0. */
uint64_t vp_probe_recommended(uint64_t max_batch, uint32_t margin_ppm);

/* ---- running a command ------------------------------------------------- */

/* Whether a trial's standard error shows a GPU out-of-memory failure:
 * "CUDA out of memory", "OutOfMemoryError" (torch.OutOfMemoryError,
 * torch.cuda.OutOfMemoryError, c10::OutOfMemoryError), a line holding both
 * "CUDA" and "out of memory" (PyTorch's CUDA errors, as Lightning matches
 * them), CUBLAS_STATUS_ALLOC_FAILED, CUDNN_STATUS_ALLOC_FAILED,
 * cudaErrorMemoryAllocation, CUDA_ERROR_OUT_OF_MEMORY, "cuDNN error:
 * CUDNN_STATUS_NOT_SUPPORTED." (which Lightning treats as OOM), XLA's
 * "RESOURCE_EXHAUSTED: Out of memory" and PyTorch's "DefaultCPUAllocator:
 * can't allocate memory". Matched line by line; text[0..len). */
bool vp_probe_oom_text(const char *text, size_t len);

/* The same over a file (read in full, line by line); false when it cannot
 * be read. */
bool vp_probe_oom_file(const char *path);

/* A copy of argv (n entries, then a NULL) with every "{batch}" in every
 * argument replaced by the decimal batch. Returns a NULL-terminated array
 * owned by the caller (vp_probe_argv_free), or NULL (VP_ENOMEM). */
char **vp_probe_argv_format(char *const *argv, size_t n, uint64_t batch,
                            vp_error *err);
void vp_probe_argv_free(char **argv);
/* Whether some argument holds "{batch}". */
bool vp_probe_argv_has_batch(char *const *argv, size_t n);

typedef struct vp_exec_config {
    double timeout_s;       /* wall-clock limit, <= 0: none               */
    double grace_s;         /* SIGTERM to SIGKILL, default 5 s            */
    const char *log_dir;    /* directory for the output files (must exist) */
    const char *log_name;   /* file stem: LOG_DIR/NAME.out and NAME.err    */
    const volatile sig_atomic_t *cancel; /* polled; non-zero cancels the
                                            trial (NULL: never)          */
} vp_exec_config;

/* Defaults: no timeout, grace 5 s, no log dir (set one), name "trial". */
void vp_exec_config_init(vp_exec_config *c);

typedef struct vp_exec_result {
    vp_trial_outcome outcome;
    double seconds;
    int exit_code;          /* exit status, -1 when killed by a signal    */
    int term_signal;        /* the signal that ended it, 0 if none        */
    bool exec_failed;       /* the command could not be started (an
                               "error"; exec_errno says why)              */
    int exec_errno;
    char out_path[1024];    /* where its stdout and stderr were kept      */
    char err_path[1024];
} vp_exec_result;

/* What a trial's log keeps of each stream: the first VP_PROBE_LOG_HEAD
 * bytes and the last VP_PROBE_LOG_TAIL, with a line between them saying
 * how many bytes were cut (the OOM detection reads every byte). */
#define VP_PROBE_LOG_HEAD (1u << 20)
#define VP_PROBE_LOG_TAIL (1u << 20)

/* Run argv (argv[0] looked up in PATH; no shell) under a keeper process, a
 * child subreaper (Linux PR_SET_CHILD_SUBREAPER): every process the command
 * starts stays below the keeper, setsid or double-forked ones included.
 * The command gets its own process group, stdin from /dev/null, stdout
 * and stderr through pipes into LOG_DIR/NAME.out and LOG_DIR/NAME.err
 * (capped: VP_PROBE_LOG_HEAD), no other descriptors inherited. At the time
 * limit, or when *cancel becomes non-zero, every process below the keeper
 * gets SIGTERM and, grace_s later, SIGKILL. When the command exits,
 * whatever it left running gets SIGTERM, then SIGKILL. It returns when
 * none of them is left, reaped; EINTR is retried. The outcome follows the
 * rules above (vp_probe_oom_text on every line of its stderr). Returns
 * VP_OK (whatever the command did), VP_EIO when a log file cannot be
 * written or a process cannot be created, VP_EARG for an empty argv. */
vp_status vp_probe_exec(char *const *argv, const vp_exec_config *cfg,
                        vp_exec_result *out, vp_error *err);

/* A new directory for the logs: mkdtemp of "$TMPDIR/vramplan-probe-XXXXXX"
 * (TMPDIR unset: /tmp) into buf; VP_EIO on failure. */
vp_status vp_probe_log_dir_new(char *buf, size_t n, vp_error *err);

#endif
