/* Following a training job's GPU memory (watch.h).
 *
 * NVML (nvml.h, API version 12) is loaded with dlopen: nvmlInit_v2,
 * nvmlShutdown, nvmlErrorString, nvmlDeviceGetCount_v2,
 * nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetName and
 * nvmlDeviceGetMemoryInfo (nvmlMemory_t: total, free, used in bytes).
 *
 * The job runs in its own process group, its output through two pipes; one
 * poll loop forwards the output, reads the step numbers from it and wakes
 * up for every sample. */
#define _POSIX_C_SOURCE 200809L
#include "vramplan/watch.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

/* ---- NVML ------------------------------------------------------------------ */

typedef int nvml_ret;
typedef struct nvml_memory {
    unsigned long long total, free, used;
} nvml_memory;

struct vp_nvml {
    void *lib;
    unsigned count;
    nvml_ret (*shutdown)(void);
    const char *(*error_string)(nvml_ret);
    nvml_ret (*handle)(unsigned, void **);
    nvml_ret (*name)(void *, char *, unsigned);
    nvml_ret (*memory)(void *, nvml_memory *);
};

static const char *nvml_msg(const vp_nvml *n, nvml_ret r)
{
    const char *s = n->error_string ? n->error_string(r) : NULL;
    return s ? s : "unknown NVML error";
}

/* dlsym into a function pointer (POSIX allows the conversion). */
static bool sym(void *lib, const char *name, void *fp)
{
    void *p = dlsym(lib, name);
    memcpy(fp, &p, sizeof p);
    return p != NULL;
}

vp_nvml *vp_nvml_open(const char *path, vp_error *err)
{
    const char *env = getenv("VRAMPLAN_NVML_LIB");
    if (!path)
        path = env && *env ? env : "libnvidia-ml.so.1";
    vp_nvml *n = calloc(1, sizeof *n);
    if (!n) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        return NULL;
    }
    n->lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!n->lib) {
        const char *why = dlerror();
        vp_error_set(err, VP_EIO,
                     "cannot load NVML (%s): %s; is the NVIDIA driver "
                     "installed? (VRAMPLAN_NVML_LIB names another file)",
                     path, why ? why : "not found");
        free(n);
        return NULL;
    }
    nvml_ret (*init)(void) = NULL;
    nvml_ret (*count)(unsigned *) = NULL;
    if (!sym(n->lib, "nvmlInit_v2", &init) ||
        !sym(n->lib, "nvmlShutdown", &n->shutdown) ||
        !sym(n->lib, "nvmlErrorString", &n->error_string) ||
        !sym(n->lib, "nvmlDeviceGetCount_v2", &count) ||
        !sym(n->lib, "nvmlDeviceGetHandleByIndex_v2", &n->handle) ||
        !sym(n->lib, "nvmlDeviceGetName", &n->name) ||
        !sym(n->lib, "nvmlDeviceGetMemoryInfo", &n->memory)) {
        vp_error_set(err, VP_EIO, "%s lacks an NVML function", path);
        goto fail;
    }
    nvml_ret r = init();
    if (r != 0) {
        vp_error_set(err, VP_EIO, "nvmlInit failed: %s", nvml_msg(n, r));
        goto fail;
    }
    if ((r = count(&n->count)) != 0) {
        vp_error_set(err, VP_EIO, "nvmlDeviceGetCount failed: %s",
                     nvml_msg(n, r));
        n->shutdown();
        goto fail;
    }
    return n;
fail:
    dlclose(n->lib);
    free(n);
    return NULL;
}

void vp_nvml_close(vp_nvml *n)
{
    if (!n)
        return;
    n->shutdown();
    dlclose(n->lib);
    free(n);
}

unsigned vp_nvml_count(const vp_nvml *n)
{
    return n ? n->count : 0;
}

