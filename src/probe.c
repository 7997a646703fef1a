/* Probing the largest batch on the real GPU: the bracketing search, the
 * out-of-memory detector and the runner of one trial (POSIX fork, exec,
 * pipes and process groups; no shell). */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "vramplan/probe.h"

const char *vp_trial_outcome_name(vp_trial_outcome o)
{
    static const char *const names[] = {
#define VP__TRIAL_NAME(name, str) str,
        VP_TRIAL_OUTCOME_MAP(VP__TRIAL_NAME)
#undef VP__TRIAL_NAME
    };

    return (unsigned)o < VP_TRIAL__COUNT ? names[o] : "?";
}

/* ------------------------------------------------------------------ */
/* The search                                                          */
/* ------------------------------------------------------------------ */

#define PPM 1000000u

void vp_probe_config_init(vp_probe_config *c)
{
    memset(c, 0, sizeof *c);
    c->min = 1;
    c->max = (uint64_t)1 << 20;
    c->margin_ppm = 50000;
}

void vp_probe_result_destroy(vp_probe_result *r)
{
    if (r == NULL)
        return;
    free(r->trials);
    r->trials = NULL;
    r->n_trials = 0;
}

uint64_t vp_probe_recommended(uint64_t max_batch, uint32_t margin_ppm)
{
    uint64_t keep, q, r, v;

    if (max_batch == 0)
        return 0;
    if (margin_ppm >= PPM)
        return 1;
    keep = PPM - margin_ppm; /* floor(max * keep / 1e6), split to fit */
    q = max_batch / PPM;
    r = max_batch % PPM;
    v = q * keep + r * keep / PPM; /* q * keep <= max_batch: no overflow */
    return v ? v : 1;
}

typedef struct search {
    const vp_probe_config *cfg;
    vp_probe_trial_fn try_fn;
    void *ud;
    vp_probe_progress_fn progress;
    void *pud;
    vp_probe_result *out;
    size_t cap;
    uint64_t lo, hi; /* largest ok (0 none), smallest oom (0 none) */
    bool stopped;    /* error, timeout, cancel or the trial limit */
    vp_error *err;
} search;

/* Run one trial of batch b; updates the bracket. Returns a harness error
 * status, else VP_OK (s->stopped set when the search must end). */
static vp_status trial(search *s, uint64_t b, vp_trial_outcome *oc)
{
    vp_probe_result *r = s->out;
    vp_probe_progress p;
    vp_trial *t;
    vp_status st;

    if (s->cfg->max_trials && r->n_trials >= s->cfg->max_trials) {
        s->stopped = true;
        return VP_OK;
    }
    if (!vp__grow((void **)&r->trials, &s->cap, r->n_trials + 1,
                  sizeof *r->trials))
        return vp_error_set(s->err, VP_ENOMEM, "out of memory");
    t = &r->trials[r->n_trials++];
    t->batch = b;
    t->outcome = VP_TRIAL_ERROR;
    t->seconds = 0.0;
    p.n = (uint32_t)r->n_trials;
    p.trial = t;
    p.lo = s->lo;
    p.hi = s->hi;
    p.done = false;
    if (s->progress)
        s->progress(&p, s->pud);
    st = s->try_fn(b, &t->outcome, &t->seconds, s->ud, s->err);
    if (st != VP_OK) {
        r->n_trials--;
        return st;
    }
    if ((unsigned)t->outcome >= VP_TRIAL__COUNT)
        t->outcome = VP_TRIAL_ERROR;
    if (t->outcome == VP_TRIAL_OK && b > s->lo)
        s->lo = b;
    if (t->outcome == VP_TRIAL_OOM && (s->hi == 0 || b < s->hi))
        s->hi = b;
    if (t->outcome != VP_TRIAL_OK && t->outcome != VP_TRIAL_OOM) {
        s->stopped = true;
        r->stop = t->outcome;
    }
    *oc = t->outcome;
    p.lo = s->lo;
    p.hi = s->hi;
    p.done = true;
    if (s->progress)
        s->progress(&p, s->pud);
    return VP_OK;
}

#define TRY_TRIAL(s, b, oc)                                                \
    do {                                                                   \
        vp_status st_ = trial((s), (b), (oc));                             \
        if (st_ != VP_OK)                                                  \
            return st_;                                                    \
        if ((s)->stopped)                                                  \
            return VP_OK;                                                  \
    } while (0)

/* From a prediction p: p, then p+1, p+3, p+7... (or p-1, p-3...) until
 * the boundary is between two tried batches. */
