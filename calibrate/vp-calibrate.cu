/* vp-calibrate: measure one GPU for vramplan.
 *
 * Prints raw measurements on stdout, one JSON object a line (the "kind"
 * key says what the line holds), and progress lines on stderr. vramplan
 * reads the lines, fits them (GSL) and writes a GPU profile:
 *
 *   build/calibrate/vp-calibrate > raw.jsonl
 *   vramplan calibrate --from-raw raw.jsonl --out profile.yaml
 *
 * or simply `vramplan calibrate --out profile.yaml`, which runs this program.
 *
 * What it measures, in this order (calibrate/README.md has the details):
 *   context    CUDA context after initialisation, in child processes with
 *              CUDA_MODULE_LOADING=LAZY (what PyTorch sets) and EAGER
 *   malloc     cudaMalloc alignment, small-allocation stride and footprint
 *              (free-memory drop) per size
 *   max_alloc  the largest single cudaMalloc (bisection, 2 MiB steps) and
 *              the free memory
 *   launch     kernel launch cost: host enqueue, back-to-back on the GPU,
 *              launch + synchronize round trip
 *   bandwidth  device memory: copy and triad kernels, cudaMemcpy D2D; host
 *              links: H2D and D2H, pinned and pageable
 *   gemm       cuBLASLt matmul for fp32, tf32, fp16, bf16 (NN, as
 *              torch.matmul) and fp8 (E4M3, TN, compute capability 8.9
 *              and newer) over a sweep of shapes; each timed sample after
 *              a 50 ms rest (burst rate), plus bf16 8192^3 back to back
 *              for ~0.5 s (sustained rate)
 *   nccl       all-reduce, all-gather, reduce-scatter over message sizes,
 *              when two or more GPUs are visible (skipped otherwise)
 * Every measurement is repeated; each line carries all its samples.
 *
 * cuBLASLt and NCCL are loaded with dlopen: the program links only the
 * CUDA runtime, so the context probes see a bare runtime, and a machine
 * without NCCL still runs everything else.
 *
 * Any CUDA, cuBLASLt or NCCL error stops the program with the statement,
 * function, file and line, after freeing everything it took (exit 1). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <cublasLt.h>

#include <ctype.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* ------------------------------------------------------------------ */
/* Errors and the resources to free on the way out                      */
/* ------------------------------------------------------------------ */

static void cleanup_all(void);

[[noreturn]] static void die(const char *stmt, const char *func,
                             const char *file, int line, const char *msg)
{
    fflush(stdout);
    fprintf(stderr,
            "vp-calibrate: error: %s\n    in function %s at %s:%d: %s\n",
            stmt, func, file, line, msg);
    cleanup_all();
    exit(1);
}

#define CUDA_CHECK(stmt)                                                   \
    do {                                                                   \
        cudaError_t e_ = (stmt);                                           \
        if (e_ != cudaSuccess)                                             \
            die(#stmt, __func__, __FILE__, __LINE__,                       \
                cudaGetErrorString(e_));                                   \
    } while (0)

/* After a kernel launch: launch errors now, execution errors at the next
 * synchronising call. */
#define KERNEL_CHECK() CUDA_CHECK(cudaGetLastError())

#define CHECK(cond, msg)                                                   \
    do {                                                                   \
        if (!(cond))                                                       \
            die(#cond, __func__, __FILE__, __LINE__, msg);                 \
    } while (0)

enum res_kind { R_DEV, R_PINNED, R_HOST, R_EVENT, R_STREAM };
struct res {
    res_kind kind;
    void *p;
    int device;
};
#define MAX_RES 512
static res g_res[MAX_RES];
static int g_nres;

static void track(res_kind kind, void *p, int device)
{
    if (g_nres == MAX_RES) {
        fprintf(stderr, "vp-calibrate: error: too many live resources\n");
        cleanup_all();
        exit(1);
    }
    g_res[g_nres++] = res{kind, p, device};
}

static void untrack(void *p)
{
    for (int i = g_nres - 1; i >= 0; i--)
        if (g_res[i].p == p) {
            g_res[i] = g_res[--g_nres];
            return;
        }
}

static void *dev_alloc(size_t n)
{
    void *p = NULL;
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaMalloc(&p, n));
    track(R_DEV, p, dev);
    return p;
}

static void dev_free(void *p)
{
    if (!p)
        return;
    untrack(p);
    CUDA_CHECK(cudaFree(p));
}

static void *pinned_alloc(size_t n)
{
    void *p = NULL;
    CUDA_CHECK(cudaMallocHost(&p, n));
    track(R_PINNED, p, 0);
    return p;
}

static void pinned_free(void *p)
{
    untrack(p);
    CUDA_CHECK(cudaFreeHost(p));
}

static void *host_alloc(size_t n)
{
    void *p = malloc(n);
    CHECK(p != NULL, "out of host memory");
    track(R_HOST, p, 0);
    return p;
}

static void host_free(void *p)
{
    untrack(p);
    free(p);
}

static cudaEvent_t event_new(void)
{
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    track(R_EVENT, (void *)e, 0);
    return e;
}

/* cuBLASLt entry points, loaded by load_cublaslt. */
#define LT_FUNCS(X)                                                        \
    X(cublasLtCreate)                                                      \
    X(cublasLtDestroy)                                                     \
    X(cublasLtGetStatusString)                                             \
    X(cublasLtGetVersion)                                                  \
    X(cublasLtMatmul)                                                      \
    X(cublasLtMatmulDescCreate)                                            \
    X(cublasLtMatmulDescDestroy)                                           \
    X(cublasLtMatmulDescSetAttribute)                                      \
    X(cublasLtMatrixLayoutCreate)                                          \
    X(cublasLtMatrixLayoutDestroy)                                         \
    X(cublasLtMatmulPreferenceCreate)                                      \
    X(cublasLtMatmulPreferenceDestroy)                                     \
    X(cublasLtMatmulPreferenceSetAttribute)                                \
    X(cublasLtMatmulAlgoGetHeuristic)

#define LT_PTR(name) static decltype(&name) p_##name;
LT_FUNCS(LT_PTR)
#undef LT_PTR

/* cuBLASLt and NCCL handles, torn down by cleanup_all too. */
static cublasLtHandle_t g_lt;
typedef struct nccl_comm_s *nccl_comm_t;
#define MAX_GPUS 16
static nccl_comm_t g_comms[MAX_GPUS];
static int g_ncomms;
static int (*p_ncclCommDestroy)(nccl_comm_t);