static vp_status device(vp_nvml *n, unsigned index, void **dev,
                        vp_error *err)
{
    if (!n || index >= n->count)
        return vp_error_set(err, VP_EARG, "no GPU %u (NVML sees %u)", index,
                            n ? n->count : 0);
    nvml_ret r = n->handle(index, dev);
    if (r != 0)
        return vp_error_set(err, VP_EIO, "GPU %u: %s", index, nvml_msg(n, r));
    return VP_OK;
}

vp_status vp_nvml_memory(vp_nvml *n, unsigned index, uint64_t *used,
                         uint64_t *total, vp_error *err)
{
    void *dev;
    nvml_memory m;
    vp_status st = device(n, index, &dev, err);
    if (st != VP_OK)
        return st;
    nvml_ret r = n->memory(dev, &m);
    if (r != 0)
        return vp_error_set(err, VP_EIO, "GPU %u memory: %s", index,
                            nvml_msg(n, r));
    *used = m.used;
    *total = m.total;
    return VP_OK;
}

vp_status vp_nvml_name(vp_nvml *n, unsigned index, char *buf, size_t size,
                       vp_error *err)
{
    void *dev;
    vp_status st = device(n, index, &dev, err);
    if (st != VP_OK)
        return st;
    nvml_ret r = n->name(dev, buf, size > 4096 ? 4096 : (unsigned)size);
    if (r != 0)
        return vp_error_set(err, VP_EIO, "GPU %u name: %s", index,
                            nvml_msg(n, r));
    return VP_OK;
}

/* ---- configuration ----------------------------------------------------------- */

void vp_watch_config_init(vp_watch_config *c)
{
    memset(c, 0, sizeof *c);
    c->alert_ppm = 900000;
    c->interval_s = 0.025;
    c->grace_s = 5.0;
    c->step_pattern = "[Ss]tep[ :=#]*([0-9]+)";
}

uint64_t vp_watch_predicted(const vp_watch_config *c, uint32_t step)
{
    if (!c || c->n_predicted == 0)
        return 0;
    uint32_t n = c->n_predicted > VP_WATCH_MAX_STEPS ? VP_WATCH_MAX_STEPS
                                                     : c->n_predicted;
    if (step == 0) { /* unknown: the largest */
        uint64_t m = 0;
        for (uint32_t i = 0; i < n; i++)
            if (c->predicted[i] > m)
                m = c->predicted[i];
        return m;
    }
    return c->predicted[(step < n ? step : n) - 1];
}


/* ---- the loop ------------------------------------------------------------------ */

typedef struct loop {
    const vp_watch_config *cfg;
    vp_nvml *nvml;
    vp_watch_event_fn fn;
    void *ud;
    vp_watch_result *out;
    vp_error *err;
    struct timespec t0;
    pid_t pid;
    regex_t re;
    bool have_re;
    char line[2][4096]; /* a partial output line per stream */
    size_t line_len[2];
    bool alerting[VP_WATCH_MAX_GPUS];
    double last_kept[VP_WATCH_MAX_GPUS];
    uint64_t last_used[VP_WATCH_MAX_GPUS];
    double last_peak_report[VP_WATCH_MAX_GPUS];
} loop;

static double now_s(const loop *L)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - L->t0.tv_sec) +
           (double)(t.tv_nsec - L->t0.tv_nsec) / 1e9;
}

static void emit(loop *L, vp_watch_kind kind, unsigned g, double t,
                 uint64_t used)
{
    if (!L->fn)
        return;
    const vp_watch_gpu *gp = &L->out->gpu[g];
    vp_watch_event ev = {kind, gp->index, t, used, gp->budget,
                         vp_watch_predicted(L->cfg, L->out->last_step),
                         L->out->last_step, 0, NULL, 0};
    L->fn(&ev, L->ud);
}