static vp_status bracket_predicted(search *s, uint64_t p)
{
    const vp_probe_config *c = s->cfg;
    vp_trial_outcome oc;
    uint64_t step = 1, b;

    TRY_TRIAL(s, p, &oc);
    if (oc == VP_TRIAL_OK) {
        while (s->lo < c->max) {
            b = c->max - s->lo > step ? s->lo + step : c->max;
            TRY_TRIAL(s, b, &oc);
            if (oc != VP_TRIAL_OK)
                break;
            step = step > UINT64_MAX / 2 ? UINT64_MAX : step * 2;
        }
    } else {
        while (s->hi > c->min) {
            b = s->hi - c->min > step ? s->hi - step : c->min;
            TRY_TRIAL(s, b, &oc);
            if (oc == VP_TRIAL_OK)
                break;
            step = step > UINT64_MAX / 2 ? UINT64_MAX : step * 2;
        }
    }
    return VP_OK;
}

/* Without a prediction: min, 2 min, 4 min... (the last one max). */
static vp_status bracket_doubling(search *s)
{
    const vp_probe_config *c = s->cfg;
    vp_trial_outcome oc;
    uint64_t b = c->min;

    for (;;) {
        TRY_TRIAL(s, b, &oc);
        if (oc != VP_TRIAL_OK || b == c->max)
            return VP_OK;
        b = b > c->max / 2 ? c->max : b * 2;
    }
}

vp_status vp_probe_search(const vp_probe_config *cfg,
                          vp_probe_trial_fn try_fn, void *ud,
                          vp_probe_progress_fn progress, void *pud,
                          vp_probe_result *out, vp_error *err)
{
    search s;
    vp_status st;
    vp_trial_outcome oc;

    memset(out, 0, sizeof *out);
    out->stop = VP_TRIAL_OK;
    vp_error_clear(err);
    if (cfg->min == 0 || cfg->min > cfg->max)
        return vp_error_set(err, VP_EARG,
                            "the batch range must satisfy 1 <= min <= max "
                            "(min %" PRIu64 ", max %" PRIu64 ")",
                            cfg->min, cfg->max);
    if (cfg->margin_ppm >= PPM)
        return vp_error_set(err, VP_EARG, "the margin must be below 1");
    if (try_fn == NULL)
        return vp_error_set(err, VP_EARG, "no trial function");
    memset(&s, 0, sizeof s);
    s.cfg = cfg;
    s.try_fn = try_fn;
    s.ud = ud;
    s.progress = progress;
    s.pud = pud;
    s.out = out;
    s.err = err;

    if (cfg->predicted) {
        uint64_t p = cfg->predicted;

        if (p < cfg->min)
            p = cfg->min;
        if (p > cfg->max)
            p = cfg->max;
        st = bracket_predicted(&s, p);
    } else {
        st = bracket_doubling(&s);
    }
    /* bisect: lo fits, hi does not */
    while (st == VP_OK && !s.stopped && s.lo > 0 && s.hi > s.lo + 1) {
        st = trial(&s, s.lo + (s.hi - s.lo) / 2, &oc);
    }
    out->max_batch = s.lo;
    out->fail_batch = s.hi;
    out->recommended = vp_probe_recommended(s.lo, cfg->margin_ppm);
    out->complete = (s.lo > 0 && (s.hi == s.lo + 1 || s.lo == cfg->max)) ||
                    (s.lo == 0 && s.hi == cfg->min);
    return st;
}

/* ------------------------------------------------------------------ */
/* Out-of-memory messages                                              */
/* ------------------------------------------------------------------ */

/* Substrings that mark a GPU (or host) allocation failure on their own. */
static const char *const OOM_MARKS[] = {
    "CUDA out of memory",            /* torch.OutOfMemoryError's text      */
    "OutOfMemoryError",              /* torch., torch.cuda., c10::         */
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "cudaErrorMemoryAllocation",
    "CUDA_ERROR_OUT_OF_MEMORY",
    "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.", /* Lightning's "snafu"     */
    "RESOURCE_EXHAUSTED: Out of memory",        /* JAX / XLA               */
    "DefaultCPUAllocator: can't allocate memory",
};

static bool has(const char *s, size_t n, const char *pat)
{
    size_t m = strlen(pat);

    if (m == 0 || m > n)
        return m == 0;
    for (size_t i = 0; i + m <= n; i++)
        if (s[i] == pat[0] && memcmp(s + i, pat, m) == 0)
            return true;
    return false;
}

