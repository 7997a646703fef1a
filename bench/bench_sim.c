/* Benchmark of the single-GPU simulator (make bench), on one core.
 *
 * Allocator events per second of vp_simulate over three training setups
 * (llama-3-70b and llama-3-8b in amp-bf16, gpt2-small in fp32), best of
 * seven runs, the layer breakdown pass off. Two baselines measured in the
 * same run, so that the figures compare across machines and loads:
 *  - the allocator alone: the same event stream (recorded once through
 *    the event callback) replayed through the public allocator API;
 *  - a fixed reference workload that no vramplan code takes part in:
 *    qsort of 2^20 pseudo-random 64-bit keys (elements sorted per
 *    second).
 * Printed: events/s, the share of the allocator (replay time / simulator
 * time) and events/s per million sorted keys/s (the machine-independent
 * figure docs/CLUSTER.md quotes). Times are CPU times of the process.
 * Nothing passes or fails. */
#define _POSIX_C_SOURCE 200809L
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vramplan/allocator.h"
#include "vramplan/vramplan.h"

/* CPU time of this process: the machine may be shared, and a run that
 * waits for a core should not count the wait. */
static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* ------------------------------------------------------ reference work */

static int cmp_u64(const void *x, const void *y)
{
    uint64_t p = *(const uint64_t *)x, q = *(const uint64_t *)y;
    return p < q ? -1 : p > q;
}

/* Keys sorted per second by qsort, best of 5. */
static double sort_rate(void)
{
    enum { N = 1 << 20 };
    uint64_t *v = malloc(N * sizeof *v);
    if (!v)
        return 0;
    double best = 1e30;
    for (int r = 0; r < 5; r++) {
        uint64_t x = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < N; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            v[i] = x;
        }
        double t0 = now();
        qsort(v, N, sizeof *v, cmp_u64);
        double t = now() - t0;
        if (t < best)
            best = t;
    }
    free(v);
    return N / best;
}

/* --------------------------------------------------- event recording */

/* One allocator event: a malloc of `bytes`, or the free of the malloc
 * numbered `ref`. */
typedef struct {
    uint64_t bytes;
    uint32_t ref;
    uint8_t is_free;
} rec;

typedef struct {
    rec *r;
    size_t n, cap;
    struct live { uint64_t handle; uint32_t id; } *live; /* not yet freed */
    size_t nl, capl;
    bool failed;
} recorder;

static bool push(void **p, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return true;
    size_t c = *cap ? 2 * *cap : 4096;
    void *q = realloc(*p, c * elem);
    if (!q)
        return false;
    *p = q;
    *cap = c;
    return true;
}

static void on_event(const vp_sim_event *ev, void *ud)
{
    recorder *R = ud;
    if (R->failed || !push((void **)&R->r, &R->cap, R->n, sizeof *R->r)) {
        R->failed = true;
        return;
    }
    rec *x = &R->r[R->n];
    x->bytes = ev->bytes;
    x->is_free = ev->is_free;
    x->ref = 0;
    if (!ev->is_free) {
        if (!push((void **)&R->live, &R->capl, R->nl, sizeof *R->live)) {
            R->failed = true;
            return;
        }
        R->live[R->nl++] = (struct live){ev->tensor, (uint32_t)R->n};
    } else {
        size_t k = R->nl; /* the most recent first: short-lived tensors */
        while (k-- > 0 && R->live[k].handle != ev->tensor)
            ;
        if (k == SIZE_MAX) {
            R->failed = true;
            return;
        }
        x->ref = R->live[k].id;
        R->live[k] = R->live[--R->nl];
    }
    R->n++;
}

/* Seconds to replay R through a fresh allocator, best of 7. */
static double replay(const recorder *R)
{
    uint64_t *h = calloc(R->n ? R->n : 1, sizeof *h);
    if (!h)
        return -1;
    double best = 1e30;
    for (int it = 0; it < 7; it++) {
        vp_error err;
        vp_allocator_config cfg;
        vp_allocator_config_init(&cfg);
        vp_allocator *a = vp_allocator_new(&cfg, &err);
        if (!a)
            break;
        double t0 = now();
        for (size_t i = 0; i < R->n; i++) {
            const rec *x = &R->r[i];
            if (x->is_free)
                vp_allocator_release(a, h[x->ref], &err);
            else
                vp_allocator_malloc(a, x->bytes, 0, &h[i], &err);
        }
        double t = now() - t0;
        vp_allocator_free(a);
        if (t < best)
            best = t;
    }
    free(h);
    return best;
}

