/* vp-replay: replay a vramplan training-step trace on a real GPU.
 *
 *   vp-replay EVENTS [--gemm-reps N] [--format table|json]
 *
 * EVENTS is written by 'vramplan replay' (src/cli/replay_cmd.c describes
 * the format): the segments that PyTorch's caching allocator would
 * cudaMalloc and cudaFree during the simulated steps, in order, and the
 * step's GEMMs. This program
 *   1. allocates and frees those segments with real cudaMalloc/cudaFree,
 *      writing every new segment once (cudaMemset) so that it is backed,
 *      and reads the device's memory at the peak (cudaMemGetInfo);
 *   2. times each distinct GEMM with cuBLAS (random operands, a warm-up,
 *      then the median of --gemm-reps timed runs with CUDA events) and
 *      adds them up with their per-step counts.
 * It needs only the CUDA runtime and cuBLAS: no PyTorch, YAML or GSL.
 * Exit status: 0 every segment was allocated, 1 a cudaMalloc failed (the
 * plan does not fit on this GPU), 2 bad input or a CUDA error. */
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <unordered_map>
#include <vector>

/* Every CUDA and cuBLAS call: the statement, function, file and line. */
#define CUDA_CHECK(stmt)                                                      \
    do {                                                                      \
        cudaError_t e_ = (stmt);                                              \
        if (e_ != cudaSuccess)                                                \
            die("CUDA error %s (%s) in %s at %s:%d: %s", cudaGetErrorName(e_), \
                cudaGetErrorString(e_), __func__, __FILE__, __LINE__, #stmt); \
    } while (0)

#define CUBLAS_CHECK(stmt)                                                    \
    do {                                                                      \
        cublasStatus_t s_ = (stmt);                                           \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                      \
            die("cuBLAS error %d in %s at %s:%d: %s", (int)s_, __func__,      \
                __FILE__, __LINE__, #stmt);                                   \
    } while (0)

static void die(const char *fmt, ...)
{
    va_list ap;

    fputs("vp-replay: error: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(2);
}

static double now_s()
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static const double GiB = 1024.0 * 1024.0 * 1024.0;

struct gemm {
    std::string dtype, name;
    char ta, tb;
    uint64_t m, n, k;
    double count;
    double ms;      /* median of the timed runs */
};

struct trace {
    std::string model, setup;
    uint64_t budget = 0, pred_reserved = 0, pred_alloc = 0, pred_device = 0;
    double flops = 0;
    std::vector<gemm> gemms;
};

struct replay_result {
    uint64_t mallocs = 0, frees = 0, reserved = 0, peak_reserved = 0;
    uint64_t context = 0;          /* device used before any segment     */
    uint64_t used_at_peak = 0;     /* device used at the reserved peak   */
    uint64_t total = 0;
    double malloc_s = 0, free_s = 0;
    bool fits = true;
    std::string failure;           /* what failed, when !fits           */
    std::string peak_at;           /* step and phase of the peak         */
};

/* ---- phase 1: the segments ---------------------------------------------- */

static void replay_segments(FILE *f, trace &t, replay_result &r)
{
    std::unordered_map<uint64_t, std::pair<void *, uint64_t>> live;
    char line[8192], where[160] = "setup";
    size_t free_b, total_b;
    unsigned long lineno = 0;
    bool seen_header = false, seen_end = false;

    CUDA_CHECK(cudaFree(0)); /* the context, before anything is measured */
    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    r.total = total_b;
    r.context = total_b - free_b;
    while (fgets(line, sizeof line, f) != NULL) {
        char word[32], a1[64], a2[64];
        unsigned long long x, y;

        lineno++;
        line[strcspn(line, "\n")] = '\0';
        if (sscanf(line, "%31s", word) != 1)
            continue;
        if (!seen_header) {
            int v = 0;
            if (strcmp(word, "vramplan-replay") != 0 ||
                sscanf(line, "%*s %d", &v) != 1 || v != 1)
                die("line %lu: not a vramplan replay file (version 1)",
                    lineno);
            seen_header = true;
        } else if (strcmp(word, "model") == 0) {
            t.model = line + 6;
        } else if (strcmp(word, "setup") == 0) {
            t.setup = line + 6;
        } else if (strcmp(word, "budget") == 0) {
            if (sscanf(line, "%*s %llu", &x) != 1)
                die("line %lu: bad budget", lineno);
            t.budget = x;
        } else if (strcmp(word, "predicted") == 0) {
            unsigned long long c;
            if (sscanf(line, "%*s peak_reserved %llu peak_alloc %llu "
                       "device_used %llu", &x, &y, &c) != 3)
                die("line %lu: bad predicted line", lineno);
            t.pred_reserved = x;
            t.pred_alloc = y;
            t.pred_device = c;
        } else if (strcmp(word, "flops_per_step") == 0) {
            if (sscanf(line, "%*s %lf", &t.flops) != 1)
                die("line %lu: bad flops line", lineno);
        } else if (strcmp(word, "mark") == 0) {
            if (sscanf(line, "%*s %63s %63s", a1, a2) != 2)
                die("line %lu: bad mark", lineno);
            snprintf(where, sizeof where, "step %s %s", a1, a2);
        } else if (strcmp(word, "seg") == 0 && r.fits) {
            char op = 0;
            if (sscanf(line, "%*s %c %llu", &op, &x) != 2)
                die("line %lu: bad segment event", lineno);
            if (op == '+') {
                void *p = NULL;
                double t0;
                cudaError_t e;

                if (sscanf(line, "%*s %*s %*s %llu", &y) != 1 || y == 0)
                    die("line %lu: bad segment size", lineno);
                if (live.count(x))
                    die("line %lu: segment %llu allocated twice", lineno, x);
                if (t.budget && r.reserved + y > t.budget)
                    die("line %lu: the trace passes its own budget", lineno);
                t0 = now_s();
                e = cudaMalloc(&p, y);
                r.malloc_s += now_s() - t0;
                if (e != cudaSuccess) {
                    char msg[512];
                    cudaGetLastError();
                    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
                    snprintf(msg, sizeof msg,
                             "cudaMalloc of %llu bytes failed (%s) at %s "
                             "with %" PRIu64 " bytes reserved; the device "
                             "had %zu bytes free", y, cudaGetErrorName(e),
                             where, r.reserved, free_b);
                    r.fits = false;
                    r.failure = msg;
                    continue;
                }
                CUDA_CHECK(cudaMemsetAsync(p, 0x5a, y));
                live[x] = std::make_pair(p, (uint64_t)y);
                r.mallocs++;
                r.reserved += y;
                if (r.reserved > r.peak_reserved) {
                    r.peak_reserved = r.reserved;
                    r.peak_at = where;
                    CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
                    r.used_at_peak = total_b - free_b;
                }
            } else if (op == '-') {
                auto it = live.find(x);
                double t0;

                if (it == live.end())
                    die("line %lu: segment %llu freed but not live", lineno,
                        x);
                CUDA_CHECK(cudaDeviceSynchronize());
                t0 = now_s();
                CUDA_CHECK(cudaFree(it->second.first));
                r.free_s += now_s() - t0;
                r.reserved -= it->second.second;
                r.frees++;
                live.erase(it);
            } else {
                die("line %lu: bad segment event", lineno);
            }
        } else if (strcmp(word, "gemm") == 0) {
            char dt[16], ta, tb, name[4096];
            unsigned long long m, n, k;
            double count;
            if (sscanf(line, "%*s %15s %c %c %llu %llu %llu %lf %4095s", dt,
                       &ta, &tb, &m, &n, &k, &count, name) != 8)
                die("line %lu: bad gemm", lineno);
            t.gemms.push_back(gemm{dt, name, ta, tb, m, n, k, count, 0.0});
        } else if (strcmp(word, "end") == 0) {
            seen_end = true;
            break;
        } else if (strcmp(word, "seg") != 0) {
            die("line %lu: unknown record '%s'", lineno, word);
        }
    }
    if (!seen_end)
        die("the trace ends early (no 'end' line)");
    CUDA_CHECK(cudaDeviceSynchronize());
    for (auto &kv : live)
        CUDA_CHECK(cudaFree(kv.second.first));
}

/* ---- phase 2: the GEMMs ---------------------------------------------------- */

__global__ void fill_kernel(void *buf, size_t n, int kind, uint32_t seed)
{
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    size_t stride = (size_t)gridDim.x * blockDim.x;

    for (; i < n; i += stride) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 16;
        h *= 0x85ebca6bu;
        h ^= h >> 13;
        float v = (float)(h & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
        if (kind == 0)
            ((float *)buf)[i] = v;
        else if (kind == 1)
            ((__nv_bfloat16 *)buf)[i] = __float2bfloat16(v);
        else
            ((__half *)buf)[i] = __float2half(v);
    }
}

static int kind_of(const std::string &dt)
{
    return dt == "bf16" ? 1 : dt == "f16" ? 2 : 0;
}

static size_t elem_bytes(const std::string &dt)
{
    return kind_of(dt) == 0 ? 4 : 2;
}

static void fill(void *buf, size_t n, int kind, uint32_t seed)
{
    if (n == 0)
        return;
    fill_kernel<<<1024, 256>>>(buf, n, kind, seed);
    CUDA_CHECK(cudaGetLastError());
}

static void time_gemms(trace &t, uint64_t reps)
{
    size_t max_a = 0, max_b = 0, max_c = 0;
    void *A = NULL, *B = NULL, *C = NULL;
    cublasHandle_t h;
    cudaEvent_t e0, e1;
    int filled = -1;

    if (t.gemms.empty() || reps == 0)
        return;
    std::stable_sort(t.gemms.begin(), t.gemms.end(),
                     [](const gemm &x, const gemm &y) {
                         return kind_of(x.dtype) < kind_of(y.dtype);
                     });
    for (const gemm &g : t.gemms) {
        size_t eb = elem_bytes(g.dtype);
        max_a = std::max(max_a, (size_t)(g.m * g.k * eb));
        max_b = std::max(max_b, (size_t)(g.k * g.n * eb));
        max_c = std::max(max_c, (size_t)(g.m * g.n * eb));
    }
    CUDA_CHECK(cudaMalloc(&A, max_a));
    CUDA_CHECK(cudaMalloc(&B, max_b));
    CUDA_CHECK(cudaMalloc(&C, max_c));
    CUBLAS_CHECK(cublasCreate(&h));
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    for (gemm &g : t.gemms) {
        int kind = kind_of(g.dtype);
        cudaDataType_t dt = kind == 1 ? CUDA_R_16BF
                            : kind == 2 ? CUDA_R_16F : CUDA_R_32F;
        cublasComputeType_t ct = g.dtype == "tf32"
                                     ? CUBLAS_COMPUTE_32F_FAST_TF32
                                     : CUBLAS_COMPUTE_32F;
        cublasOperation_t oa = g.ta == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N;
        cublasOperation_t ob = g.tb == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N;
        int m = (int)g.m, n = (int)g.n, k = (int)g.k;
        int lda = g.ta == 'T' ? k : m, ldb = g.tb == 'T' ? n : k, ldc = m;
        float alpha = 1.0f, beta = 0.0f;
        std::vector<float> ms;

        if (g.m > INT32_MAX || g.n > INT32_MAX || g.k > INT32_MAX)
            die("GEMM %s too large for cublasGemmEx", g.name.c_str());
        if (kind != filled) {
            /* fresh random operands for each element type */
            fill(A, max_a / elem_bytes(g.dtype), kind, 0x1234u);
            fill(B, max_b / elem_bytes(g.dtype), kind, 0xbeefu);
            filled = kind;
        }
        for (uint64_t i = 0; i < 2 + reps; i++) {
            CUDA_CHECK(cudaEventRecord(e0));
            CUBLAS_CHECK(cublasGemmEx(h, oa, ob, m, n, k, &alpha, A, dt, lda,
                                      B, dt, ldb, &beta, C, dt, ldc, ct,
                                      CUBLAS_GEMM_DEFAULT));
            CUDA_CHECK(cudaEventRecord(e1));
            CUDA_CHECK(cudaEventSynchronize(e1));
            float el;
            CUDA_CHECK(cudaEventElapsedTime(&el, e0, e1));
            if (i >= 2)
                ms.push_back(el);
        }
        std::sort(ms.begin(), ms.end());
        g.ms = ms.size() % 2 ? ms[ms.size() / 2]
                             : 0.5 * (ms[ms.size() / 2 - 1] + ms[ms.size() / 2]);
    }
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUBLAS_CHECK(cublasDestroy(h));
    CUDA_CHECK(cudaFree(A));
    CUDA_CHECK(cudaFree(B));
    CUDA_CHECK(cudaFree(C));
}

/* ---- report ------------------------------------------------------------------ */

static void print_table(const trace &t, const replay_result &r,
                        const char *gpu, uint64_t reps)
{
    double gemm_ms = 0, gemm_flops = 0;

    printf("model        %s (%s)\n", t.model.c_str(), t.setup.c_str());
    printf("gpu          %s, %.2f GiB\n", gpu, r.total / GiB);
    printf("budget       %.2f GiB (%" PRIu64 " bytes)\n", t.budget / GiB,
           t.budget);
    printf("segments     %" PRIu64 " cudaMalloc (%.1f ms), %" PRIu64
           " cudaFree (%.1f ms)\n", r.mallocs, r.malloc_s * 1e3, r.frees,
           r.free_s * 1e3);
    printf("reserved     peak %.3f GiB (%" PRIu64 " bytes) at %s; "
           "predicted %" PRIu64 "%s\n", r.peak_reserved / GiB,
           r.peak_reserved, r.peak_at.c_str(), t.pred_reserved,
           r.fits && r.peak_reserved == t.pred_reserved ? " (equal)" : "");
    printf("device used  %.3f GiB at the peak = %.3f GiB of segments + "
           "%.3f GiB (this program's context and driver overhead)\n",
           r.used_at_peak / GiB, r.peak_reserved / GiB,
           ((double)r.used_at_peak - (double)r.peak_reserved) / GiB);
    if (t.pred_device)
        printf("with PyTorch %.3f GiB predicted (its context included); "
               "%.3f GiB of the device left\n", t.pred_device / GiB,
               ((double)r.total - (double)t.pred_device) / GiB);
    if (r.fits)
        printf("fits         yes: every segment was allocated on the GPU\n");
    else
        printf("fits         NO: %s\n", r.failure.c_str());
    if (t.gemms.empty() || reps == 0)
        return;
    printf("\n%-5s %2s %6s %6s %6s %6s %9s %9s  %s\n", "dtype", "op", "m",
           "n", "k", "count", "ms", "TFLOP/s", "first op");
    for (const gemm &g : t.gemms) {
        double fl = 2.0 * (double)g.m * (double)g.n * (double)g.k;
        printf("%-5s %c%c %6" PRIu64 " %6" PRIu64 " %6" PRIu64 " %6.0f "
               "%9.4f %9.1f  %s\n", g.dtype.c_str(), g.ta, g.tb, g.m, g.n,
               g.k, g.count, g.ms, g.ms > 0 ? fl / (g.ms * 1e-3) / 1e12 : 0,
               g.name.c_str());
        gemm_ms += g.count * g.ms;
        gemm_flops += g.count * fl;
    }
    printf("\nGEMMs        %.2f ms per step, %.1f TFLOP/s, %.3g of the "
           "step's %.3g FLOPs (median of %" PRIu64 " runs each)\n", gemm_ms,
           gemm_ms > 0 ? gemm_flops / (gemm_ms * 1e-3) / 1e12 : 0,
           gemm_flops, t.flops, reps);
}

static void print_json(const trace &t, const replay_result &r,
                       const char *gpu, uint64_t reps)
{
    double gemm_ms = 0, gemm_flops = 0;

    printf("{\"model\": \"%s\", \"gpu\": \"%s\", \"total\": %" PRIu64
           ", \"budget\": %" PRIu64 ", \"fits\": %s, \"mallocs\": %" PRIu64
           ", \"frees\": %" PRIu64 ", \"malloc_ms\": %.3f, \"free_ms\": "
           "%.3f, \"peak_reserved\": %" PRIu64 ", \"predicted_reserved\": %"
           PRIu64 ", \"used_at_peak\": %" PRIu64 ", \"context\": %" PRIu64
           ", \"gemms\": [", t.model.c_str(), gpu, r.total, t.budget,
           r.fits ? "true" : "false", r.mallocs, r.frees, r.malloc_s * 1e3,
           r.free_s * 1e3, r.peak_reserved, t.pred_reserved, r.used_at_peak,
           r.context);
    for (size_t i = 0; reps > 0 && i < t.gemms.size(); i++) {
        const gemm &g = t.gemms[i];
        double fl = 2.0 * (double)g.m * (double)g.n * (double)g.k;
        printf("%s{\"dtype\": \"%s\", \"op\": \"%c%c\", \"m\": %" PRIu64
               ", \"n\": %" PRIu64 ", \"k\": %" PRIu64 ", \"count\": %.0f, "
               "\"ms\": %.5f}", i ? ", " : "", g.dtype.c_str(), g.ta, g.tb,
               g.m, g.n, g.k, g.count, g.ms);
        gemm_ms += g.count * g.ms;
        gemm_flops += g.count * fl;
    }
    printf("], \"gemm_ms_per_step\": %.3f, \"gemm_flops_per_step\": %.6e, "
           "\"flops_per_step\": %.6e}\n", gemm_ms, gemm_flops, t.flops);
}

int main(int argc, char **argv)
{
    const char *path = NULL, *format = "table";
    uint64_t reps = 10;
    cudaDeviceProp prop;
    replay_result r;
    trace t;
    FILE *f;

    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--gemm-reps") == 0 && i + 1 < argc)
            reps = strtoull(argv[++i], NULL, 10);
        else if (strcmp(argv[i], "--format") == 0 && i + 1 < argc)
            format = argv[++i];
        else if (argv[i][0] != '-' && path == NULL)
            path = argv[i];
        else
            die("usage: vp-replay EVENTS [--gemm-reps N] [--format "
                "table|json]");
    }
    if (path == NULL)
        die("usage: vp-replay EVENTS [--gemm-reps N] [--format table|json]");
    f = fopen(path, "r");
    if (f == NULL)
        die("cannot open '%s'", path);
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    replay_segments(f, t, r);
    fclose(f);
    if (r.fits)
        time_gemms(t, reps);
    if (strcmp(format, "json") == 0)
        print_json(t, r, prop.name, reps);
    else
        print_table(t, r, prop.name, reps);
    return r.fits ? 0 : 1;
}