/* Keep a sample when it differs from the last kept or a second passed. */
static bool keep(loop *L, unsigned g, double t, uint64_t used)
{
    if (L->out->n_trace && used == L->last_used[g] &&
        t - L->last_kept[g] < 1.0)
        return true;
    vp_watch_result *r = L->out;
    if (!vp__grow((void **)&r->trace, &r->cap_trace, r->n_trace + 1,
                  sizeof *r->trace)) {
        vp_error_set(L->err, VP_ENOMEM, "out of memory keeping samples");
        return false;
    }
    r->trace[r->n_trace++] =
        (vp_watch_sample){t, used, r->last_step, (uint16_t)g};
    L->last_kept[g] = t;
    L->last_used[g] = used;
    return true;
}

/* One NVML query per GPU. Returns VP_OK, or an error; *kill is set when a
 * GPU reached the kill threshold. */
static vp_status sample(loop *L, bool *kill)
{
    vp_watch_result *r = L->out;
    double t = now_s(L);
    r->samples++;
    for (unsigned g = 0; g < r->n_gpus; g++) {
        vp_watch_gpu *gp = &r->gpu[g];
        uint64_t used, total;
        vp_status st = vp_nvml_memory(L->nvml, gp->index, &used, &total,
                                      L->err);
        if (st != VP_OK)
            return st;
        used = used > gp->before ? used - gp->before : 0;
        if (!keep(L, g, t, used))
            return VP_ENOMEM;
        if (used > gp->peak) {
            gp->peak = used;
            gp->peak_t = t;
            gp->peak_step = r->last_step;
            if (t - L->last_peak_report[g] >= 1.0) {
                L->last_peak_report[g] = t;
                emit(L, VP_WATCH_SAMPLE, g, t, used);
            }
        }
        uint64_t alert = vp__share_ppm(gp->budget, L->cfg->alert_ppm);
        if (!L->alerting[g] && used >= alert) {
            L->alerting[g] = true;
            gp->alerts++;
            emit(L, VP_WATCH_ALERT, g, t, used);
        } else if (L->alerting[g] && used < alert) {
            L->alerting[g] = false;
            emit(L, VP_WATCH_CLEAR, g, t, used);
        }
        if (L->cfg->kill_ppm && !*kill &&
            used >= vp__share_ppm(gp->budget, L->cfg->kill_ppm)) {
            *kill = true;
            r->killed = true;
            r->killed_gpu = gp->index;
            emit(L, VP_WATCH_KILL, g, t, used);
        }
    }
    return VP_OK;
}

/* A complete output line: the step it names, if any. */
static void scan_line(loop *L, const char *s)
{
    regmatch_t m[2];
    if (!L->have_re || regexec(&L->re, s, 2, m, 0) != 0 || m[1].rm_so < 0)
        return;
    uint64_t v = 0;
    for (regoff_t i = m[1].rm_so; i < m[1].rm_eo && v < UINT32_MAX; i++)
        v = v * 10 + (uint64_t)(s[i] - '0');
    if (v > 0 && v <= UINT32_MAX)
        L->out->last_step = (uint32_t)v;
}

static void output(loop *L, int which, const char *data, size_t len)
{
    if (L->fn) {
        vp_watch_event ev = {VP_WATCH_OUTPUT, 0, now_s(L), 0, 0, 0,
                             L->out->last_step, which + 1, data, len};
        L->fn(&ev, L->ud);
    }
    char *line = L->line[which];
    size_t *n = &L->line_len[which];
    for (size_t i = 0; i < len; i++) {
        if (data[i] == '\n' || data[i] == '\r' || *n == sizeof L->line[0] - 1) {
            line[*n] = '\0';
            scan_line(L, line);
            *n = 0;
            if (data[i] == '\n' || data[i] == '\r')
                continue;
        }
        line[(*n)++] = data[i];
    }
}

/* ---- the job -------------------------------------------------------------------- */

static void close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

/* Fork the job: own process group, stdin /dev/null, out and err to the
 * pipes. The exec status comes back through a close-on-exec pipe. */