static void cleanup_all(void)
{
    static bool running;
    if (running)
        return;
    running = true;
    /* Errors are ignored here: after a sticky error every call fails, and
     * the process is about to exit anyway. */
    for (int i = 0; i < g_ncomms; i++)
        if (g_comms[i] && p_ncclCommDestroy)
            p_ncclCommDestroy(g_comms[i]);
    g_ncomms = 0;
    if (g_lt && p_cublasLtDestroy)
        p_cublasLtDestroy(g_lt);
    g_lt = NULL;
    for (int i = g_nres - 1; i >= 0; i--) {
        res r = g_res[i];
        switch (r.kind) {
        case R_DEV:
            cudaSetDevice(r.device);
            cudaFree(r.p);
            break;
        case R_PINNED:
            cudaFreeHost(r.p);
            break;
        case R_HOST:
            free(r.p);
            break;
        case R_EVENT:
            cudaEventDestroy((cudaEvent_t)r.p);
            break;
        case R_STREAM:
            cudaSetDevice(r.device);
            cudaStreamDestroy((cudaStream_t)r.p);
            break;
        }
    }
    g_nres = 0;
    running = false;
}

/* ------------------------------------------------------------------ */
/* Output                                                               */
/* ------------------------------------------------------------------ */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static double g_t0;
static bool g_quiet;

static void progress(const char *fmt, ...)
{
    if (g_quiet)
        return;
    va_list ap;
    fprintf(stderr, "vp-calibrate: [%5.1f s] ", now_s() - g_t0);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* A JSON string, escaped. */
static void put_str(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static void put_arr(const char *key, const double *v, int n)
{
    printf(", \"%s\": [", key);
    for (int i = 0; i < n; i++)
        printf("%s%.6g", i ? ", " : "", v[i]);
    putchar(']');
}

static void put_uarr(const char *key, const unsigned long long *v, int n)
{
    printf(", \"%s\": [", key);
    for (int i = 0; i < n; i++)
        printf("%s%llu", i ? ", " : "", v[i]);
    putchar(']');
}

static void end_line(void)
{
    puts("}");
    fflush(stdout);
}

static void skip_line(const char *what, const char *why)
{
    printf("{\"kind\": \"skip\", \"what\": ");
    put_str(what);
    printf(", \"why\": ");
    put_str(why);
    end_line();
    progress("skipped %s: %s", what, why);
}

/* ------------------------------------------------------------------ */
/* Kernels                                                              */
/* ------------------------------------------------------------------ */

__global__ void k_empty(void) {}

__device__ __forceinline__ float rnd(size_t i, uint32_t seed)
{
    /* A 32-bit hash of the index: uniform in [-1, 1). */
    uint32_t x = (uint32_t)i * 2654435761u ^ (uint32_t)(i >> 32) ^ seed;
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return (float)(x >> 8) * (2.0f / 16777216.0f) - 1.0f;
}

/* Standard normal (Box-Muller on two hashes), like torch.randn: the
 * data's bits change the matrix units' power draw, hence their clocks. */
__device__ __forceinline__ float rnd_normal(size_t i, uint32_t seed)
{
    float u1 = 0.5f * (rnd(i, seed) + 1.0f) + 1.0f / 33554432.0f;
    float u2 = rnd(i, seed ^ 0x9e3779b9u);
    return sqrtf(-2.0f * __logf(u1)) * __cosf(3.14159265f * u2);
}

template <typename T>
__global__ void k_fill(T *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = T(rnd_normal(i, seed));
}

template <>
__global__ void k_fill<__half>(__half *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2half(rnd_normal(i, seed));
}

template <>
__global__ void k_fill<__nv_bfloat16>(__nv_bfloat16 *p, size_t n,
                                      uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = __float2bfloat16(rnd_normal(i, seed));
}

/* Streaming kernels over float4: each thread moves UNROLL vectors, spaced
 * a block apart so that every load instruction is coalesced. */
#define BW_THREADS 256
#define BW_UNROLL 4

__global__ void k_copy(const float4 *__restrict__ a, float4 *__restrict__ b,
                       size_t n)
{
    size_t base = (size_t)blockIdx.x * BW_THREADS * BW_UNROLL + threadIdx.x;
    float4 v[BW_UNROLL];
#pragma unroll
    for (int j = 0; j < BW_UNROLL; j++) {
        size_t i = base + (size_t)j * BW_THREADS;
        if (i < n)
            v[j] = a[i];
    }
#pragma unroll
    for (int j = 0; j < BW_UNROLL; j++) {
        size_t i = base + (size_t)j * BW_THREADS;
        if (i < n)
            b[i] = v[j];
    }
}

__global__ void k_triad(const float4 *__restrict__ a,
                        const float4 *__restrict__ b, float4 *__restrict__ c,
                        float s, size_t n)
{
    size_t base = (size_t)blockIdx.x * BW_THREADS * BW_UNROLL + threadIdx.x;
    float4 x[BW_UNROLL], y[BW_UNROLL];
#pragma unroll
    for (int j = 0; j < BW_UNROLL; j++) {
        size_t i = base + (size_t)j * BW_THREADS;
        if (i < n) {
            x[j] = a[i];
            y[j] = b[i];
        }
    }
#pragma unroll
    for (int j = 0; j < BW_UNROLL; j++) {
        size_t i = base + (size_t)j * BW_THREADS;
        if (i < n)
            c[i] = make_float4(x[j].x + s * y[j].x, x[j].y + s * y[j].y,
                               x[j].z + s * y[j].z, x[j].w + s * y[j].w);
    }
}

template <typename T>
static void fill(void *p, size_t n, uint32_t seed)
{
    k_fill<T><<<1024, 256>>>((T *)p, n, seed);
    KERNEL_CHECK();
}

/* ------------------------------------------------------------------ */
/* Settings                                                             */
/* ------------------------------------------------------------------ */

static int g_device;
static int g_repeats = 5;
static bool g_quick;
static cudaEvent_t g_ev0, g_ev1;

static float elapsed_ms(void)
{
    float ms = 0;
    CUDA_CHECK(cudaEventSynchronize(g_ev1));
    CUDA_CHECK(cudaEventElapsedTime(&ms, g_ev0, g_ev1));
    return ms;
}

/* ------------------------------------------------------------------ */
/* Context probes (child processes)                                     */
/* ------------------------------------------------------------------ */

static void used_now(size_t *used, size_t *total)
{
    size_t fr = 0, tot = 0;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    *used = tot - fr;
    *total = tot;
}

/* --context-probe MODE: initialise CUDA in this fresh process, report the
 * device memory in use after init and after the first kernel. */
static int context_probe(const char *mode)
{
    size_t after_init, after_kernel, total;
    CUDA_CHECK(cudaSetDevice(g_device));
    CUDA_CHECK(cudaFree(0));
    used_now(&after_init, &total);
    k_empty<<<1, 1>>>();
    KERNEL_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    used_now(&after_kernel, &total);
    printf("{\"kind\": \"context\", \"mode\": ");
    put_str(mode);
    printf(", \"after_init\": %zu, \"after_kernel\": %zu, \"total\": %zu",
           after_init, after_kernel, total);
    end_line();
    return 0;
}

static void run_context_probes(const char *self)
{
    static const char *const modes[] = {"lazy", "eager"};
    char dev[16];
    snprintf(dev, sizeof dev, "%d", g_device);
    int reps = g_quick ? 2 : 3;
    for (int m = 0; m < 2; m++) {
        for (int r = 0; r < reps; r++) {
            progress("context: CUDA_MODULE_LOADING=%s, probe %d of %d",
                     m ? "EAGER" : "LAZY", r + 1, reps);
            fflush(stdout);
            pid_t pid = fork();
            CHECK(pid >= 0, strerror(errno));
            if (pid == 0) {
                setenv("CUDA_MODULE_LOADING", m ? "EAGER" : "LAZY", 1);
                execl(self, self, "--context-probe", modes[m], "--device",
                      dev, (char *)NULL);
                fprintf(stderr, "vp-calibrate: error: cannot run %s: %s\n",
                        self, strerror(errno));
                _exit(127);
            }
            int status = 0;
            while (waitpid(pid, &status, 0) < 0)
                CHECK(errno == EINTR, strerror(errno));
            CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                  "a context probe failed (its message is above)");
        }
    }
}

/* ------------------------------------------------------------------ */
/* Device description                                                   */
/* ------------------------------------------------------------------ */

static bool read_sys(const char *dir, const char *file, char *buf, size_t n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "r");
    if (!f)
        return false;
    bool ok = fgets(buf, (int)n, f) != NULL;
    fclose(f);
    if (ok)
        buf[strcspn(buf, "\n")] = '\0';
    return ok;
}