static bool oom_line(const char *s, size_t n)
{
    for (size_t k = 0; k < sizeof OOM_MARKS / sizeof OOM_MARKS[0]; k++)
        if (has(s, n, OOM_MARKS[k]))
            return true;
    /* "CUDA error: out of memory", "HIP out of memory", ... (Lightning
     * matches "CUDA" and "out of memory" in one message) */
    return has(s, n, "out of memory") &&
           (has(s, n, "CUDA") || has(s, n, "HIP") || has(s, n, "cuda"));
}

bool vp_probe_oom_text(const char *text, size_t len)
{
    size_t start = 0;

    for (size_t i = 0; i <= len; i++) {
        if (i == len || text[i] == '\n' || text[i] == '\r') {
            if (i > start && oom_line(text + start, i - start))
                return true;
            start = i + 1;
        }
    }
    return false;
}

#define SCAN_LINE_MAX 65536 /* longer lines are scanned in overlapping parts */
#define SCAN_OVERLAP 256

bool vp_probe_oom_file(const char *path)
{
    char *buf;
    size_t len = 0, n, start;
    bool found = false;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    buf = malloc(2 * SCAN_LINE_MAX);
    if (buf == NULL) {
        close(fd);
        return false;
    }
    for (;;) {
        ssize_t got = read(fd, buf + len, 2 * SCAN_LINE_MAX - len);

        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0) {
            found = found || vp_probe_oom_text(buf, len);
            break;
        }
        n = len + (size_t)got;
        /* scan the complete lines; keep the last partial one */
        start = n;
        while (start > 0 && buf[start - 1] != '\n' && buf[start - 1] != '\r')
            start--;
        if (start == 0 && n > SCAN_LINE_MAX) {
            /* one very long line: scan it, keep an overlap */
            found = found || vp_probe_oom_text(buf, n);
            memmove(buf, buf + n - SCAN_OVERLAP, SCAN_OVERLAP);
            len = SCAN_OVERLAP;
        } else {
            found = found || vp_probe_oom_text(buf, start);
            memmove(buf, buf + start, n - start);
            len = n - start;
        }
        if (found)
            break;
    }
    free(buf);
    close(fd);
    return found;
}

/* ------------------------------------------------------------------ */
/* Arguments                                                           */
/* ------------------------------------------------------------------ */

#define BATCH_MARK "{batch}"

bool vp_probe_argv_has_batch(char *const *argv, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (argv[i] != NULL && strstr(argv[i], BATCH_MARK) != NULL)
            return true;
    return false;
}

void vp_probe_argv_free(char **argv)
{
    if (argv == NULL)
        return;
    for (size_t i = 0; argv[i] != NULL; i++)
        free(argv[i]);
    free(argv);
}

static char *subst(const char *arg, const char *num)
{
    size_t marks = 0, len, nlen = strlen(num), mlen = strlen(BATCH_MARK);
    const char *p;
    char *out, *o;

    for (p = strstr(arg, BATCH_MARK); p != NULL;
         p = strstr(p + mlen, BATCH_MARK))
        marks++;
    len = strlen(arg);
    if (marks > (SIZE_MAX - len - 1) / (nlen + 1))
        return NULL;
    out = malloc(len + marks * nlen + 1);
    if (out == NULL)
        return NULL;
    o = out;
    while ((p = strstr(arg, BATCH_MARK)) != NULL) {
        memcpy(o, arg, (size_t)(p - arg));
        o += p - arg;
        memcpy(o, num, nlen);
        o += nlen;
        arg = p + mlen;
    }
    strcpy(o, arg);
    return out;
}

char **vp_probe_argv_format(char *const *argv, size_t n, uint64_t batch,
                            vp_error *err)
{
    char num[24], **out;

    snprintf(num, sizeof num, "%" PRIu64, batch);
    out = calloc(n + 1, sizeof *out);
    if (out == NULL)
        goto nomem;
    for (size_t i = 0; i < n; i++) {
        out[i] = subst(argv[i], num);
        if (out[i] == NULL) {
            vp_probe_argv_free(out);
            goto nomem;
        }
    }
    return out;
nomem:
    vp_error_set(err, VP_ENOMEM, "out of memory");
    return NULL;
}

/* ------------------------------------------------------------------ */
/* Running one trial                                                   */
/* ------------------------------------------------------------------ */

void vp_exec_config_init(vp_exec_config *c)
{
    memset(c, 0, sizeof *c);
    c->grace_s = 5.0;
    c->log_name = "trial";
}

