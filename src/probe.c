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
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "probe_impl.h"
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

void vp__oom_scan_init(vp__oom_scan *s)
{
    s->len = 0;
    s->found = false;
}

/* Scan the complete lines of what came; keep the last partial line (a
 * line longer than SCAN_LINE_MAX: scanned, its last SCAN_OVERLAP bytes
 * kept). */
void vp__oom_scan_feed(vp__oom_scan *s, const char *p, size_t n)
{
    while (n > 0 && !s->found) {
        size_t take = sizeof s->buf - s->len, len, start;

        if (take > n)
            take = n;
        memcpy(s->buf + s->len, p, take);
        p += take;
        n -= take;
        len = s->len + take;
        start = len;
        while (start > 0 && s->buf[start - 1] != '\n' &&
               s->buf[start - 1] != '\r')
            start--;
        if (start == 0 && len > SCAN_LINE_MAX) {
            s->found = vp_probe_oom_text(s->buf, len);
            memmove(s->buf, s->buf + len - SCAN_OVERLAP, SCAN_OVERLAP);
            s->len = SCAN_OVERLAP;
        } else {
            s->found = vp_probe_oom_text(s->buf, start);
            memmove(s->buf, s->buf + start, len - start);
            s->len = len - start;
        }
    }
}

bool vp__oom_scan_end(vp__oom_scan *s)
{
    if (!s->found)
        s->found = vp_probe_oom_text(s->buf, s->len);
    s->len = 0;
    return s->found;
}