static void describe_device(int ngpus)
{
    cudaDeviceProp p;
    CUDA_CHECK(cudaGetDeviceProperties(&p, g_device));
    int drv = 0, rt = 0;
    CUDA_CHECK(cudaDriverGetVersion(&drv));
    CUDA_CHECK(cudaRuntimeGetVersion(&rt));
    char bus[32] = "";
    CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof bus, g_device));
    for (char *c = bus; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    printf("{\"kind\": \"device\", \"name\": ");
    put_str(p.name);
    printf(", \"cc\": \"%d.%d\", \"sms\": %d, \"total\": %zu, "
           "\"l2_bytes\": %d, \"bus_width\": %d, \"gpus\": %d, "
           "\"driver\": %d, \"runtime\": %d, \"pci\": ",
           p.major, p.minor, p.multiProcessorCount, p.totalGlobalMem,
           p.l2CacheSize, p.memoryBusWidth, ngpus, drv, rt);
    put_str(bus);
    char dir[128], speed[64], width[64];
    snprintf(dir, sizeof dir, "/sys/bus/pci/devices/%s", bus);
    if (read_sys(dir, "current_link_speed", speed, sizeof speed) &&
        read_sys(dir, "current_link_width", width, sizeof width)) {
        printf(", \"link_speed\": ");
        put_str(speed);
        printf(", \"link_width\": ");
        put_str(width);
    }
    if (read_sys(dir, "max_link_speed", speed, sizeof speed)) {
        printf(", \"max_link_speed\": ");
        put_str(speed);
    }
    end_line();
    progress("device %d: %s, compute capability %d.%d, %d SMs, %.2f GiB",
             g_device, p.name, p.major, p.minor, p.multiProcessorCount,
             (double)p.totalGlobalMem / (double)GiB);
}

/* ------------------------------------------------------------------ */
/* cudaMalloc: alignment, stride, footprint, largest allocation         */
/* ------------------------------------------------------------------ */

static int cmp_uptr(const void *a, const void *b)
{
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

static void measure_malloc(void)
{
    static const size_t sizes[] = {1,       256,         512,
                                   1024,    4096,        65536,
                                   MiB,     2 * MiB,     2 * MiB + 1,
                                   3 * MiB, 20 * MiB + 1, 64 * MiB + 1};
    enum { MAXC = 64 };
    void *ptrs[MAXC];
    uintptr_t addrs[MAXC];
    progress("malloc: alignment, stride and footprint of %zu sizes",
             sizeof sizes / sizeof sizes[0]);
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s];
        int count = n < MiB ? MAXC : 8;
        size_t free0, free1, tot;
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemGetInfo(&free0, &tot));
        for (int i = 0; i < count; i++) {
            ptrs[i] = dev_alloc(n);
            addrs[i] = (uintptr_t)ptrs[i];
        }
        CUDA_CHECK(cudaMemGetInfo(&free1, &tot));
        int align_log2 = 63;
        for (int i = 0; i < count; i++) {
            int tz = addrs[i] ? __builtin_ctzll(addrs[i]) : 63;
            if (tz < align_log2)
                align_log2 = tz;
        }
        qsort(addrs, (size_t)count, sizeof addrs[0], cmp_uptr);
        uintptr_t stride = 0;
        for (int i = 1; i < count; i++) {
            uintptr_t d = addrs[i] - addrs[i - 1];
            if (d && (!stride || d < stride))
                stride = d;
        }
        for (int i = 0; i < count; i++)
            dev_free(ptrs[i]);
        printf("{\"kind\": \"malloc\", \"size\": %zu, \"count\": %d, "
               "\"footprint\": %zu, \"align_log2\": %d, \"min_stride\": "
               "%llu",
               n, count, free0 > free1 ? free0 - free1 : (size_t)0,
               align_log2, (unsigned long long)stride);
        end_line();
    }
}

/* true when a cudaMalloc of n bytes succeeds (it is freed at once). */
static bool try_alloc(size_t n)
{
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, n);
    if (e == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError(); /* not sticky: clear it */
        return false;
    }
    CUDA_CHECK(e);
    CUDA_CHECK(cudaFree(p));
    return true;
}