vp_status vp_probe_log_dir_new(char *buf, size_t n, vp_error *err)
{
    const char *tmp = getenv("TMPDIR");
    int len;

    if (tmp == NULL || tmp[0] == '\0')
        tmp = "/tmp";
    len = snprintf(buf, n, "%s/vramplan-probe-XXXXXX", tmp);
    if (len < 0 || (size_t)len >= n)
        return vp_error_set(err, VP_EIO, "temporary directory name too "
                            "long: %s", tmp);
    if (mkdtemp(buf) == NULL)
        return vp_error_set(err, VP_EIO, "cannot create a directory in %s: "
                            "%s", tmp, strerror(errno));
    return VP_OK;
}

static double now_s(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_s(double s)
{
    struct timespec ts;

    if (s <= 0)
        return;
    ts.tv_sec = (time_t)s;
    ts.tv_nsec = (long)((s - (double)ts.tv_sec) * 1e9);
    nanosleep(&ts, NULL); /* EINTR: the caller's loop looks again */
}

static void close_fd(int *fd)
{
    if (*fd >= 0) {
        close(*fd);
        *fd = -1;
    }
}

static bool set_cloexec(int fd)
{
    int fl = fcntl(fd, F_GETFD);

    return fl >= 0 && fcntl(fd, F_SETFD, fl | FD_CLOEXEC) == 0;
}

/* pipe() with both ends close-on-exec. */
static int cloexec_pipe(int fds[2])
{
    if (pipe(fds) != 0)
        return -1;
    if (!set_cloexec(fds[0]) || !set_cloexec(fds[1])) {
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    return 0;
}

static bool write_all(int fd, const char *p, size_t n)
{
    while (n > 0) {
        ssize_t w = write(fd, p, n);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return false;
        p += w;
        n -= (size_t)w;
    }
    return true;
}

/* The child, between fork and exec: only async-signal-safe calls. */
static _Noreturn void child_exec(char *const *argv, int devnull, int out_w,
                                 int err_w, int report_w)
{
    struct sigaction sa;
    sigset_t none;
    long max_fd;
    int e;

    setpgid(0, 0);
    /* keep the three descriptors clear of 0..2 before the dup2 calls */
    if (devnull < 3)
        devnull = fcntl(devnull, F_DUPFD, 3);
    if (out_w < 3)
        out_w = fcntl(out_w, F_DUPFD, 3);
    if (err_w < 3)
        err_w = fcntl(err_w, F_DUPFD, 3);
    if (report_w < 3) {
        report_w = fcntl(report_w, F_DUPFD, 3);
        if (report_w >= 0)
            set_cloexec(report_w);
    }
    if (devnull < 0 || out_w < 0 || err_w < 0 || report_w < 0)
        _exit(127);
    /* dispositions and the mask the parent may have changed */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGPIPE, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    sigaction(SIGQUIT, &sa, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);

    if (dup2(devnull, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0)
        goto fail;
    /* no other descriptor goes to the command (the report pipe is
     * close-on-exec and must stay open until exec) */
    max_fd = sysconf(_SC_OPEN_MAX);
    if (max_fd < 0 || max_fd > 65536)
        max_fd = 65536;
    for (int fd = 3; fd < max_fd; fd++)
        if (fd != report_w)
            close(fd);
    execvp(argv[0], argv);
fail:
    e = errno;
    while (write(report_w, &e, sizeof e) < 0 && errno == EINTR)
        ;
    _exit(127);
}

typedef struct stream {
    int fd;      /* read end of the pipe, -1 once at EOF */
    int log;     /* log file                             */
    bool log_ok;
} stream;

/* Move what is ready on the pipes into the logs; wait at most `wait`
 * seconds for something to happen. */
static void pump(stream *sv, int n, double wait)
{
    struct pollfd pf[2];
    int np = 0, map[2];
    char buf[65536];

    for (int i = 0; i < n; i++)
        if (sv[i].fd >= 0) {
            pf[np].fd = sv[i].fd;
            pf[np].events = POLLIN;
            pf[np].revents = 0;
            map[np++] = i;
        }
    if (np == 0) {
        sleep_s(wait < 0.01 ? wait : 0.01); /* only the exit to wait for */
        return;
    }
    if (poll(pf, (nfds_t)np, (int)(wait * 1000.0 + 0.5)) <= 0)
        return; /* timeout, or EINTR: the caller looks again */
    for (int k = 0; k < np; k++) {
        stream *s = &sv[map[k]];
        ssize_t got;

        if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        got = read(s->fd, buf, sizeof buf);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got <= 0) {
            close_fd(&s->fd);
            continue;
        }
        if (s->log_ok && !write_all(s->log, buf, (size_t)got))
            s->log_ok = false;
    }
}

static bool pipes_open(const stream *sv, int n)
{
    for (int i = 0; i < n; i++)
        if (sv[i].fd >= 0)
            return true;
    return false;
}

/* Whether the leader has ended, without reaping it: while it is a zombie
 * its pid stays reserved, so kill(-pid) cannot reach another group. */
static bool leader_ended(pid_t pid)
{
    siginfo_t si;

    for (;;) {
        memset(&si, 0, sizeof si);
        if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0)
            return si.si_pid == pid;
        if (errno != EINTR)
            return true; /* ECHILD: gone already */
    }
}

static void group_kill(pid_t pid, int sig)
{
    if (kill(-pid, sig) != 0 && errno == ESRCH)
        kill(pid, sig); /* setpgid may not have happened yet */
}

static vp_status open_log(const vp_exec_config *cfg, const char *ext,
                          char *path, size_t n, int *fd, vp_error *err)
{
    int len = snprintf(path, n, "%s/%s.%s", cfg->log_dir, cfg->log_name,
                       ext);

    if (len < 0 || (size_t)len >= n)
        return vp_error_set(err, VP_EIO, "log file name too long");
    *fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (*fd < 0)
        return vp_error_set(err, VP_EIO, "cannot create '%s': %s", path,
                            strerror(errno));
    return VP_OK;
}

/* Pump the trial's output into its logs until the leader has ended and the
 * pipes are closed; on cancel or timeout, SIGTERM the group and SIGKILL it
 * after the grace period. */
static void supervise(pid_t pid, stream *sv, const vp_exec_config *cfg,
                      double t0, double *t_end, bool *timed_out,
                      bool *cancelled)
{
    double deadline = cfg->timeout_s > 0 ? t0 + cfg->timeout_s : 0;
    double term_at = 0, kill_at = 0;
    bool ended = false;

    for (;;) {
        double now = now_s(), wait = 0.05;

        if (!ended && leader_ended(pid)) {
            ended = true;
            *t_end = now;
            if (!pipes_open(sv, 2))
                break; /* strays that closed the pipes: the caller SIGKILLs */
            if (term_at == 0) {
                group_kill(pid, SIGTERM); /* strays holding the pipes */
                term_at = now;
            }
        }
        if (ended && !pipes_open(sv, 2))
            break;
        if (!ended && term_at == 0) {
            if (cfg->cancel != NULL && *cfg->cancel)
                *cancelled = true;
            else if (deadline > 0 && now >= deadline)
                *timed_out = true;
            if (*cancelled || *timed_out) {
                group_kill(pid, SIGTERM);
                term_at = now;
            }
        }
        if (term_at > 0 && kill_at == 0 && now >= term_at + cfg->grace_s) {
            group_kill(pid, SIGKILL);
            kill_at = now;
        }
        if (kill_at > 0 && ended && now >= kill_at + cfg->grace_s)
            break; /* pipes held by processes outside the group: give up */
        if (deadline > 0 && !ended && term_at == 0 && deadline - now < wait)
            wait = deadline - now;
        pump(sv, 2, wait > 0 ? wait : 0);
    }
}

/* The trial's outcome from its wait status; an OOM is decided later from
 * its log. */
static void set_outcome(vp_exec_result *out, const char *cmd, int status,
                        int exec_errno, bool cancelled, bool timed_out,
                        stream *err_log)
{
    if (WIFEXITED(status))
        out->exit_code = WEXITSTATUS(status);
    else if (WIFSIGNALED(status))
        out->term_signal = WTERMSIG(status);
    if (exec_errno != 0) {
        char msg[512];
        int len = snprintf(msg, sizeof msg, "vramplan: cannot run '%s': %s\n",
                           cmd, strerror(exec_errno));

        out->exec_failed = true;
        out->exec_errno = exec_errno;
        if (err_log->log_ok && len > 0)
            write_all(err_log->log, msg, (size_t)len < sizeof msg
                                             ? (size_t)len
                                             : sizeof msg - 1);
        out->outcome = VP_TRIAL_ERROR;
    } else if (cancelled) {
        out->outcome = VP_TRIAL_CANCELLED;
    } else if (timed_out) {
        out->outcome = VP_TRIAL_TIMEOUT;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        out->outcome = VP_TRIAL_OK;
    } else {
        out->outcome = VP_TRIAL_ERROR; /* decided below, once logged */
    }
}

vp_status vp_probe_exec(char *const *argv, const vp_exec_config *cfg,
                        vp_exec_result *out, vp_error *err)
{
    int out_p[2] = {-1, -1}, err_p[2] = {-1, -1}, rep[2] = {-1, -1};
    int devnull = -1, exec_errno = 0, status = 0;
    stream sv[2] = {{-1, -1, true}, {-1, -1, true}};
    double t0, t_end = 0;
    bool timed_out = false, cancelled = false;
    vp_status st;
    pid_t pid;

    memset(out, 0, sizeof *out);
    out->outcome = VP_TRIAL_ERROR;
    out->exit_code = -1;
    vp_error_clear(err);
    if (argv == NULL || argv[0] == NULL || argv[0][0] == '\0')
        return vp_error_set(err, VP_EARG, "no command to run");
    if (cfg->log_dir == NULL || cfg->log_name == NULL)
        return vp_error_set(err, VP_EARG, "no log directory");

    st = open_log(cfg, "out", out->out_path, sizeof out->out_path,
                  &sv[0].log, err);
    if (st == VP_OK)
        st = open_log(cfg, "err", out->err_path, sizeof out->err_path,
                      &sv[1].log, err);
    if (st != VP_OK)
        goto done;
    devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0 || cloexec_pipe(out_p) != 0 ||
        cloexec_pipe(err_p) != 0 || cloexec_pipe(rep) != 0) {
        st = vp_error_set(err, VP_EIO, "cannot create pipes: %s",
                          strerror(errno));
        goto done;
    }

    t0 = now_s();
    pid = fork();
    if (pid < 0) {
        st = vp_error_set(err, VP_EIO, "cannot fork: %s", strerror(errno));
        goto done;
    }
    if (pid == 0)
        child_exec(argv, devnull, out_p[1], err_p[1], rep[1]);
    setpgid(pid, pid); /* also here, so that no kill can miss the group */
    close_fd(&out_p[1]);
    close_fd(&err_p[1]);
    close_fd(&rep[1]);
    close_fd(&devnull);
    sv[0].fd = out_p[0];
    sv[1].fd = err_p[0];
    out_p[0] = err_p[0] = -1;

    /* exec's outcome: EOF (it ran) or the child's errno */
    for (;;) {
        ssize_t got = read(rep[0], &exec_errno, sizeof exec_errno);

        if (got < 0 && errno == EINTR)
            continue;
        if (got != (ssize_t)sizeof exec_errno)
            exec_errno = 0;
        break;
    }
    close_fd(&rep[0]);

    supervise(pid, sv, cfg, t0, &t_end, &timed_out, &cancelled);
    /* the leader is still unreaped, so its group id is still its own */
    group_kill(pid, SIGKILL);
    for (;;) {
        if (waitpid(pid, &status, 0) == pid)
            break;
        if (errno != EINTR) {
            st = vp_error_set(err, VP_EIO, "lost the trial's process "
                              "(%s; is SIGCHLD ignored?)", strerror(errno));
            goto done;
        }
    }
    if (t_end == 0)
        t_end = now_s();

    out->seconds = t_end - t0;
    set_outcome(out, argv[0], status, exec_errno, cancelled, timed_out,
                &sv[1]);
    if (!sv[0].log_ok || !sv[1].log_ok) {
        st = vp_error_set(err, VP_EIO, "cannot write the trial's output "
                          "to %s", cfg->log_dir);
    }

done:
    close_fd(&sv[0].fd);
    close_fd(&sv[1].fd);
    if (sv[0].log >= 0 && close(sv[0].log) != 0 && st == VP_OK)
        st = vp_error_set(err, VP_EIO, "cannot write '%s'", out->out_path);
    if (sv[1].log >= 0 && close(sv[1].log) != 0 && st == VP_OK)
        st = vp_error_set(err, VP_EIO, "cannot write '%s'", out->err_path);
    close_fd(&out_p[0]);
    close_fd(&out_p[1]);
    close_fd(&err_p[0]);
    close_fd(&err_p[1]);
    close_fd(&rep[0]);
    close_fd(&rep[1]);
    close_fd(&devnull);
    if (st == VP_OK && out->outcome == VP_TRIAL_ERROR && !out->exec_failed &&
        !cancelled && !timed_out && vp_probe_oom_file(out->err_path))
        out->outcome = VP_TRIAL_OOM;
    return st;
}