bool vp_probe_oom_file(const char *path)
{
    vp__oom_scan *s;
    char buf[65536];
    bool found = false;
    int fd;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    s = malloc(sizeof *s);
    if (s == NULL) {
        close(fd);
        return false;
    }
    vp__oom_scan_init(s);
    for (;;) {
        ssize_t got = read(fd, buf, sizeof buf);

        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break;
        vp__oom_scan_feed(s, buf, (size_t)got);
        if (s->found)
            break;
    }
    found = vp__oom_scan_end(s);
    free(s);
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

/* The keeper, between fork and its end: only async-signal-safe calls. A
 * child subreaper in its own process group that runs the command (in a
 * process group of its own too), reaps every process the command leaves
 * to it, sends the command's wait status on stat_w and ends when it has
 * no child left. Signals from a terminal or from the command's group do
 * not end it; the caller ends the processes below it (probe_tree.c). */
static _Noreturn void keeper(char *const *argv, int devnull, int out_w,
                             int err_w, int report_w, int stat_w)
{
    static const int ignored[] = {SIGINT, SIGQUIT, SIGHUP, SIGTERM, SIGPIPE,
                                  SIGTSTP, SIGTTIN, SIGTTOU};
    struct sigaction sa;
    pid_t c, w;
    int st, e;

    setpgid(0, 0);
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = SIG_IGN;
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        sigaction(ignored[i], &sa, NULL);
    sa.sa_handler = SIG_DFL; /* SIGCHLD ignored would reap them unseen */
    sigaction(SIGCHLD, &sa, NULL);
    if (prctl(PR_SET_CHILD_SUBREAPER, 1UL, 0UL, 0UL, 0UL) != 0) {
        e = errno;
        while (write(report_w, &e, sizeof e) < 0 && errno == EINTR)
            ;
        _exit(127);
    }
    c = fork();
    if (c == 0)
        child_exec(argv, devnull, out_w, err_w, report_w);
    if (c < 0) {
        e = errno;
        while (write(report_w, &e, sizeof e) < 0 && errno == EINTR)
            ;
        _exit(127);
    }
    /* the command's pid (its process group) before exec's report ends */
    while (write(stat_w, &c, sizeof c) < 0 && errno == EINTR)
        ;
    close(devnull);
    close(out_w);
    close(err_w);
    close(report_w);
    for (;;) {
        w = waitpid(-1, &st, 0);
        if (w == c) {
            while (write(stat_w, &st, sizeof st) < 0 && errno == EINTR)
                ;
        } else if (w < 0 && errno != EINTR) {
            _exit(0); /* ECHILD: nothing is left below */
        }
    }
}

typedef struct stream {
    int fd;             /* read end of the pipe, -1 once at EOF       */
    int log;            /* log file                                   */
    bool log_ok;
    uint64_t head;      /* bytes written to the log's head            */
    uint64_t total;     /* bytes the command wrote                    */
    char *tail;         /* ring of the last VP_PROBE_LOG_TAIL bytes
                           past the head                              */
    size_t tail_at;     /* where the ring's next byte goes            */
    vp__oom_scan *scan; /* stderr: every byte is scanned              */
} stream;

static void log_write(stream *s, const char *p, size_t n)
{
    if (s->log_ok && n > 0 && !write_all(s->log, p, n))
        s->log_ok = false;
}

/* n more bytes of the command's output: all to the OOM scan; the first
 * VP_PROBE_LOG_HEAD to the log, the rest through the ring. */
static void keep(stream *s, const char *p, size_t n)
{
    size_t k;

    s->total += n;
    if (s->scan != NULL)
        vp__oom_scan_feed(s->scan, p, n);
    if (s->head < VP_PROBE_LOG_HEAD) {
        k = VP_PROBE_LOG_HEAD - s->head < n
                ? (size_t)(VP_PROBE_LOG_HEAD - s->head)
                : n;
        log_write(s, p, k);
        s->head += k;
        p += k;
        n -= k;
    }
    if (n >= VP_PROBE_LOG_TAIL) {
        memcpy(s->tail, p + n - VP_PROBE_LOG_TAIL, VP_PROBE_LOG_TAIL);
        s->tail_at = 0;
        return;
    }
    k = VP_PROBE_LOG_TAIL - s->tail_at < n ? VP_PROBE_LOG_TAIL - s->tail_at
                                            : n;
    memcpy(s->tail + s->tail_at, p, k);
    memcpy(s->tail, p + k, n - k);
    s->tail_at = (s->tail_at + n) % VP_PROBE_LOG_TAIL;
}

/* The ring after the head, with a line saying how much was cut between. */
static void keep_end(stream *s)
{
    uint64_t past = s->total - s->head;
    char note[200];
    int len;

    if (past < VP_PROBE_LOG_TAIL) {
        log_write(s, s->tail, (size_t)past);
        return;
    }
    if (past > VP_PROBE_LOG_TAIL) {
        len = snprintf(note, sizeof note,
                       "\n[vramplan: %" PRIu64 " bytes cut here; the log "
                       "keeps the first %u and the last %u of %" PRIu64
                       " bytes]\n",
                       past - VP_PROBE_LOG_TAIL, (unsigned)VP_PROBE_LOG_HEAD,
                       (unsigned)VP_PROBE_LOG_TAIL, s->total);
        log_write(s, note, (size_t)len);
    }
    log_write(s, s->tail + s->tail_at, VP_PROBE_LOG_TAIL - s->tail_at);
    log_write(s, s->tail, s->tail_at);
}

/* Move what is ready on the pipes into the logs; wait at most `wait`
 * seconds for something to happen there or on wake_fd (not read). */
static void pump(stream *sv, int n, int wake_fd, double wait)
{
    struct pollfd pf[3];
    int np = 0, map[3];
    char buf[65536];

    for (int i = 0; i < n; i++)
        if (sv[i].fd >= 0) {
            pf[np].fd = sv[i].fd;
            pf[np].events = POLLIN;
            pf[np].revents = 0;
            map[np++] = i;
        }
    if (wake_fd >= 0) {
        pf[np].fd = wake_fd;
        pf[np].events = POLLIN;
        pf[np].revents = 0;
        map[np++] = -1;
    }
    if (np == 0) {
        sleep_s(wait < 0.01 ? wait : 0.01); /* only the exits to wait for */
        return;
    }
    if (poll(pf, (nfds_t)np, (int)(wait * 1000.0 + 0.5)) <= 0)
        return; /* timeout, or EINTR: the caller looks again */
    for (int k = 0; k < np; k++) {
        stream *s;
        ssize_t got;

        if (map[k] < 0 || !(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        s = &sv[map[k]];
        got = read(s->fd, buf, sizeof buf);
        if (got < 0 && (errno == EINTR || errno == EAGAIN))
            continue;
        if (got <= 0) {
            close_fd(&s->fd);
            continue;
        }
        keep(s, buf, (size_t)got);
    }
}

static bool pipes_open(const stream *sv, int n)
{
    for (int i = 0; i < n; i++)
        if (sv[i].fd >= 0)
            return true;
    return false;
}

/* Whether pid has ended, without reaping it. */
static bool has_ended(pid_t pid)
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

/* The command's wait status from the keeper, if it has come (the pipe is
 * closed then); EOF without one: the keeper ended first. */
static bool command_ended(int *stat_fd, int *status, bool *have)
{
    ssize_t got;

    if (*stat_fd < 0)
        return true;
    got = read(*stat_fd, status, sizeof *status);
    if (got < 0 && (errno == EINTR || errno == EAGAIN))
        return false;
    *have = got == (ssize_t)sizeof *status;
    close_fd(stat_fd);
    return true;
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

typedef struct trial_run {
    pid_t keeper;
    pid_t command;   /* its process group, 0 if unknown      */
    int stat_fd;     /* its pid, then its wait status        */
    int status;      /* the command's, else the keeper's     */
    bool have_status;
    double t_end;
    bool timed_out, cancelled;
} trial_run;

/* The command's pid, the first word on the keeper's pipe: it comes at
 * once after the fork (or the pipe closes: the keeper could not fork). */
static void command_pid(trial_run *t)
{
    struct pollfd pf = {t->stat_fd, POLLIN, 0};
    ssize_t got;

    t->command = 0;
    while (poll(&pf, 1, -1) < 0 && errno == EINTR)
        ;
    do
        got = read(t->stat_fd, &t->command, sizeof t->command);
    while (got < 0 && errno == EINTR);
    if (got != (ssize_t)sizeof t->command)
        t->command = 0;
}

/* sig to every process below the keeper; while the command runs, to its
 * process group too, which catches at once a child it is forking as the
 * scan of /proc passes (its pid stays its group's until it is reaped, and
 * the status comes as it is reaped). */
static void signal_trial(const trial_run *t, bool ended, int sig)
{
    if (!ended && t->command > 0)
        kill(-t->command, sig);
    vp__proc_tree_signal(t->keeper, sig);
}

/* Pump the trial's output into its logs until the command has ended, the
 * pipes are closed and nothing is left below the keeper. On cancel or
 * timeout every process below the keeper gets SIGTERM, and SIGKILL from
 * the grace period on; when the command ends, so do the processes it left
 * behind. */
static void supervise(trial_run *t, stream *sv, const vp_exec_config *cfg,
                      double t0)
{
    double deadline = cfg->timeout_s > 0 ? t0 + cfg->timeout_s : 0;
    double term_at = 0, kill_at = 0;
    bool ended = false;

    for (;;) {
        double now = now_s(), wait = 0.05;

        if (!ended && command_ended(&t->stat_fd, &t->status,
                                    &t->have_status)) {
            ended = true;
            t->t_end = now;
            if (term_at == 0) {
                signal_trial(t, true, SIGTERM); /* strays */
                term_at = now;
            }
        }
        if (ended && !pipes_open(sv, 2) && has_ended(t->keeper))
            break;
        if (!ended && term_at == 0) {
            if (cfg->cancel != NULL && *cfg->cancel)
                t->cancelled = true;
            else if (deadline > 0 && now >= deadline)
                t->timed_out = true;
            if (t->cancelled || t->timed_out) {
                signal_trial(t, false, SIGTERM);
                term_at = now;
            }
        }
        if (term_at > 0 && now >= term_at + cfg->grace_s) {
            signal_trial(t, ended, SIGKILL); /* and new ones */
            if (kill_at == 0)
                kill_at = now;
        }
        if (kill_at > 0 && ended && now >= kill_at + cfg->grace_s)
            break; /* pipes held by processes outside the tree: give up */
        if (deadline > 0 && !ended && term_at == 0 && deadline - now < wait)
            wait = deadline - now;
        pump(sv, 2, t->stat_fd, wait > 0 ? wait : 0);
    }
}

/* Nothing left below the keeper, then the keeper reaped; VP_EIO if it
 * was lost. */
static vp_status end_keeper(trial_run *t, vp_error *err)
{
    int kst;

    while (!has_ended(t->keeper)) {
        vp__proc_tree_signal(t->keeper, SIGKILL);
        sleep_s(0.005);
    }
    for (;;) {
        if (waitpid(t->keeper, &kst, 0) == t->keeper)
            break;
        if (errno != EINTR)
            return vp_error_set(err, VP_EIO, "lost the trial's process "
                                "(%s; is SIGCHLD ignored?)", strerror(errno));
    }
    if (!t->have_status)
        t->status = kst;
    return VP_OK;
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
        if (len > 0)
            keep(err_log, msg, (size_t)len < sizeof msg ? (size_t)len
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

/* The pipes and the ring and scan buffers of one trial. */
typedef struct trial_fds {
    int out_p[2], err_p[2], rep[2], stat[2], devnull;
} trial_fds;

static vp_status open_fds(trial_fds *f, stream *sv, vp_error *err)
{
    f->devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (f->devnull < 0 || cloexec_pipe(f->out_p) != 0 ||
        cloexec_pipe(f->err_p) != 0 || cloexec_pipe(f->rep) != 0 ||
        cloexec_pipe(f->stat) != 0 ||
        fcntl(f->stat[0], F_SETFL, O_NONBLOCK) != 0)
        return vp_error_set(err, VP_EIO, "cannot create pipes: %s",
                            strerror(errno));
    sv[0].tail = malloc(VP_PROBE_LOG_TAIL);
    sv[1].tail = malloc(VP_PROBE_LOG_TAIL);
    sv[1].scan = malloc(sizeof *sv[1].scan);
    if (sv[0].tail == NULL || sv[1].tail == NULL || sv[1].scan == NULL)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    vp__oom_scan_init(sv[1].scan);
    return VP_OK;
}

static void close_fds(trial_fds *f, stream *sv)
{
    for (int i = 0; i < 2; i++) {
        close_fd(&f->out_p[i]);
        close_fd(&f->err_p[i]);
        close_fd(&f->rep[i]);
        close_fd(&f->stat[i]);
        close_fd(&sv[i].fd);
        free(sv[i].tail);
        free(sv[i].scan);
    }
    close_fd(&f->devnull);
}

/* exec's outcome: EOF (the command runs) or the child's errno. */
static int exec_outcome(int *fd)
{
    int e = 0;

    for (;;) {
        ssize_t got = read(*fd, &e, sizeof e);

        if (got < 0 && errno == EINTR)
            continue;
        if (got != (ssize_t)sizeof e)
            e = 0;
        break;
    }
    close_fd(fd);
    return e;
}

vp_status vp_probe_exec(char *const *argv, const vp_exec_config *cfg,
                        vp_exec_result *out, vp_error *err)
{
    trial_fds f = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}, -1};
    stream sv[2] = {{-1, -1, true, 0, 0, NULL, 0, NULL},
                    {-1, -1, true, 0, 0, NULL, 0, NULL}};
    trial_run t;
    int exec_errno = 0;
    bool oom = false;
    double t0;
    vp_status st;

    memset(out, 0, sizeof *out);
    memset(&t, 0, sizeof t);
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
    if (st == VP_OK)
        st = open_fds(&f, sv, err);
    if (st != VP_OK)
        goto done;

    t0 = now_s();
    t.keeper = fork();
    if (t.keeper < 0) {
        st = vp_error_set(err, VP_EIO, "cannot fork: %s", strerror(errno));
        goto done;
    }
    if (t.keeper == 0)
        keeper(argv, f.devnull, f.out_p[1], f.err_p[1], f.rep[1],
               f.stat[1]);
    setpgid(t.keeper, t.keeper); /* also here: no signal can miss it */
    close_fd(&f.out_p[1]);
    close_fd(&f.err_p[1]);
    close_fd(&f.rep[1]);
    close_fd(&f.stat[1]);
    close_fd(&f.devnull);
    sv[0].fd = f.out_p[0];
    sv[1].fd = f.err_p[0];
    f.out_p[0] = f.err_p[0] = -1;
    t.stat_fd = f.stat[0];
    f.stat[0] = -1;
    exec_errno = exec_outcome(&f.rep[0]);
    command_pid(&t);

    supervise(&t, sv, cfg, t0);
    close_fd(&t.stat_fd);
    st = end_keeper(&t, err);
    if (st != VP_OK)
        goto done;
    if (t.t_end == 0)
        t.t_end = now_s();
    out->seconds = t.t_end - t0;
    set_outcome(out, argv[0], t.status, exec_errno, t.cancelled,
                t.timed_out, &sv[1]);
    oom = vp__oom_scan_end(sv[1].scan);
    keep_end(&sv[0]);
    keep_end(&sv[1]);
    if (!sv[0].log_ok || !sv[1].log_ok)
        st = vp_error_set(err, VP_EIO, "cannot write the trial's output "
                          "to %s", cfg->log_dir);

done:
    if (sv[0].log >= 0 && close(sv[0].log) != 0 && st == VP_OK)
        st = vp_error_set(err, VP_EIO, "cannot write '%s'", out->out_path);
    if (sv[1].log >= 0 && close(sv[1].log) != 0 && st == VP_OK)
        st = vp_error_set(err, VP_EIO, "cannot write '%s'", out->err_path);
    close_fds(&f, sv);
    if (st == VP_OK && out->outcome == VP_TRIAL_ERROR && !out->exec_failed &&
        !t.cancelled && !t.timed_out && oom)
        out->outcome = VP_TRIAL_OOM;
    return st;
}