/* ------------------------------------------------------------ the runs */

typedef struct {
    const char *model;
    uint64_t batch, seq;
    vp_precision prec;
} setup_row;

/* A setup of this tree: its model, graph and setup (the layer breakdown
 * off). */
typedef struct {
    vp_model *m;
    vp_graph *g;
    vp_setup s;
} run_setup;

/* false with the message printed */
static bool setup_of(const setup_row *row, run_setup *r)
{
    vp_error err;
    r->m = vp_model_load(row->model, &err);
    r->g = r->m ? vp_graph_build(r->m, row->batch, row->seq, &err) : NULL;
    if (!r->g) {
        fprintf(stderr, "bench: %s: %s\n", row->model, err.msg);
        vp_model_free(r->m);
        return false;
    }
    vp_setup_init(&r->s);
    r->s.batch = row->batch;
    r->s.precision = row->prec;
    r->s.skip_breakdown = true;
    return true;
}

static void setup_free(run_setup *r)
{
    vp_graph_free(r->g);
    vp_model_free(r->m);
}

#ifdef VP_BENCH_BASE
/* The baseline simulator, linked in from build/bench/baseline
 * (bench/baseline/sim_base.c): it reads the model files of its own
 * commit. */
void *vp_bench_base_open(const char *model, uint64_t batch, uint64_t seq,
                         const char *precision, char *msg, size_t n);
int vp_bench_base_sim(void *run, uint64_t *events);
void vp_bench_base_close(void *run);

static void *base_open(const setup_row *row)
{
    char path[512], msg[512];
    snprintf(path, sizeof path, "%s%s", VP_BENCH_BASE, row->model);
    void *b = vp_bench_base_open(path, row->batch, row->seq,
                                 vp_precision_name(row->prec), msg,
                                 sizeof msg);
    if (!b)
        fprintf(stderr, "bench: baseline: %s\n", msg);
    return b;
}
#endif

/* Best CPU time of one simulation by this tree (*cur) and by the
 * baseline (*base, when `b`), seven runs of each, interleaved so that a
 * change in the machine's load hits both alike. */
static bool time_both(const vp_graph *g, const vp_setup *s, vp_estimate *e,
                      void *b, double *cur, double *base,
                      uint64_t *base_events)
{
    vp_error err;
    *cur = *base = 1e30;
    for (int i = 0; i < 7; i++) {
        double t0 = now();
        if (vp_simulate(g, s, e, NULL, NULL, &err) != VP_OK) {
            fprintf(stderr, "bench: %s\n", err.msg);
            return false;
        }
        double t = now() - t0;
        if (t < *cur)
            *cur = t;
#ifdef VP_BENCH_BASE
        if (!b)
            continue;
        t0 = now();
        if (vp_bench_base_sim(b, base_events))
            return false;
        t = now() - t0;
        if (t < *base)
            *base = t;
#else
        (void)b, (void)base_events;
#endif
    }
    return true;
}