static void measure_max_alloc(void)
{
    const size_t step = 2 * MiB;
    size_t fr, tot;
    CUDA_CHECK(cudaDeviceSynchronize());
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    progress("max_alloc: bisecting the largest cudaMalloc under %.2f GiB "
             "free",
             (double)fr / (double)GiB);
    int reps = g_quick ? 1 : 3;
    unsigned long long found[3], frees[3];
    size_t last = 0;
    for (int r = 0; r < reps; r++) {
        CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
        size_t lo = 0, hi = (fr / step + 1) * step;
        /* a repeat first checks the last answer: it still fits and one
         * step more does not (two calls); else it bisects again */
        if (last && try_alloc(last) && !try_alloc(last + step))
            lo = last, hi = last + step;
        double t0 = now_s();
        while (hi - lo > step) {
            size_t mid = (lo + (hi - lo) / 2) / step * step;
            if (mid <= lo)
                mid = lo + step;
            if (try_alloc(mid))
                lo = mid;
            else
                hi = mid;
        }
        if (r == 0)
            progress("max_alloc: bisection took %.2f s", now_s() - t0);
        found[r] = lo;
        frees[r] = fr;
        last = lo;
    }
    printf("{\"kind\": \"max_alloc\", \"total\": %zu, \"step\": %zu", tot,
           step);
    put_uarr("free", frees, reps);
    put_uarr("bytes", found, reps);
    end_line();
    progress("max_alloc: %.3f GiB in one cudaMalloc",
             (double)found[0] / (double)GiB);
}

/* ------------------------------------------------------------------ */
/* Launch latency                                                       */
/* ------------------------------------------------------------------ */

static void measure_launch(void)
{
    const int n = g_quick ? 500 : 2000, nsync = g_quick ? 50 : 200;
    int reps = g_repeats;
    double enq[16], gpu[16], rt[16];
    progress("launch: %d empty kernels x %d", n, reps);
    for (int i = 0; i < 100; i++)
        k_empty<<<1, 1>>>();
    KERNEL_CHECK();
    CUDA_CHECK(cudaDeviceSynchronize());
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        for (int i = 0; i < n; i++)
            k_empty<<<1, 1>>>();
        double t1 = now_s();
        KERNEL_CHECK();
        CUDA_CHECK(cudaDeviceSynchronize());
        enq[r] = (t1 - t0) * 1e6 / n;

        CUDA_CHECK(cudaEventRecord(g_ev0, 0));
        for (int i = 0; i < n; i++)
            k_empty<<<1, 1>>>();
        CUDA_CHECK(cudaEventRecord(g_ev1, 0));
        KERNEL_CHECK();
        gpu[r] = 1e3 * elapsed_ms() / n;

        t0 = now_s();
        for (int i = 0; i < nsync; i++) {
            k_empty<<<1, 1>>>();
            CUDA_CHECK(cudaStreamSynchronize(0));
        }
        KERNEL_CHECK();
        rt[r] = (now_s() - t0) * 1e6 / nsync;
    }
    printf("{\"kind\": \"launch\", \"launches\": %d", n);
    put_arr("enqueue_us", enq, reps);
    put_arr("gpu_us", gpu, reps);
    put_arr("sync_us", rt, reps);
    end_line();
}

/* ------------------------------------------------------------------ */
/* Bandwidth                                                            */
/* ------------------------------------------------------------------ */

static void bw_line(const char *test, size_t bytes_per_iter, int iters,
                    const double *gbps, int n)
{
    printf("{\"kind\": \"bandwidth\", \"test\": ");
    put_str(test);
    printf(", \"bytes\": %zu, \"iters\": %d", bytes_per_iter, iters);
    put_arr("gbps", gbps, n);
    end_line();
    double best = 0;
    for (int i = 0; i < n; i++)
        best = gbps[i] > best ? gbps[i] : best;
    progress("bandwidth: %-12s %8.1f GB/s (best of %d)", test, best, n);
}

static void measure_device_bw(void)
{
    size_t fr, tot;
    CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
    size_t n = g_quick ? 256 * MiB : GiB;
    while (n > 16 * MiB && 3 * n > fr / 2)
        n /= 2;
    size_t nv = n / sizeof(float4);
    float4 *a = (float4 *)dev_alloc(n), *b = (float4 *)dev_alloc(n),
           *c = (float4 *)dev_alloc(n);
    fill<float>(a, n / sizeof(float), 1);
    fill<float>(b, n / sizeof(float), 2);
    fill<float>(c, n / sizeof(float), 3);
    CUDA_CHECK(cudaDeviceSynchronize());
    unsigned blocks = (unsigned)((nv + BW_THREADS * BW_UNROLL - 1) /
                                 (BW_THREADS * BW_UNROLL));
    const int iters = g_quick ? 3 : 10;
    int reps = g_repeats + 2;
    double g[16];
    progress("bandwidth: device memory, 3 buffers of %zu MiB", n / MiB);

    for (int test = 0; test < 3; test++) {
        for (int r = -1; r < reps; r++) { /* r = -1 warms up */
            CUDA_CHECK(cudaEventRecord(g_ev0, 0));
            for (int i = 0; i < iters; i++) {
                if (test == 0)
                    k_copy<<<blocks, BW_THREADS>>>(a, b, nv);
                else if (test == 1)
                    k_triad<<<blocks, BW_THREADS>>>(a, b, c, 3.0f, nv);
                else
                    CUDA_CHECK(cudaMemcpyAsync(b, a, n,
                                               cudaMemcpyDeviceToDevice, 0));
            }
            CUDA_CHECK(cudaEventRecord(g_ev1, 0));
            KERNEL_CHECK();
            double ms = elapsed_ms();
            size_t moved = (test == 1 ? 3 : 2) * n;
            if (r >= 0)
                g[r] = (double)moved * iters / (ms * 1e-3) / 1e9;
        }
        static const char *const names[] = {"copy", "triad", "d2d_memcpy"};
        bw_line(names[test], (test == 1 ? 3 : 2) * n, iters, g, reps);
    }
    dev_free(c);
    dev_free(b);
    dev_free(a);
}

static void measure_host_bw(void)
{
    size_t n = g_quick ? 64 * MiB : 256 * MiB;
    void *d = dev_alloc(n);
    void *hp = pinned_alloc(n);
    void *hq = host_alloc(n);
    memset(hp, 1, n);
    memset(hq, 1, n);
    int reps = g_repeats;
    double g[16];
    progress("bandwidth: host links, %zu MiB transfers", n / MiB);
    static const char *const names[] = {"h2d_pinned", "d2h_pinned",
                                        "h2d_pageable", "d2h_pageable"};
    for (int test = 0; test < 4; test++) {
        void *h = test < 2 ? hp : hq;
        bool h2d = test % 2 == 0;
        for (int r = -1; r < reps; r++) {
            CUDA_CHECK(cudaEventRecord(g_ev0, 0));
            if (h2d)
                CUDA_CHECK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice,
                                           0));
            else
                CUDA_CHECK(cudaMemcpyAsync(h, d, n, cudaMemcpyDeviceToHost,
                                           0));
            CUDA_CHECK(cudaEventRecord(g_ev1, 0));
            double ms = elapsed_ms();
            if (r >= 0)
                g[r] = (double)n / (ms * 1e-3) / 1e9;
        }
        bw_line(names[test], n, 1, g, reps);
    }
    host_free(hq);
    pinned_free(hp);
    dev_free(d);
}

