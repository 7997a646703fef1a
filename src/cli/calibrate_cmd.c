/* vramplan calibrate: run calibrate/vp-calibrate (and a PyTorch probe),
 * fit its raw measurements and write a GPU profile. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "vramplan/gpu.h"
#include "vramplan/vramplan.h"

#define MAX_RAW_BYTES (16u << 20)

/* The PyTorch probe: the context as shared/groundtruth/collect.py measures
 * it, torch.matmul in bf16 at 8192^3 and Tensor.copy_ of 1 GiB, for the
 * comparison with vp-calibrate's own figures; each sample after a 50 ms
 * rest, as vp-calibrate times large GEMMs. argv[1] is the device. */
static const char TORCH_PROBE[] =
    "import json, sys, time\n"
    "try:\n"
    "    import torch\n"
    "    assert torch.cuda.is_available(), 'torch.cuda.is_available() is "
    "False'\n"
    "except Exception as e:\n"
    "    print(json.dumps({'kind': 'skip', 'what': 'torch', 'why': "
    "'no PyTorch with CUDA: %s' % e}))\n"
    "    sys.exit(0)\n"
    "dev = int(sys.argv[1])\n"
    "torch.cuda.set_device(dev)\n"
    "torch.ones(1, device='cuda') @ torch.ones(1, 1, device='cuda')\n"
    "free, total = torch.cuda.mem_get_info()\n"
    "ctx = total - free - torch.cuda.memory_reserved()\n"
    "def timed(fn, it):\n"
    "    torch.cuda.synchronize()\n"
    "    time.sleep(0.05)  # rest, as vp-calibrate does before a sample\n"
    "    fn()\n"
    "    s = torch.cuda.Event(enable_timing=True)\n"
    "    e = torch.cuda.Event(enable_timing=True)\n"
    "    s.record()\n"
    "    for _ in range(it):\n"
    "        fn()\n"
    "    e.record()\n"
    "    torch.cuda.synchronize()\n"
    "    return s.elapsed_time(e) / 1e3 / it\n"
    "n = 8192\n"
    "a = torch.randn(n, n, device='cuda', dtype=torch.bfloat16)\n"
    "b = torch.randn(n, n, device='cuda', dtype=torch.bfloat16)\n"
    "timed(lambda: torch.matmul(a, b), 3)\n"
    "mm = [2 * n ** 3 / timed(lambda: torch.matmul(a, b), 10) / 1e12 "
    "for _ in range(5)]\n"
    "del a, b\n"
    "x = torch.randn(2 ** 28, device='cuda')\n"
    "y = torch.empty_like(x)\n"
    "timed(lambda: y.copy_(x), 3)\n"
    "cp = [2 * x.numel() * 4 / timed(lambda: y.copy_(x), 10) / 1e9 "
    "for _ in range(5)]\n"
    "print(json.dumps({'kind': 'torch', 'version': torch.__version__, "
    "'device_name': torch.cuda.get_device_name(dev), "
    "'context_used_after_init': ctx, 'bf16_matmul_tflops': mm, "
    "'copy_gbps': cp}))\n";

static void calibrate_help(FILE *f)
{
    fputs(
        "Usage: vramplan calibrate [--out FILE] [--gpu PROFILE] [OPTIONS]\n"
        "\n"
        "Measure the GPU with calibrate/vp-calibrate (build it with `make\n"
        "calibrate`), run a small PyTorch probe, fit the measurements and\n"
        "write a GPU profile: the datasheet profile of this GPU (gpus/) with\n"
        "a `measured:` section (GEMM efficiency curves per data type,\n"
        "bandwidths, launch latency, cudaMalloc granularity, the largest\n"
        "allocation, CUDA context sizes, NCCL fits with two or more GPUs).\n"
        "A summary goes to stdout, or to stderr when the profile does.\n"
        "\n"
        "Options:\n"
        "  -o, --out FILE      write the profile to FILE (default: stdout)\n"
        "  -g, --gpu PROFILE   the profile to start from: a name of gpus/ or a\n"
        "                      file (default: the one whose device_names hold\n"
        "                      the measured device)\n"
        "  --raw FILE          also save the raw measurements (JSON lines)\n"
        "  --from-raw FILE     fit recorded raw measurements; run nothing\n"
        "  --bin PATH          the vp-calibrate program (default:\n"
        "                      $VRAMPLAN_CALIBRATE, then build/calibrate/\n"
        "                      next to this program or in the current\n"
        "                      directory, then vp-calibrate on the PATH)\n"
        "  --python PYTHON     the Python with PyTorch for the probe\n"
        "                      (default python3)\n"
        "  --no-torch          skip the PyTorch probe\n"
        "  --device N          the GPU to measure (default 0)\n"
        "  --quick             fewer shapes and smaller buffers (smoke test)\n"
        "  --sweep FILE        also fit a PyTorch kernel sweep (the JSON lines\n"
        "                      of scripts/h200_sweeps.py): GEMM curves through\n"
        "                      torch, attention, memory-bound kernels, the\n"
        "                      optimizer step and the eager dispatch cost\n"
        "  -h, --help          show this help\n"
        "\n"
        "\n",
        f);
    cli_exit_help(f);
}