static int bench_one(const setup_row *row, double sort_keys_s)
{
    vp_error err;
    run_setup rs;
    if (!setup_of(row, &rs))
        return 1;
    vp_estimate e;
    recorder R;
    memset(&R, 0, sizeof R);
    vp_simulate(rs.g, &rs.s, &e, on_event, &R, &err);
    void *b = NULL;
#ifdef VP_BENCH_BASE
    b = base_open(row);
#endif
    double best, base;
    uint64_t base_events = 0;
    bool ok = time_both(rs.g, &rs.s, &e, b, &best, &base, &base_events);
    double rate = (double)e.events / best;
    double rt = R.failed ? -1 : replay(&R);
    if (ok) {
        printf("  %-22s b%-3llu s%-5llu %-8s %7llu events  %8.3f ms  "
               "%6.2f Mev/s  allocator %4.0f%%  %5.2f ev/s per key/s\n",
               row->model + strlen("models/"),
               (unsigned long long)row->batch, (unsigned long long)row->seq,
               vp_precision_name(row->prec), (unsigned long long)e.events,
               1e3 * best, rate / 1e6, rt > 0 ? 100 * rt / best : 0,
               rate / sort_keys_s);
        if (b) {
            double brate = (double)base_events / base;
            printf("  %-22s %-21s %7llu events  %8.3f ms  %6.2f Mev/s  "
                   "speedup %.2f (events/s)\n",
                   "  baseline", "", (unsigned long long)base_events,
                   1e3 * base, brate / 1e6, rate / brate);
        }
    }
#ifdef VP_BENCH_BASE
    vp_bench_base_close(b);
#endif
    free(R.r);
    free(R.live);
    setup_free(&rs);
    return ok ? 0 : 1;
}

/* bench_sim --once [K]: one simulation of each setup (of setup K alone,
 * from 0), no timing and no baselines: the run to profile with callgrind
 * (valgrind --tool=callgrind --toggle-collect=vp_simulate). With
 * --once-base, the baseline simulator's simulation of the same setups.
 * bench_sim --loop K N: N simulations of setup K by this tree, the run to
 * sample with perf (perf record -e cpu-clock). */
static int once(const setup_row *row, bool base, unsigned long reps)
{
    uint64_t events = 0;
    int rc = 1;
    if (base) {
#ifdef VP_BENCH_BASE
        void *b = base_open(row);
        rc = b ? vp_bench_base_sim(b, &events) : 1;
        vp_bench_base_close(b);
#else
        fprintf(stderr, "bench: no baseline built in\n");
#endif
    } else {
        vp_error err;
        run_setup rs;
        if (!setup_of(row, &rs))
            return 1;
        vp_estimate e;
        rc = 0;
        for (unsigned long n = 0; n < reps && rc == 0; n++)
            rc = vp_simulate(rs.g, &rs.s, &e, NULL, NULL, &err) ? 1 : 0;
        events = e.events;
        setup_free(&rs);
    }
    printf("  %-22s %7llu events\n", row->model + strlen("models/"),
           (unsigned long long)events);
    return rc;
}

int main(int argc, char **argv)
{
    static const setup_row rows[] = {
        {"models/llama-3-70b.yaml", 1, 2048, VP_PREC_AMP_BF16},
        {"models/llama-3-8b.yaml", 2, 2048, VP_PREC_AMP_BF16},
        {"models/gpt2-small.yaml", 8, 1024, VP_PREC_FP32},
        {"models/gpt2-medium.yaml", 8, 1024, VP_PREC_AMP_BF16},
        {"models/resnet50.yaml", 64, 0, VP_PREC_FP32},
    };
    size_t nrows = sizeof rows / sizeof rows[0];
    bool base = argc > 1 && strcmp(argv[1], "--once-base") == 0;
    bool loop = argc == 4 && strcmp(argv[1], "--loop") == 0;
    if (argc > 1 && (base || loop || strcmp(argv[1], "--once") == 0)) {
        unsigned long reps = loop ? strtoul(argv[3], NULL, 10) : 1;
        for (size_t i = 0; i < nrows; i++)
            if ((argc < 3 || strtoul(argv[2], NULL, 10) == i) &&
                once(&rows[i], base, reps))
                return 1;
        return 0;
    }
    double keys = sort_rate();
    printf("simulator benchmark (one core)\n");
#ifdef VP_BENCH_BASE
    printf("  baseline       the issue's simulator (%s), same process\n",
           VP_BENCH_BASE);
#else
    printf("  baseline       not built in (no git history)\n");
#endif
    printf("  reference      qsort %.3g keys/s (2^20 64-bit keys)\n", keys);
    for (size_t i = 0; i < nrows; i++)
        if (bench_one(&rows[i], keys))
            return 1;
    return 0;
}