static vp_status start(loop *L, char *const *argv, int out_fd[2],
                       int err_fd[2])
{
    int st_fd[2];
    if (pipe(st_fd) != 0)
        return vp_error_set(L->err, VP_EIO, "pipe: %s", strerror(errno));
    fcntl(st_fd[1], F_SETFD, FD_CLOEXEC);
    pid_t pid = fork();
    if (pid < 0) {
        close(st_fd[0]);
        close(st_fd[1]);
        return vp_error_set(L->err, VP_EIO, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        setpgid(0, 0);
        int in = open("/dev/null", O_RDONLY);
        if (in >= 0)
            dup2(in, 0);
        dup2(out_fd[1], 1);
        dup2(err_fd[1], 2);
        close(st_fd[0]);
        execvp(argv[0], argv);
        int e = errno;
        if (write(st_fd[1], &e, sizeof e) < 0)
            _exit(127);
        _exit(127);
    }
    setpgid(pid, pid); /* also here: no race with the first kill */
    L->pid = pid;
    close(st_fd[1]);
    int e;
    ssize_t n;
    do
        n = read(st_fd[0], &e, sizeof e);
    while (n < 0 && errno == EINTR);
    close(st_fd[0]);
    if (n == (ssize_t)sizeof e) {
        L->out->exec_failed = true;
        L->out->exec_errno = e;
    }
    return VP_OK;
}

static void stop_group(loop *L, double *term_at, double t)
{
    if (*term_at < 0) {
        kill(-L->pid, SIGTERM);
        *term_at = t;
    } else if (t - *term_at >= L->cfg->grace_s) {
        kill(-L->pid, SIGKILL);
    }
}

/* Wait for output or the next sample until the job exits and its output
 * is drained (at most 2 s after it exits: a process that left the group
 * may hold the pipes). */
static vp_status follow(loop *L, int out_fd, int err_fd)
{
    struct pollfd p[2] = {{out_fd, POLLIN, 0}, {err_fd, POLLIN, 0}};
    double next = 0, term_at = -1, exited_at = -1;
    bool kill_now = false;
    int status = 0;
    char buf[4096];
    for (;;) {
        /* the output first: a sample belongs to the last step printed
         * before it, also when this process wakes late for both */
        int ms = (int)((next - now_s(L)) * 1000.0) + 1;
        int n = poll(p, 2, ms > 0 ? ms : 0);
        if (n < 0 && errno != EINTR)
            return vp_error_set(L->err, VP_EIO, "poll: %s", strerror(errno));
        for (int i = 0; i < 2 && n > 0; i++) {
            if (p[i].fd < 0 || !(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t got = read(p[i].fd, buf, sizeof buf);
            if (got > 0)
                output(L, i, buf, (size_t)got);
            else if (got == 0 || errno != EINTR)
                close_fd(&p[i].fd);
        }
        double t = now_s(L);
        if (t >= next) {
            vp_status st = sample(L, &kill_now);
            if (st != VP_OK)
                return st;
            next = t + L->cfg->interval_s;
        }
        if (L->cfg->cancel && *L->cfg->cancel)
            L->out->cancelled = true;
        if (exited_at < 0 && (kill_now || L->out->cancelled))
            stop_group(L, &term_at, t);
        if (exited_at < 0 && waitpid(L->pid, &status, WNOHANG) == L->pid) {
            exited_at = t;
            L->out->seconds = t;
            kill(-L->pid, SIGKILL); /* what the job left in its group */
        }
        if (exited_at >= 0 && ((p[0].fd < 0 && p[1].fd < 0) ||
                               t - exited_at > 2.0))
            break;
    }
    close_fd(&p[0].fd);
    close_fd(&p[1].fd);
    L->out->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    L->out->term_signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    return VP_OK;
}

/* The GPUs to watch, what they hold before the job and their budgets. */
static vp_status setup_gpus(loop *L)
{
    const vp_watch_config *c = L->cfg;
    vp_watch_result *r = L->out;
    unsigned n = c->n_gpus ? c->n_gpus : vp_nvml_count(L->nvml);
    if (n == 0)
        return vp_error_set(L->err, VP_EARG, "NVML sees no GPU");
    if (n > VP_WATCH_MAX_GPUS)
        n = VP_WATCH_MAX_GPUS;
    for (unsigned g = 0; g < n; g++) {
        vp_watch_gpu *gp = &r->gpu[g];
        gp->index = c->n_gpus ? c->gpus[g] : g;
        vp_status st = vp_nvml_memory(L->nvml, gp->index, &gp->before,
                                      &gp->total, L->err);
        if (st == VP_OK)
            st = vp_nvml_name(L->nvml, gp->index, gp->name, sizeof gp->name,
                              L->err);
        if (st != VP_OK)
            return st;
        uint64_t room = gp->total > gp->before ? gp->total - gp->before : 0;
        gp->budget = c->budget ? c->budget : room;
    }
    r->n_gpus = n;
    return VP_OK;
}

vp_status vp_watch_run(char *const *argv, const vp_watch_config *cfg,
                       vp_nvml *nvml, vp_watch_event_fn on_event, void *ud,
                       vp_watch_result *out, vp_error *err)
{
    memset(out, 0, sizeof *out);
    if (!argv || !argv[0] || !cfg || !nvml)
        return vp_error_set(err, VP_EARG, "nothing to run");
    if (!(cfg->interval_s > 0.0 && cfg->interval_s <= 60.0) ||
        cfg->alert_ppm == 0 || cfg->alert_ppm > 1000000 ||
        cfg->kill_ppm > 1000000 || !(cfg->grace_s >= 0.0))
        return vp_error_set(err, VP_EARG,
                            "invalid watch settings (interval 0 to 60 s, "
                            "thresholds 0 to 100 %%)");
    loop L;
    memset(&L, 0, sizeof L);
    L.cfg = cfg;
    L.nvml = nvml;
    L.fn = on_event;
    L.ud = ud;
    L.out = out;
    L.err = err;
    if (cfg->step_pattern && *cfg->step_pattern) {
        if (regcomp(&L.re, cfg->step_pattern, REG_EXTENDED) != 0)
            return vp_error_set(err, VP_EARG, "invalid step pattern '%s'",
                                cfg->step_pattern);
        L.have_re = true;
    }
    int o[2] = {-1, -1}, e[2] = {-1, -1};
    vp_status st = setup_gpus(&L);
    if (st == VP_OK && (pipe(o) != 0 || pipe(e) != 0))
        st = vp_error_set(err, VP_EIO, "pipe: %s", strerror(errno));
    if (st == VP_OK) {
        clock_gettime(CLOCK_MONOTONIC, &L.t0);
        st = start(&L, argv, o, e);
    }
    close_fd(&o[1]);
    close_fd(&e[1]);
    if (st == VP_OK)
        st = follow(&L, o[0], e[0]);
    else {
        close_fd(&o[0]);
        close_fd(&e[0]);
    }
    if (st != VP_OK && L.pid > 0) { /* a harness failure: end the job */
        kill(-L.pid, SIGKILL);
        waitpid(L.pid, NULL, 0);
    }
    if (L.have_re)
        regfree(&L.re);
    return st;
}

void vp_watch_result_destroy(vp_watch_result *r)
{
    if (!r)
        return;
    free(r->trace);
    r->trace = NULL;
    r->n_trace = r->cap_trace = 0;
}

vp_status vp_watch_write_csv(const vp_watch_result *r,
                             const vp_watch_config *cfg, FILE *f,
                             vp_error *err)
{
    fputs("t_s,gpu,step,used,predicted,budget\n", f);
    for (size_t i = 0; i < r->n_trace; i++) {
        const vp_watch_sample *s = &r->trace[i];
        const vp_watch_gpu *g = &r->gpu[s->gpu];
        fprintf(f, "%.3f,%u,%" PRIu32 ",%" PRIu64 ",%" PRIu64 ",%" PRIu64
                   "\n",
                s->t, g->index, s->step, s->used,
                vp_watch_predicted(cfg, s->step), g->budget);
    }
    if (ferror(f))
        return vp_error_set(err, VP_EIO, "cannot write the samples");
    return VP_OK;
}