/* ------------------------------------------------------------------ */
/* GEMM through cuBLASLt (dlopen)                                       */
/* ------------------------------------------------------------------ */


static const char *lt_status(cublasStatus_t s)
{
    return p_cublasLtGetStatusString ? p_cublasLtGetStatusString(s)
                                     : "cuBLASLt error";
}

#define LT_CHECK(stmt)                                                     \
    do {                                                                   \
        cublasStatus_t s_ = (stmt);                                        \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                   \
            die(#stmt, __func__, __FILE__, __LINE__, lt_status(s_));       \
    } while (0)

/* Open a shared library by the names given, then under CUDA_HOME and
 * /usr/local/cuda/lib64. NULL when none loads (*why says why). */
static void *open_lib(const char *const *names, char *why, size_t n)
{
    why[0] = '\0';
    const char *home = getenv("CUDA_HOME");
    const char *dirs[] = {NULL, home, "/usr/local/cuda/lib64",
                          "/usr/local/cuda/targets/x86_64-linux/lib"};
    for (size_t d = 0; d < sizeof dirs / sizeof dirs[0]; d++) {
        if (d > 0 && !dirs[d])
            continue;
        for (size_t i = 0; names[i]; i++) {
            char path[512];
            if (d == 0)
                snprintf(path, sizeof path, "%s", names[i]);
            else if (d == 1)
                snprintf(path, sizeof path, "%s/lib64/%s", dirs[d],
                         names[i]);
            else
                snprintf(path, sizeof path, "%s/%s", dirs[d], names[i]);
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (h)
                return h;
            if (!why[0])
                snprintf(why, n, "%s", dlerror());
        }
    }
    return NULL;
}

static bool load_cublaslt(char *why, size_t n)
{
    static const char *const names[] = {"libcublasLt.so.13",
                                        "libcublasLt.so.12",
                                        "libcublasLt.so", NULL};
    void *h = open_lib(names, why, n);
    if (!h)
        return false;
#define LT_SYM(name)                                                       \
    p_##name = (decltype(&name))dlsym(h, #name);                           \
    if (!p_##name) {                                                       \
        snprintf(why, n, "libcublasLt has no %s", #name);                  \
        return false;                                                      \
    }
    LT_FUNCS(LT_SYM)
#undef LT_SYM
    return true;
}

struct dtype_info {
    const char *name;
    cudaDataType_t ab, cd;
    cublasComputeType_t compute;
    size_t ab_size, cd_size;
    int min_cc; /* 10 * major + minor */
};

static const dtype_info DTYPES[] = {
    {"fp32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F, 4, 4, 0},
    {"tf32", CUDA_R_32F, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32, 4, 4, 80},
    {"fp16", CUDA_R_16F, CUDA_R_16F, CUBLAS_COMPUTE_32F, 2, 2, 70},
    {"bf16", CUDA_R_16BF, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 2, 2, 80},
    {"fp8", CUDA_R_8F_E4M3, CUDA_R_16BF, CUBLAS_COMPUTE_32F, 1, 2, 89},
};

struct shape {
    int m, n, k;
};

static const shape SHAPES[] = {
    {256, 256, 256},    {384, 384, 384},    {512, 512, 512},
    {768, 768, 768},    {1024, 1024, 1024}, {1536, 1536, 1536},
    {2048, 2048, 2048}, {3072, 3072, 3072}, {4096, 4096, 4096},
    {6144, 6144, 6144}, {8192, 8192, 8192}, {8192, 8192, 1024},
    {1024, 8192, 8192},
};
static const shape QUICK_SHAPES[] = {
    {512, 512, 512}, {2048, 2048, 2048}, {8192, 8192, 8192}};

#define LT_WORKSPACE (32 * MiB) /* PyTorch's cuBLAS workspace on Hopper */
#define MAX_ALGOS 4

struct gemm_bufs {
    void *a, *b, *d, *ws;
};

/* Matmul descriptors for one dtype and shape. fp8 takes the TN layout
 * (D = A^T B, A k x m), the only one cuBLASLt has for it; the others NN
 * (D = A B, A m x k), the layout of torch.matmul on row-major tensors. */
struct gemm_desc {
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulHeuristicResult_t res[MAX_ALGOS];
    int found;
    cublasStatus_t heur;
    bool tn;
};

static void gemm_desc_init(gemm_desc &g, const dtype_info &dt, shape s)
{
    memset(&g, 0, sizeof g);
    g.tn = dt.ab == CUDA_R_8F_E4M3;
    LT_CHECK(p_cublasLtMatmulDescCreate(&g.op, dt.compute, CUDA_R_32F));
    cublasOperation_t ta = g.tn ? CUBLAS_OP_T : CUBLAS_OP_N,
                      tb = CUBLAS_OP_N;
    LT_CHECK(p_cublasLtMatmulDescSetAttribute(
        g.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    LT_CHECK(p_cublasLtMatmulDescSetAttribute(
        g.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    if (g.tn)
        LT_CHECK(p_cublasLtMatrixLayoutCreate(&g.la, dt.ab, s.k, s.m, s.k));
    else
        LT_CHECK(p_cublasLtMatrixLayoutCreate(&g.la, dt.ab, s.m, s.k, s.m));
    LT_CHECK(p_cublasLtMatrixLayoutCreate(&g.lb, dt.ab, s.k, s.n, s.k));
    LT_CHECK(p_cublasLtMatrixLayoutCreate(&g.ld, dt.cd, s.m, s.n, s.m));
    cublasLtMatmulPreference_t pref = NULL;
    LT_CHECK(p_cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = LT_WORKSPACE;
    LT_CHECK(p_cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    g.heur = p_cublasLtMatmulAlgoGetHeuristic(g_lt, g.op, g.la, g.lb, g.ld,
                                              g.ld, pref, MAX_ALGOS, g.res,
                                              &g.found);
    if (g.heur != CUBLAS_STATUS_SUCCESS)
        g.found = 0;
    p_cublasLtMatmulPreferenceDestroy(pref);
}

static void gemm_desc_destroy(gemm_desc &g)
{
    p_cublasLtMatrixLayoutDestroy(g.ld);
    p_cublasLtMatrixLayoutDestroy(g.lb);
    p_cublasLtMatrixLayoutDestroy(g.la);
    p_cublasLtMatmulDescDestroy(g.op);
}

static cublasStatus_t gemm_run(const gemm_desc &g, int algo,
                               const gemm_bufs &buf)
{
    static const float alpha = 1.0f, beta = 0.0f;
    return p_cublasLtMatmul(g_lt, g.op, &alpha, buf.a, g.la, buf.b, g.lb,
                            &beta, buf.d, g.ld, buf.d, g.ld,
                            &g.res[algo].algo, buf.ws, LT_WORKSPACE, 0);
}

/* The fastest of the top heuristics (3 timed calls each); -1 if none
 * runs. *ms gets its time per call. */
static int gemm_pick(const gemm_desc &g, const gemm_bufs &buf, float *ms)
{
    int best = -1;
    for (int i = 0; i < g.found; i++) {
        if (g.res[i].state != CUBLAS_STATUS_SUCCESS ||
            gemm_run(g, i, buf) != CUBLAS_STATUS_SUCCESS)
            continue;
        CUDA_CHECK(cudaEventRecord(g_ev0, 0));
        for (int j = 0; j < 3; j++)
            LT_CHECK(gemm_run(g, i, buf));
        CUDA_CHECK(cudaEventRecord(g_ev1, 0));
        float t = elapsed_ms() / 3;
        if (best < 0 || t < *ms) {
            best = i;
            *ms = t;
        }
    }
    return best;
}

/* Idle before every timed GEMM sample. Under sustained load the H200
 * lowers its clocks within ~50 ms (power limit); a short rest makes every
 * sample a burst at full clocks whatever ran before it, as PyTorch's
 * one-off benchmarks (and the PyTorch probe) see them. The sustained rate
 * is measured apart (measure_sustained). */
#define GEMM_REST_US 50000

static void rest(void)
{
    CUDA_CHECK(cudaDeviceSynchronize());
    usleep(GEMM_REST_US);
}

/* Time one shape; appends a gemm or a skip line. */
static bool time_gemm(const dtype_info &dt, shape s, const gemm_bufs &buf)
{
    gemm_desc g;
    gemm_desc_init(g, dt, s);
    double flop = 2.0 * s.m * (double)s.n * s.k;
    char what[96];
    snprintf(what, sizeof what, "gemm %s %dx%dx%d", dt.name, s.m, s.n, s.k);
    float best_ms = 0;
    int best = gemm_pick(g, buf, &best_ms);
    bool ok = best >= 0;
    if (ok) {
        const double target_ms = g_quick ? 2.0 : 5.0;
        int iters = (int)(target_ms / (best_ms > 1e-4 ? best_ms : 1e-4)) + 1;
        iters = iters > 1000 ? 1000 : iters;
        int warm = iters / 5 > 1 ? iters / 5 : 1; /* ~1 ms: clocks up */
        double tf[16];
        int reps = g_repeats;
        for (int r = 0; r < reps; r++) {
            rest();
            for (int j = 0; j < warm; j++)
                LT_CHECK(gemm_run(g, best, buf));
            CUDA_CHECK(cudaEventRecord(g_ev0, 0));
            for (int j = 0; j < iters; j++)
                LT_CHECK(gemm_run(g, best, buf));
            CUDA_CHECK(cudaEventRecord(g_ev1, 0));
            tf[r] = flop * iters / (elapsed_ms() * 1e-3) / 1e12;
        }
        printf("{\"kind\": \"gemm\", \"dtype\": \"%s\", \"m\": %d, \"n\": "
               "%d, \"k\": %d, \"layout\": \"%s\", \"algos\": %d, \"iters\": "
               "%d, \"rest_ms\": %d",
               dt.name, s.m, s.n, s.k, g.tn ? "TN" : "NN", g.found, iters,
               GEMM_REST_US / 1000);
        put_arr("tflops", tf, reps);
        end_line();
    } else {
        skip_line(what, g.heur != CUBLAS_STATUS_SUCCESS
                            ? lt_status(g.heur)
                            : "no cuBLASLt algorithm for this shape");
    }
    gemm_desc_destroy(g);
    return ok;
}

/* bf16 8192^3 back to back for about half a second, timed in windows of
 * ~50 ms: the rate a long run of large GEMMs sustains once the clocks
 * settle under the power limit. */
static void measure_sustained(const dtype_info &dt, const gemm_bufs &buf)
{
    shape s = {8192, 8192, 8192};
    gemm_desc g;
    gemm_desc_init(g, dt, s);
    float ms = 0;
    int best = gemm_pick(g, buf, &ms);
    if (best >= 0) {
        const int windows = g_quick ? 3 : 10;
        int iters = (int)(50.0f / (ms > 1e-3f ? ms : 1e-3f)) + 1;
        double flop = 2.0 * s.m * (double)s.n * s.k, tf[16];
        cudaEvent_t ev[17];
        for (int w = 0; w <= windows; w++)
            ev[w] = event_new();
        rest();
        CUDA_CHECK(cudaEventRecord(ev[0], 0));
        for (int w = 0; w < windows; w++) {
            for (int j = 0; j < iters; j++)
                LT_CHECK(gemm_run(g, best, buf));
            CUDA_CHECK(cudaEventRecord(ev[w + 1], 0));
        }
        CUDA_CHECK(cudaEventSynchronize(ev[windows]));
        for (int w = 0; w < windows; w++) {
            float t = 0;
            CUDA_CHECK(cudaEventElapsedTime(&t, ev[w], ev[w + 1]));
            tf[w] = flop * iters / (t * 1e-3) / 1e12;
        }
        for (int w = 0; w <= windows; w++) {
            untrack((void *)ev[w]);
            CUDA_CHECK(cudaEventDestroy(ev[w]));
        }
        printf("{\"kind\": \"gemm_sustained\", \"dtype\": \"%s\", \"m\": %d, "
               "\"n\": %d, \"k\": %d, \"iters\": %d",
               dt.name, s.m, s.n, s.k, iters);
        put_arr("tflops", tf, windows);
        end_line();
        progress("gemm: %s 8192^3 sustained: %.1f TFLOP/s in the first "
                 "window, %.1f in the last",
                 dt.name, tf[0], tf[windows - 1]);
    } else {
        skip_line("gemm_sustained", "no cuBLASLt algorithm for bf16 8192^3");
    }
    gemm_desc_destroy(g);
}

static void fill_dtype(const dtype_info &dt, void *p, size_t n,
                       uint32_t seed)
{
    switch (dt.ab) {
    case CUDA_R_32F:
        fill<float>(p, n, seed);
        break;
    case CUDA_R_16F:
        fill<__half>(p, n, seed);
        break;
    case CUDA_R_16BF:
        fill<__nv_bfloat16>(p, n, seed);
        break;
    default:
        fill<__nv_fp8_e4m3>(p, n, seed);
        break;
    }
}

static void measure_gemm(int cc)
{
    char why[512];
    if (!load_cublaslt(why, sizeof why)) {
        skip_line("gemm", why);
        return;
    }
    LT_CHECK(p_cublasLtCreate(&g_lt));
    const shape *shapes = g_quick ? QUICK_SHAPES : SHAPES;
    size_t nshapes = g_quick ? sizeof QUICK_SHAPES / sizeof QUICK_SHAPES[0]
                             : sizeof SHAPES / sizeof SHAPES[0];
    size_t max_ab = 0, max_d = 0;
    for (size_t i = 0; i < nshapes; i++) {
        size_t a = (size_t)shapes[i].m * shapes[i].k,
               b = (size_t)shapes[i].k * shapes[i].n,
               d = (size_t)shapes[i].m * shapes[i].n;
        max_ab = a > max_ab ? a : max_ab;
        max_ab = b > max_ab ? b : max_ab;
        max_d = d > max_d ? d : max_d;
    }
    gemm_bufs buf;
    buf.a = dev_alloc(max_ab * 4);
    buf.b = dev_alloc(max_ab * 4);
    buf.d = dev_alloc(max_d * 4);
    buf.ws = dev_alloc(LT_WORKSPACE);
    printf("{\"kind\": \"gemm_setup\", \"cublaslt_version\": %zu, "
           "\"workspace\": %zu",
           p_cublasLtGetVersion(), (size_t)LT_WORKSPACE);
    end_line();
    for (size_t t = 0; t < sizeof DTYPES / sizeof DTYPES[0]; t++) {
        const dtype_info &dt = DTYPES[t];
        if (cc < dt.min_cc) {
            char msg[96];
            snprintf(msg, sizeof msg,
                     "needs compute capability %d.%d or newer", dt.min_cc / 10,
                     dt.min_cc % 10);
            char what[32];
            snprintf(what, sizeof what, "gemm %s", dt.name);
            skip_line(what, msg);
            continue;
        }
        progress("gemm: %s, %zu shapes", dt.name, nshapes);
        fill_dtype(dt, buf.a, max_ab, 11);
        fill_dtype(dt, buf.b, max_ab, 12);
        CUDA_CHECK(cudaDeviceSynchronize());
        for (size_t i = 0; i < nshapes; i++)
            time_gemm(dt, shapes[i], buf);
        if (dt.ab == CUDA_R_16BF && max_ab >= (size_t)8192 * 8192 &&
            max_d >= (size_t)8192 * 8192)
            measure_sustained(dt, buf);
    }
    dev_free(buf.ws);
    dev_free(buf.d);
    dev_free(buf.b);
    dev_free(buf.a);
    LT_CHECK(p_cublasLtDestroy(g_lt));
    g_lt = NULL;
}

/* ------------------------------------------------------------------ */
/* NCCL collectives (dlopen), two or more GPUs                          */
/* ------------------------------------------------------------------ */

/* The few NCCL declarations used, as in nccl.h (2.x). */
typedef int nccl_result_t;
enum { NCCL_FLOAT32 = 7, NCCL_SUM = 0 };
static nccl_result_t (*p_ncclCommInitAll)(nccl_comm_t *, int, const int *);
static const char *(*p_ncclGetErrorString)(nccl_result_t);
static nccl_result_t (*p_ncclGroupStart)(void);
static nccl_result_t (*p_ncclGroupEnd)(void);
static nccl_result_t (*p_ncclAllReduce)(const void *, void *, size_t, int,
                                        int, nccl_comm_t, cudaStream_t);
static nccl_result_t (*p_ncclAllGather)(const void *, void *, size_t, int,
                                        nccl_comm_t, cudaStream_t);
static nccl_result_t (*p_ncclReduceScatter)(const void *, void *, size_t, int,
                                            int, nccl_comm_t, cudaStream_t);

#define NCCL_CHECK(stmt)                                                   \
    do {                                                                   \
        nccl_result_t r_ = (stmt);                                         \
        if (r_ != 0)                                                       \
            die(#stmt, __func__, __FILE__, __LINE__,                       \
                p_ncclGetErrorString(r_));                                 \
    } while (0)

static bool load_nccl(char *why, size_t n)
{
    static const char *const names[] = {"libnccl.so.2", "libnccl.so", NULL};
    void *h = open_lib(names, why, n);
    if (!h)
        return false;
#define NC_SYM(name)                                                       \
    *(void **)&p_##name = dlsym(h, #name);                                 \
    if (!p_##name) {                                                       \
        snprintf(why, n, "libnccl has no %s", #name);                      \
        return false;                                                      \
    }
    NC_SYM(ncclCommInitAll)
    NC_SYM(ncclCommDestroy)
    NC_SYM(ncclGetErrorString)
    NC_SYM(ncclGroupStart)
    NC_SYM(ncclGroupEnd)
    NC_SYM(ncclAllReduce)
    NC_SYM(ncclAllGather)
    NC_SYM(ncclReduceScatter)
#undef NC_SYM
    return true;
}

static void measure_nccl(int ngpus)
{
    if (ngpus < 2) {
        skip_line("nccl", "only one GPU is visible");
        return;
    }
    char why[512];
    if (!load_nccl(why, sizeof why)) {
        skip_line("nccl", why);
        return;
    }
    /* NVLink multicast (NVLS) stays off: on shared hosts a program that
     * uses it can take the GPUs out of service. */
    setenv("NCCL_NVLS_ENABLE", "0", 1);
    int nr = ngpus > MAX_GPUS ? MAX_GPUS : ngpus;
    progress("nccl: %d ranks in this process", nr);
    NCCL_CHECK(p_ncclCommInitAll(g_comms, nr, NULL));
    g_ncomms = nr;
    const size_t max_bytes = g_quick ? 16 * MiB : 256 * MiB;
    void *send[MAX_GPUS], *recv[MAX_GPUS];
    cudaStream_t st[MAX_GPUS];
    for (int i = 0; i < nr; i++) {
        CUDA_CHECK(cudaSetDevice(i));
        CUDA_CHECK(cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking));
        track(R_STREAM, (void *)st[i], i);
        send[i] = dev_alloc(max_bytes);
        recv[i] = dev_alloc(max_bytes);
        fill<float>(send[i], max_bytes / 4, 100 + i);
    }
    CUDA_CHECK(cudaSetDevice(0));
    cudaEvent_t e0 = event_new(), e1 = event_new();
    static const char *const ops[] = {"all_reduce", "all_gather",
                                      "reduce_scatter"};
    for (int op = 0; op < 3; op++) {
        for (size_t bytes = 1024; bytes <= max_bytes; bytes *= 8) {
            /* bytes: the buffer of one rank for all_reduce, the gathered
             * output for all_gather, the input for reduce_scatter. */
            size_t part = bytes / 4 / (size_t)nr; /* floats per rank */
            if (op && part == 0)
                continue;
            int iters = bytes <= MiB ? 20 : 5;
            double us[16];
            int reps = g_repeats;
            for (int r = -1; r < reps; r++) {
                CUDA_CHECK(cudaSetDevice(0));
                CUDA_CHECK(cudaEventRecord(e0, st[0]));
                for (int it = 0; it < iters; it++) {
                    NCCL_CHECK(p_ncclGroupStart());
                    for (int i = 0; i < nr; i++) {
                        if (op == 0)
                            NCCL_CHECK(p_ncclAllReduce(
                                send[i], recv[i], bytes / 4, NCCL_FLOAT32,
                                NCCL_SUM, g_comms[i], st[i]));
                        else if (op == 1)
                            NCCL_CHECK(p_ncclAllGather(send[i], recv[i], part,
                                                       NCCL_FLOAT32,
                                                       g_comms[i], st[i]));
                        else
                            NCCL_CHECK(p_ncclReduceScatter(
                                send[i], recv[i], part, NCCL_FLOAT32, NCCL_SUM,
                                g_comms[i], st[i]));
                    }
                    NCCL_CHECK(p_ncclGroupEnd());
                }
                CUDA_CHECK(cudaSetDevice(0));
                CUDA_CHECK(cudaEventRecord(e1, st[0]));
                for (int i = 0; i < nr; i++) {
                    CUDA_CHECK(cudaSetDevice(i));
                    CUDA_CHECK(cudaStreamSynchronize(st[i]));
                }
                CUDA_CHECK(cudaSetDevice(0));
                float ms = 0;
                CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 0)
                    us[r] = 1e3 * ms / iters;
            }
            printf("{\"kind\": \"nccl\", \"op\": \"%s\", \"ranks\": %d, "
                   "\"bytes\": %zu, \"iters\": %d",
                   ops[op], nr, bytes, iters);
            put_arr("us", us, reps);
            end_line();
        }
        progress("nccl: %s done", ops[op]);
    }
    for (int i = 0; i < g_ncomms; i++)
        p_ncclCommDestroy(g_comms[i]);
    g_ncomms = 0;
    for (int i = 0; i < nr; i++) {
        CUDA_CHECK(cudaSetDevice(i));
        dev_free(recv[i]);
        dev_free(send[i]);
        untrack((void *)st[i]);
        CUDA_CHECK(cudaStreamDestroy(st[i]));
    }
    CUDA_CHECK(cudaSetDevice(g_device));
}

/* ------------------------------------------------------------------ */
/* main                                                                 */
/* ------------------------------------------------------------------ */

static void usage(FILE *f)
{
    fputs("Usage: vp-calibrate [--device N] [--repeats N] [--quick] "
          "[--quiet]\n"
          "\n"
          "Measure one GPU for vramplan: CUDA context, cudaMalloc "
          "granularity,\n"
          "largest allocation, launch latency, memory and host-link "
          "bandwidth,\n"
          "cuBLASLt GEMM rates, and NCCL collectives when two or more GPUs "
          "are\n"
          "visible. Raw measurements go to stdout as JSON lines, progress to\n"
          "stderr. `vramplan calibrate` runs this and writes a profile.\n"
          "\n"
          "  --device N    the GPU to measure (default 0)\n"
          "  --repeats N   samples per measurement, 2 to 16 (default 5)\n"
          "  --quick       fewer shapes and smaller buffers (a smoke test)\n"
          "  --quiet       no progress lines\n",
          f);
}

int main(int argc, char **argv)
{
    g_t0 = now_s();
    const char *probe = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--device") && i + 1 < argc) {
            g_device = atoi(argv[++i]);
        } else if (!strcmp(a, "--repeats") && i + 1 < argc) {
            g_repeats = atoi(argv[++i]);
            if (g_repeats < 2 || g_repeats > 16) {
                fprintf(stderr, "vp-calibrate: --repeats must be 2 to 16\n");
                return 2;
            }
        } else if (!strcmp(a, "--quick")) {
            g_quick = true;
        } else if (!strcmp(a, "--quiet")) {
            g_quiet = true;
        } else if (!strcmp(a, "--context-probe") && i + 1 < argc) {
            probe = argv[++i];
        } else {
            fprintf(stderr, "vp-calibrate: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (probe)
        return context_probe(probe);

    /* The probes run before this process touches CUDA, so that its own
     * context is not counted in theirs. */
    printf("{\"kind\": \"start\", \"program\": \"vp-calibrate\", "
           "\"version\": 1, \"repeats\": %d, \"quick\": %s",
           g_repeats, g_quick ? "true" : "false");
    end_line();
    run_context_probes("/proc/self/exe");

    int ngpus = 0;
    CUDA_CHECK(cudaGetDeviceCount(&ngpus));
    CHECK(g_device >= 0 && g_device < ngpus, "no such --device");
    CUDA_CHECK(cudaSetDevice(g_device));
    CUDA_CHECK(cudaFree(0));
    describe_device(ngpus);
    int major = 0, minor = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor,
                                      g_device));
    CUDA_CHECK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor,
                                      g_device));
    g_ev0 = event_new();
    g_ev1 = event_new();

    measure_malloc();
    measure_max_alloc();
    measure_launch();
    measure_device_bw();
    measure_host_bw();
    measure_gemm(10 * major + minor);
    measure_nccl(ngpus);

    cleanup_all();
    double secs = now_s() - g_t0;
    printf("{\"kind\": \"done\", \"seconds\": %.2f", secs);
    end_line();
    progress("done in %.1f s", secs);
    return 0;
}