typedef struct {
    char *data;
    size_t len, cap;
} buffer;

static int buf_add(buffer *b, const char *p, size_t n)
{
    if (b->len + n + 1 > MAX_RAW_BYTES)
        return -1;
    if (b->len + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 65536;
        while (nc < b->len + n + 1)
            nc *= 2;
        char *g = realloc(b->data, nc);
        if (!g)
            return -1;
        b->data = g;
        b->cap = nc;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
    return 0;
}

/* Run argv, appending its stdout to *out (stderr passes through).
 * Returns its exit status, 127 when it could not start, -1 on our own
 * failure (message printed). */
static int run_capture(char *const argv[], buffer *out)
{
    int fds[2];
    if (pipe(fds) != 0) {
        cli_fail("pipe: %s", strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        cli_fail("fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        if (dup2(fds[1], STDOUT_FILENO) < 0)
            _exit(127);
        close(fds[1]);
        execvp(argv[0], argv);
        cli_fail("cannot run %s: %s", argv[0],
                strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    char chunk[65536];
    ssize_t n;
    int rc = 0;
    for (;;) {
        n = read(fds[0], chunk, sizeof chunk);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (rc == 0 && buf_add(out, chunk, (size_t)n) != 0) {
            cli_fail("%s wrote more than %u bytes",
                    argv[0], MAX_RAW_BYTES);
            rc = -1; /* keep reading so that the child can finish */
        }
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) {
            cli_fail("waitpid: %s",
                    strerror(errno));
            return -1;
        }
    if (rc < 0)
        return -1;
    if (WIFSIGNALED(status)) {
        cli_fail("%s was killed by signal %d",
                argv[0], WTERMSIG(status));
        return 128 + WTERMSIG(status);
    }
    return WEXITSTATUS(status);
}

static bool executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
           access(path, X_OK) == 0;
}

/* Where vp-calibrate is; "vp-calibrate" (the PATH) when nowhere else. */
static const char *find_calibrate(const char *given, char *buf, size_t n)
{
    if (given)
        return given;
    const char *env = getenv("VRAMPLAN_CALIBRATE");
    if (env && *env)
        return env;
    char self[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
    if (len > 0) {
        self[len] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            /* next to ./vramplan, then to build/san-X/vramplan */
            snprintf(buf, n, "%s/build/calibrate/vp-calibrate", self);
            if (executable(buf))
                return buf;
            snprintf(buf, n, "%s/../calibrate/vp-calibrate", self);
            if (executable(buf))
                return buf;
        }
    }
    snprintf(buf, n, "build/calibrate/vp-calibrate");
    if (executable(buf))
        return buf;
    return "vp-calibrate";
}

/* The file whole (a regular file: a FIFO or a device is refused rather
 * than waited on, docs/LIMITS.md). */
static char *read_all(const char *path, size_t *len)
{
    vp_error err;
    char *data;

    if (vp_file_read(path, MAX_RAW_BYTES, &data, len, &err) != VP_OK) {
        cli_fail("%s", err.msg);
        return NULL;
    }
    if (*len > MAX_RAW_BYTES) {
        cli_fail("'%s' is over %u bytes", path, MAX_RAW_BYTES);
        free(data);
        return NULL;
    }
    return data;
}

static int write_file(const char *path, const char *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        cli_fail("cannot write '%s': %s", path,
                strerror(errno));
        if (f)
            fclose(f);
        return 2;
    }
    return 0;
}

static double pct(double part, double whole)
{
    return whole > 0.0 ? 100.0 * part / whole : 0.0;
}

/* The measured-versus-datasheet summary. */
static void summary(FILE *f, const vp_gpu_profile *p, const vp_calib *c,
                    const vp_gpu_measured *m)
{
    fprintf(f, "calibration of %s (profile %s)\n", m->device_name[0]
                                                       ? m->device_name
                                                       : "?",
            vp_gpu_name(p));
    fprintf(f, "  %s\n\n", m->source);
    fputs("GEMM (cuBLASLt)  fit peak   half at     h    best   datasheet  "
          "best/sheet  fit rms\n",
          f);
    for (int t = 0; t < VP_GPU__DTYPES; t++) {
        const vp_gpu_gemm_fit *g = &m->gemm[t];
        if (!g->points)
            continue;
        double sheet = vp_gpu_peak_tflops(p, (vp_gpu_dtype)t);
        fprintf(f,
                "  %-6s %10.1f %7.2f GF %5.2f %7.1f %11.1f %10.1f%% %7.1f%%\n",
                vp_gpu_dtype_name((vp_gpu_dtype)t), g->peak_tflops,
                g->half_gflop, g->exponent, g->best_tflops, sheet,
                pct(g->best_tflops, sheet), 100.0 * g->rms_rel_err);
    }
    fputs("  (TFLOP/s; rate(W) = peak W^h / (W^h + half^h), W = 2mnk/1e9 "
          "GFLOP)\n",
          f);
    if (m->bf16_sustained_tflops.n)
        fprintf(f,
                "  bf16 8192^3 back to back for ~0.5 s: %.1f TFLOP/s median "
                "of %u windows (%.1f to %.1f)\n",
                m->bf16_sustained_tflops.median, m->bf16_sustained_tflops.n,
                m->bf16_sustained_tflops.min, m->bf16_sustained_tflops.max);
    fputc('\n', f);
    fputs("bandwidth            median       min       max  (GB/s)\n", f);
    for (int b = 0; b < VP_GPU__BWS; b++) {
        const vp_gpu_stat *s = &m->bw_gbps[b];
        if (!s->n)
            continue;
        fprintf(f, "  %-14s %10.1f %9.1f %9.1f", vp_gpu_bw_name((vp_gpu_bw)b),
                s->median, s->min, s->max);
        if (b == VP_GPU_BW_COPY)
            fprintf(f, "   %.1f%% of %.0f datasheet", pct(s->median,
                                                      vp_gpu_memory_gbps(p)),
                    vp_gpu_memory_gbps(p));
        fputc('\n', f);
    }
    if (m->launch_us.n)
        fprintf(f,
                "\nlaunch: %.2f us enqueue, %.2f us per kernel back to back, "
                "%.2f us launch+sync\n",
                m->launch_us.median, m->launch_gpu_us.median,
                m->launch_sync_us.median);
    fprintf(f,
            "memory: total %" PRIu64 " B, free %" PRIu64
            " B, largest cudaMalloc %" PRIu64 " B\n",
            m->total_bytes, m->free_bytes, m->max_alloc_bytes);
    fprintf(f,
            "cudaMalloc: addresses aligned to %" PRIu64
            " B, large allocations in %" PRIu64 " B steps\n",
            m->malloc_alignment_bytes, m->malloc_granularity_bytes);
    fprintf(f,
            "CUDA context (bare runtime): %" PRIu64 " B lazy, %" PRIu64
            " B eager\n",
            m->context_lazy_bytes, m->context_eager_bytes);
    if (m->context_bytes)
        fprintf(f, "CUDA context with PyTorch: %" PRIu64 " B\n",
                m->context_bytes);
    for (int o = 0; o < VP_GPU__COLLS; o++)
        if (m->nccl[o].points)
            fprintf(f, "nccl %s (%u ranks): %.1f us + bytes / %.1f GB/s\n",
                    vp_gpu_coll_name((vp_gpu_coll)o), m->nccl[o].ranks,
                    m->nccl[o].latency_us, m->nccl[o].bandwidth_gbps);
    if (m->torch_bf16_tflops.n) {
        const vp_calib_gemm_point *pts;
        size_t np = vp_calib_gemm_points(c, &pts);
        double ours = 0.0;
        for (size_t i = 0; i < np; i++)
            if (pts[i].dtype == VP_GPU_BF16 && pts[i].m == 8192 &&
                pts[i].n == 8192 && pts[i].k == 8192)
                ours = pts[i].median_tflops;
        fprintf(f,
                "\nPyTorch in the same run: torch.matmul bf16 8192^3 %.1f "
                "TFLOP/s (vp-calibrate %.1f, %.1f%%)",
                m->torch_bf16_tflops.median, ours,
                pct(ours, m->torch_bf16_tflops.median));
        if (m->torch_copy_gbps.n && m->bw_gbps[VP_GPU_BW_COPY].n)
            fprintf(f, "; copy_ %.1f GB/s (copy kernel %.1f%%)",
                    m->torch_copy_gbps.median,
                    pct(m->bw_gbps[VP_GPU_BW_COPY].median,
                        m->torch_copy_gbps.median));
        fputc('\n', f);
    }
    const char *const *skips;
    size_t ns = vp_calib_skips(c, &skips);
    for (size_t i = 0; i < ns; i++)
        fprintf(f, "skipped %s\n", skips[i]);
}

enum { O_OUT, O_GPU, O_RAW, O_FROM_RAW, O_BIN, O_PYTHON, O_SWEEP,
       O_NO_TORCH, O_DEVICE, O_QUICK };

#define STR(i, s, n, m) {.id = i, .short_name = s, .name = n, .metavar = m, \
                         .type = CLI_ARG_STRING}
static const cli_opt OPTS[] = {
    STR(O_OUT, 'o', "out", "FILE"), STR(O_GPU, 'g', "gpu", "PROFILE"),
    STR(O_RAW, 0, "raw", "FILE"), STR(O_FROM_RAW, 0, "from-raw", "FILE"),
    STR(O_BIN, 0, "bin", "PATH"), STR(O_PYTHON, 0, "python", "PYTHON"),
    STR(O_SWEEP, 0, "sweep", "FILE"),
    {.id = O_NO_TORCH, .name = "no-torch", .type = CLI_ARG_FLAG},
    {.id = O_DEVICE, .name = "device", .metavar = "N", .type = CLI_ARG_U64,
     .max = 63},
    {.id = O_QUICK, .name = "quick", .type = CLI_ARG_FLAG},
    CLI_HELP_ROW,
};

#define TEXT(o) (v[o].given ? v[o].text : NULL)

/* The kernel sweep's fits into m (scripts/h200_sweeps.py), or, without
 * one, those of the profile's earlier sweep. Returns -1, or the exit
 * status. */
static int fit_sweep(const char *path, const vp_gpu_measured *old,
                     vp_gpu_measured *m)
{
    vp_error err;
    size_t len;
    char *data;

    if (path == NULL) {
        if (old != NULL) {
            memcpy(m->attention, old->attention, sizeof m->attention);
            memcpy(m->membound, old->membound, sizeof m->membound);
            memcpy(m->optimizer, old->optimizer, sizeof m->optimizer);
            m->dispatch_us = old->dispatch_us;
        }
        return -1;
    }
    if ((data = read_all(path, &len)) == NULL)
        return CLI_USAGE;
    vp_sweep *w = vp_sweep_parse(data, len, path, &err);
    free(data);
    vp_status st = w != NULL ? vp_sweep_fit(w, m, &err) : err.code;
    vp_sweep_free(w);
    return st == VP_OK ? -1 : cli_report(&err, NULL);
}

/* Run vp-calibrate (and the PyTorch probe) into *b; *when the date.
 * Returns -1, or the exit status. */
static int measure(const cli_val *v, buffer *b, char *when, size_t n)
{
    const char *python = v[O_PYTHON].given ? v[O_PYTHON].text : "python3";
    char found[PATH_MAX + 64], dev[16];
    const char *prog = find_calibrate(TEXT(O_BIN), found, sizeof found);
    time_t t = time(NULL);
    struct tm tmv;

    snprintf(dev, sizeof dev, "%" PRIu64, v[O_DEVICE].u);
    char *cargv[] = {(char *)prog, "--device", dev,
                     v[O_QUICK].given ? "--quick" : NULL, NULL};
    if (gmtime_r(&t, &tmv))
        strftime(when, n, "%Y-%m-%d %H:%M UTC", &tmv);
    fprintf(stderr, "vramplan: running %s\n", prog);
    int rc = run_capture(cargv, b);
    if (rc != 0) {
        if (rc == 127)
            cli_fail("vp-calibrate not found or not runnable (build it with "
                     "`make calibrate`, or give --bin)");
        else if (rc > 0)
            cli_fail("%s failed (exit status %d)", prog, rc);
        if (v[O_RAW].given && b->data)
            write_file(v[O_RAW].text, b->data, b->len);
        return CLI_USAGE;
    }
    if (!v[O_NO_TORCH].given) {
        fprintf(stderr, "vramplan: running the PyTorch probe (%s)\n", python);
        char *pargv[] = {(char *)python, "-c", (char *)TORCH_PROBE, dev,
                         NULL};
        size_t before = b->len;
        int prc = run_capture(pargv, b);
        if (prc != 0) {
            cli_warn("the PyTorch probe failed (exit status %d); the profile "
                     "has no PyTorch figures", prc);
            b->len = before; /* drop a partial line */
            if (b->data)
                b->data[b->len] = '\0';
        }
    }
    if (!b->data && buf_add(b, "", 0) != 0)
        return cli_fail("out of memory");
    return -1;
}

/* The profile with the measured section from c, written to --out (or
 * stdout), and the summary. */
static int write_measured(const cli_val *v, const vp_calib *c,
                          const char *when)
{
    const char *out = TEXT(O_OUT), *gpu = TEXT(O_GPU);
    vp_gpu_profile *p;
    vp_gpu_measured m;
    char source[256];
    vp_error err;
    FILE *f = stdout;
    int rc = -1;

    if (gpu == NULL && (gpu = vp_gpu_match_device(vp_calib_device_name(c))) ==
                           NULL)
        return cli_fail("no profile in gpus/ lists the device '%s'; give "
                        "--gpu", vp_calib_device_name(c));
    if ((p = cli_gpu_load(gpu, &rc)) == NULL)
        return rc;
    snprintf(source, sizeof source, "vramplan %s calibrate%s%s",
             VRAMPLAN_VERSION, when[0] ? ", " : "", when);
    vp_status st = vp_calib_reduce(c, source, &m, &err);
    const vp_gpu_measured *old = vp_gpu_measured_get(p);
    /* framework constants fitted earlier stay unless re-measured */
    if (st == VP_OK && old != NULL) {
        if (!m.context_bytes && old->context_bytes) {
            m.context_bytes = old->context_bytes;
            memcpy(m.framework_source, old->framework_source,
                   sizeof m.framework_source);
        }
        if (!m.cublas_workspace_bytes)
            m.cublas_workspace_bytes = old->cublas_workspace_bytes;
    }
    if (st == VP_OK && (rc = fit_sweep(TEXT(O_SWEEP), old, &m)) >= 0) {
        vp_gpu_free(p);
        return rc;
    }
    if (st == VP_OK)
        st = vp_gpu_measured_set(p, &m, &err);
    if (st == VP_OK && out && !(f = fopen(out, "w")))
        st = vp_error_set(&err, VP_EIO, "cannot write '%s': %s", out,
                          strerror(errno));
    if (st == VP_OK)
        st = vp_gpu_write(p, f, &err);
    if (st == VP_OK && out && fclose(f) != 0)
        st = vp_error_set(&err, VP_EIO, "cannot write '%s': %s", out,
                          strerror(errno));
    if (st == VP_OK)
        summary(out ? stdout : stderr, p, c, &m);
    vp_gpu_free(p);
    return st == VP_OK ? CLI_OK : cli_report(&err, NULL);
}

static int calibrate_run(const cli_args *args)
{
    const cli_val *v = args->v;
    const char *raw = TEXT(O_RAW), *from_raw = TEXT(O_FROM_RAW);
    const char *raw_name = from_raw;
    buffer b = {0};
    char when[64] = "";
    vp_error err;
    int rc = -1;

    if (from_raw && (v[O_BIN].given || v[O_QUICK].given ||
                     v[O_NO_TORCH].given))
        return cli_usage_error("--from-raw runs nothing: --bin, --quick and "
                               "--no-torch do not apply");
    if (from_raw && (b.data = read_all(from_raw, &b.len)) == NULL)
        return CLI_USAGE;
    if (!from_raw) {
        rc = measure(v, &b, when, sizeof when);
        raw_name = raw ? raw : "<vp-calibrate output>";
    }
    if (rc < 0 && raw && !from_raw && write_file(raw, b.data, b.len) != 0)
        rc = CLI_USAGE;
    vp_calib *c = rc < 0 ? vp_calib_parse(b.data, b.len, raw_name, &err)
                         : NULL;
    free(b.data);
    if (rc >= 0)
        return rc;
    if (c == NULL)
        return cli_report(&err, NULL);
    rc = write_measured(v, c, when);
    vp_calib_free(c);
    return rc;
}

int cli_calibrate(int argc, char **argv)
{
    cli_spec spec = {OPTS, sizeof OPTS / sizeof OPTS[0], 0, 0,
                     "calibrate takes options only", false, calibrate_help};
    cli_args args;
    int rc = cli_args_parse(&spec, argc, argv, &args);

    if (rc < 0)
        rc = calibrate_run(&args);
    cli_args_free(&args);
    return rc;
}
