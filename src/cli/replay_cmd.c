/* vramplan replay: replay the simulated training step on a real GPU.
 *
 *   vramplan replay models/gpt2-small.yaml --batch 10 --precision amp-bf16 \
 *       --budget 16GiB
 *
 * The step is simulated here (the library, with libyaml and GSL); every
 * allocation and free of the simulation goes through a second instance of
 * the caching-allocator model, whose segment hook says when PyTorch would
 * cudaMalloc a new segment and when it would cudaFree one. Those segment
 * events, and the GEMMs of the graph (linear layers and convolutions as
 * matrix products, forward and backward), are written to a small text file
 * that build/replay/vp-replay (replay/vp_replay.cu, built with nvcc where
 * a GPU is) replays with real cudaMalloc/cudaFree and cuBLAS. So the GPU
 * side needs only the CUDA toolkit: no YAML, no GSL, no PyTorch.
 *
 * Event file (version 1), one record a line:
 *   vramplan-replay 1
 *   model NAME
 *   setup batch B seq S precision P steps N accum A
 *   budget BYTES
 *   predicted peak_reserved BYTES peak_alloc BYTES device_used BYTES
 *   flops_per_step F
 *   mark STEP PHASE              the simulation enters a step's phase
 *   seg + ADDR SIZE              cudaMalloc of a segment (ADDR: its id)
 *   seg - ADDR                   cudaFree of that segment
 *   gemm DTYPE TA TB M N K COUNT NAME   COUNT such products per step
 *   end */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cli.h"
#include "vramplan/vramplan.h"

#define REPLAYER_REL "build/replay/vp-replay"

static void replay_help(FILE *f)
{
    fputs(
        "Usage: vramplan replay MODEL --budget SIZE [SETUP] [OPTIONS]\n"
        "\n"
        "Replay the simulated training step on a real GPU, without PyTorch: "
        "the\n"
        "segments that PyTorch's caching allocator would cudaMalloc and "
        "cudaFree\n"
        "(decided by vramplan's allocator model, event by event) are "
        "allocated\n"
        "and freed for real, in order, and the step's GEMMs (linear layers "
        "and\n"
        "convolutions as matrix products, forward and backward) are timed "
        "with\n"
        "cuBLAS. It confirms on the hardware that the plan's segments fit "
        "next to\n"
        "the CUDA context, and times the step's matrix work.\n"
        "\n"
        "The simulation runs here; the GPU part is build/replay/vp-replay\n"
        "(make replay, where nvcc is), which reads a small event file.\n"
        "\n"
        "Setup (as for 'vramplan estimate'):\n"
        "  -b, --batch N           micro-batch size (default 1)\n"
        "  -s, --seq N             sequence length or image side\n"
        "  -p, --precision P       fp32, amp-bf16, amp-fp16, bf16, fp16\n"
        "  -o, --optimizer O       adamw, adamw-fused, adamw-forloop, sgd, ...\n"
        "  -c, --checkpoint SPEC   none, all or segment names\n"
        "  --accum N               micro-batches per optimizer step\n"
        "  --attention IMPL        sdpa, flash, efficient, eager, math\n"
        "  --steps N               steps to replay (default 2)\n"
        "  --keep-grads            zero_grad(set_to_none=False)\n"
        "  --budget SIZE           the allocator's budget (required)\n"
        "\n"
        "Options:\n"
        "  --events FILE           write the event file and stop (no GPU "
        "needed)\n"
        "  --replayer PATH         the GPU program (default: "
        "$VRAMPLAN_REPLAYER,\n"
        "                          else build/replay/vp-replay beside the "
        "vramplan\n"
        "                          binary, else vp-replay in PATH)\n"
        "  --gemm-reps N           timed repetitions of each GEMM (default "
        "10;\n"
        "                          0: no GEMMs)\n"
        "  -f, --format FMT        table (default) or json\n"
        "  -h, --help              show this help\n"
        "\n"
        "Exit status 0 when the step's segments were allocated on the GPU, 1 "
        "when\nit does not fit (in the simulation, or cudaMalloc failed).\n"
        "\n",
        f);
    cli_exit_help(f);
}

typedef struct replay_args {
    cli_args args;
    const char *model_path;
    const char *checkpoint;
    const char *events;
    const char *replayer;
    const char *format;
    uint64_t gemm_reps;
    vp_setup setup;
} replay_args;

/* ---- options ------------------------------------------------------------ */

enum { R_EVENTS = CLI_O__SETUP, R_REPLAYER, R_GEMM_REPS, R_FORMAT };

static const char *const FORMATS[] = {"table", "json", NULL};

static const cli_opt OPTS[] = {
    CLI_ROW_BATCH, CLI_ROW_SEQ, CLI_ROW_PRECISION(""), CLI_ROW_OPTIMIZER(""),
    CLI_ROW_CHECKPOINT(""), CLI_ROW_ACCUM, CLI_ROW_ATTENTION(""),
    CLI_ROW_STEPS(""), CLI_ROW_KEEP_GRADS, CLI_ROW_BUDGET(""),
    {.id = R_EVENTS, .name = "events", .metavar = "FILE",
     .type = CLI_ARG_STRING},
    {.id = R_REPLAYER, .name = "replayer", .metavar = "PATH",
     .type = CLI_ARG_STRING},
    {.id = R_GEMM_REPS, .name = "gemm-reps", .metavar = "N",
     .type = CLI_ARG_U64, .max = 100000},
    {.id = R_FORMAT, .short_name = 'f', .name = "format", .metavar = "FMT",
     .type = CLI_ARG_ENUM, .choices = FORMATS, .what = "format"},
    CLI_HELP_ROW,
};

static int replay_parse(int argc, char **argv, replay_args *a)
{
    cli_spec spec = {OPTS, sizeof OPTS / sizeof OPTS[0], 0, 1,
                     "replay takes one MODEL", false, replay_help};
    const cli_val *v = a->args.v;
    int rc;

    memset(a, 0, sizeof *a);
    vp_setup_init(&a->setup);
    a->setup.steps = VP_STEADY_STEPS;
    a->gemm_reps = 10;
    a->format = "table";
    if ((rc = cli_args_parse(&spec, argc, argv, &a->args)) >= 0 ||
        (rc = cli_setup_common(v, true, &a->setup)) >= 0)
        return rc;
    a->checkpoint = v[CLI_O_CHECKPOINT].given ? v[CLI_O_CHECKPOINT].text
                                              : NULL;
    if (a->checkpoint != NULL && strcmp(a->checkpoint, "auto") == 0)
        return cli_usage_error("--checkpoint takes none, all or segment "
                               "names");
    a->events = v[R_EVENTS].given ? v[R_EVENTS].text : NULL;
    a->replayer = v[R_REPLAYER].given ? v[R_REPLAYER].text : NULL;
    if (v[R_GEMM_REPS].given)
        a->gemm_reps = v[R_GEMM_REPS].u;
    if (v[R_FORMAT].given)
        a->format = FORMATS[v[R_FORMAT].choice];
    a->model_path = a->args.n_operands ? a->args.operands[0] : NULL;
    if (a->model_path == NULL)
        return cli_usage_error("replay needs a MODEL file");
    if (a->setup.alloc.limit == 0)
        return cli_usage_error("replay needs --budget");
    return -1;
}

/* ---- the trace ------------------------------------------------------------ */

/* tensor id -> allocator handle, open addressing (keys never 0: ids 0 are
 * zero-byte tensors, which take no block). */
typedef struct idmap {
    uint64_t *key, *val;
    size_t cap, n;
} idmap;

static size_t slot_of(uint64_t k, size_t cap)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

static bool idmap_put(idmap *m, uint64_t k, uint64_t v)
{
    if (2 * (m->n + 1) > m->cap) {
        size_t nc = m->cap ? 2 * m->cap : 1024;
        uint64_t *nk = calloc(nc, sizeof *nk), *nv = calloc(nc, sizeof *nv);

        if (nk == NULL || nv == NULL) {
            free(nk);
            free(nv);
            return false;
        }
        for (size_t i = 0; i < m->cap; i++)
            if (m->key[i] != 0) {
                size_t s = slot_of(m->key[i], nc);

                while (nk[s] != 0)
                    s = (s + 1) & (nc - 1);
                nk[s] = m->key[i];
                nv[s] = m->val[i];
            }
        free(m->key);
        free(m->val);
        m->key = nk;
        m->val = nv;
        m->cap = nc;
    }
    size_t s = slot_of(k, m->cap);
    while (m->key[s] != 0 && m->key[s] != k)
        s = (s + 1) & (m->cap - 1);
    if (m->key[s] == 0)
        m->n++;
    m->key[s] = k;
    m->val[s] = v;
    return true;
}

/* Remove k; its value in *v. False if absent. */
static bool idmap_take(idmap *m, uint64_t k, uint64_t *v)
{
    size_t s, j;

    if (m->cap == 0)
        return false;
    s = slot_of(k, m->cap);
    while (m->key[s] != 0 && m->key[s] != k)
        s = (s + 1) & (m->cap - 1);
    if (m->key[s] == 0)
        return false;
    *v = m->val[s];
    /* backward-shift deletion */
    j = s;
    for (;;) {
        j = (j + 1) & (m->cap - 1);
        if (m->key[j] == 0)
            break;
        size_t home = slot_of(m->key[j], m->cap);
        bool move = s <= j ? (home <= s || home > j) : (home <= s && home > j);
        if (move) {
            m->key[s] = m->key[j];
            m->val[s] = m->val[j];
            s = j;
        }
    }
    m->key[s] = 0;
    m->n--;
    return true;
}

typedef struct trace {
    FILE *f;
    vp_allocator *a;
    idmap live;
    uint32_t step;
    int phase;
    uint64_t segs_alloc, segs_free;
    vp_status st;      /* first failure                              */
    vp_error err;
} trace;

static void on_segment(bool is_free, uint64_t addr, uint64_t size, void *ud)
{
    trace *t = ud;

    if (is_free) {
        fprintf(t->f, "seg - %" PRIu64 "\n", addr);
        t->segs_free++;
    } else {
        fprintf(t->f, "seg + %" PRIu64 " %" PRIu64 "\n", addr, size);
        t->segs_alloc++;
    }
}

/* Every simulated allocation and free, through the second allocator. */
static void on_event(const vp_sim_event *ev, void *ud)
{
    trace *t = ud;
    vp_allocator_stats s;
    uint64_t h = 0;

    if (t->st != VP_OK)
        return;
    if (ev->step != t->step || (int)ev->phase != t->phase) {
        t->step = ev->step;
        t->phase = (int)ev->phase;
        fprintf(t->f, "mark %" PRIu32 " %s\n", ev->step,
                vp_phase_name(ev->phase));
    }
    if (ev->is_free) {
        if (ev->tensor != 0) {
            if (!idmap_take(&t->live, ev->tensor, &h)) {
                t->st = vp_error_set(&t->err, VP_EARG,
                                     "event %" PRIu64 " frees tensor %" PRIu64
                                     ", which is not live", ev->seq,
                                     ev->tensor);
                return;
            }
            t->st = vp_allocator_release(t->a, h, &t->err);
        }
    } else if (ev->bytes > 0) {
        t->st = vp_allocator_malloc(t->a, ev->bytes, 0, &h, &t->err);
        if (t->st == VP_OK && !idmap_put(&t->live, ev->tensor, h))
            t->st = vp_error_set(&t->err, VP_ENOMEM, "out of memory");
    }
    if (t->st != VP_OK)
        return;
    vp_allocator_stats_get(t->a, &s);
    if (s.allocated != ev->allocated || s.reserved != ev->reserved)
        t->st = vp_error_set(&t->err, VP_ERANGE,
                             "the replayed allocator differs from the "
                             "simulation at event %" PRIu64 " (allocated %"
                             PRIu64 " vs %" PRIu64 ", reserved %" PRIu64
                             " vs %" PRIu64 ")", ev->seq, s.allocated,
                             ev->allocated, s.reserved, ev->reserved);
}

/* ---- GEMMs ------------------------------------------------------------------ */

typedef struct gemm {
    const char *dtype;   /* f32, tf32, bf16, f16                     */
    char ta, tb;         /* 'N' or 'T', cuBLAS column-major          */
    uint64_t m, n, k;
    double count;        /* per optimizer step                       */
    const char *name;    /* first op with this shape                 */
} gemm;

typedef struct gemms {
    gemm *v;
    size_t n, cap;
} gemms;

static bool gemm_add(gemms *g, const char *dtype, char ta, char tb,
                     uint64_t m, uint64_t n, uint64_t k, double count,
                     const char *name)
{
    if (m == 0 || n == 0 || k == 0 || count <= 0)
        return true;
    for (size_t i = 0; i < g->n; i++) {
        gemm *x = &g->v[i];

        if (x->dtype == dtype && x->ta == ta && x->tb == tb && x->m == m &&
            x->n == n && x->k == k) {
            x->count += count;
            return true;
        }
    }
    if (g->n == g->cap) {
        size_t nc = g->cap ? 2 * g->cap : 32;
        gemm *nv = realloc(g->v, nc * sizeof *nv);

        if (nv == NULL)
            return false;
        g->v = nv;
        g->cap = nc;
    }
    g->v[g->n++] = (gemm){dtype, ta, tb, m, n, k, count, name};
    return true;
}

/* The matrix products of one op, as cuBLAS sees row-major PyTorch
 * tensors: forward Y[M,N] = X[M,K] W[N,K]^T, backward dX = dY W and
 * dW = dY^T X. Convolutions as implicit GEMMs per group: M = batch x
 * output pixels, N = out channels / groups, K = in channels / groups x
 * kernel^2. */
static bool op_gemms(gemms *g, const vp_graph *gr, const vp_op *o,
                     const vp_setup *s, bool recompute)
{
    const char *dt;
    uint64_t m, n, k, groups = 1;
    double per = (double)(s->inference ? 1 : s->accum);
    bool in_grad;

    if (o->kind == VP_OP_LINEAR) {
        if (o->out_features == 0)
            return true;
        n = o->out_features;
        k = o->in_features;
        m = o->numel / n;
    } else if (o->kind == VP_OP_CONV2D) {
        groups = o->groups ? o->groups : 1;
        if (o->ndim != 4)
            return true;
        m = o->shape[0] * o->shape[2] * o->shape[3];
        n = o->shape[1] / groups;
        k = o->in_features / groups * o->kernel * o->kernel;
    } else {
        return true;
    }
    switch (s->precision) {
    case VP_PREC_FP32:
        /* PyTorch: matmul in full fp32, cuDNN convolutions in TF32 */
        dt = o->kind == VP_OP_CONV2D ? "tf32" : "f32";
        break;
    case VP_PREC_AMP_FP16:
    case VP_PREC_FP16:
        dt = "f16";
        break;
    default:
        dt = "bf16";
        break;
    }
    per *= (double)groups;
    in_grad = o->n_inputs > 0 && vp_graph_op(gr, o->inputs[0])->needs_grad;
    if (!gemm_add(g, dt, 'T', 'N', n, m, k, per * (recompute ? 2 : 1),
                  o->name))
        return false;
    if (s->inference || !o->needs_grad)
        return true;
    if (in_grad && !gemm_add(g, dt, 'N', 'N', k, m, n, per, o->name))
        return false;
    return gemm_add(g, dt, 'N', 'T', k, n, m, per, o->name);
}

static bool collect_gemms(gemms *g, const vp_graph *gr, const vp_setup *s)
{
    for (size_t i = 0; i < vp_graph_op_count(gr); i++) {
        const vp_op *o = vp_graph_op(gr, i);
        bool rc = !s->inference && o->segment >= 0 && s->checkpoint &&
                  (size_t)o->segment < s->n_checkpoint &&
                  s->checkpoint[o->segment];

        if (!op_gemms(g, gr, o, s, rc))
            return false;
    }
    return true;
}

/* ---- the command --------------------------------------------------------------- */

/* Simulate and write the event file. */
static int write_events(const replay_args *a, FILE *f)
{
    vp_setup setup = a->setup;
    vp_model *model = NULL;
    vp_graph *graph = NULL;
    bool *ckpt = NULL;
    gemms gm = {NULL, 0, 0};
    trace t;
    vp_estimate est;
    vp_error err;
    vp_status st;
    int rc = CLI_OK;

    memset(&t, 0, sizeof t);
    t.f = f;
    t.phase = -1;
    vp_error_clear(&err);
    model = cli_model_load(a->model_path, &rc);
    if (model == NULL)
        return rc;
    graph = vp_graph_build(model, setup.batch, setup.seq, &err);
    if (graph == NULL) {
        rc = cli_report(&err, NULL);
        goto done;
    }
    if (a->checkpoint != NULL) {
        if ((rc = cli_select_segments(graph, a->checkpoint, "--checkpoint",
                                      &ckpt)) >= 0)
            goto done;
        rc = CLI_OK;
        setup.checkpoint = ckpt;
        setup.n_checkpoint = vp_graph_segment_count(graph);
    }
    t.a = vp_allocator_new(&setup.alloc, &err);
    if (t.a == NULL) {
        rc = cli_report(&err, NULL);
        goto done;
    }
    vp_allocator_set_segment_hook(t.a, on_segment, &t);

    fprintf(f, "vramplan-replay 1\nmodel %s\n", vp_graph_model_name(graph));
    fprintf(f, "setup batch %" PRIu64 " seq %" PRIu64 " precision %s steps %"
            PRIu32 " accum %" PRIu32 "\n", vp_graph_batch(graph),
            vp_graph_seq(graph), vp_precision_name(setup.precision),
            setup.steps, setup.accum);
    fprintf(f, "budget %" PRIu64 "\n", setup.alloc.limit);
    memset(&est, 0, sizeof est);
    st = vp_simulate(graph, &setup, &est, on_event, &t, &err);
    if (st == VP_EOOM) {
        rc = cli_report(&err, NULL);
        fprintf(stderr, "vramplan: the step does not fit in the budget in "
                "the simulation; nothing to replay\n");
        goto done;
    }
    if (st != VP_OK) {
        rc = cli_report(&err, NULL);
        goto done;
    }
    if (t.st != VP_OK) {
        rc = cli_report(&t.err, NULL);
        goto done;
    }
    fprintf(f, "predicted peak_reserved %" PRIu64 " peak_alloc %" PRIu64
            " device_used %" PRIu64 "\n", est.peak_reserved, est.peak_alloc,
            est.device_used);
    fprintf(f, "flops_per_step %.6e\n", est.flops_per_step);
    if (!collect_gemms(&gm, graph, &setup)) {
        cli_fail("out of memory");
        rc = CLI_USAGE;
        goto done;
    }
    for (size_t i = 0; i < gm.n; i++)
        fprintf(f, "gemm %s %c %c %" PRIu64 " %" PRIu64 " %" PRIu64
                " %.17g %s\n", gm.v[i].dtype, gm.v[i].ta, gm.v[i].tb,
                gm.v[i].m, gm.v[i].n, gm.v[i].k, gm.v[i].count,
                gm.v[i].name && gm.v[i].name[0] ? gm.v[i].name : "-");
    fputs("end\n", f);

done:
    free(gm.v);
    free(t.live.key);
    free(t.live.val);
    vp_allocator_free(t.a);
    free(ckpt);
    vp_graph_free(graph);
    vp_model_free(model);
    return rc;
}

/* The GPU program: --replayer, $VRAMPLAN_REPLAYER, build/replay/vp-replay
 * beside this binary, else "vp-replay" looked up in PATH. */
static const char *find_replayer(const replay_args *a, char *buf, size_t n)
{
    const char *env = getenv("VRAMPLAN_REPLAYER");
    ssize_t len;

    if (a->replayer != NULL)
        return a->replayer;
    if (env != NULL && env[0] != '\0')
        return env;
    len = readlink("/proc/self/exe", buf, n - 1);
    if (len > 0) {
        char *slash;

        buf[len] = '\0';
        slash = strrchr(buf, '/');
        if (slash != NULL &&
            (size_t)(slash - buf) + 1 + sizeof REPLAYER_REL <= n) {
            strcpy(slash + 1, REPLAYER_REL);
            if (access(buf, X_OK) == 0)
                return buf;
        }
    }
    return "vp-replay";
}

static int run_replayer(const char *prog, const char *events,
                        const replay_args *a)
{
    char reps[24];
    char *argv[] = {(char *)prog, (char *)events, "--gemm-reps", reps,
                    "--format", (char *)a->format, NULL};
    int status;
    pid_t pid;

    snprintf(reps, sizeof reps, "%" PRIu64, a->gemm_reps);
    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid < 0) {
        fprintf(stderr, "vramplan: error: cannot fork: %s\n",
                strerror(errno));
        return CLI_USAGE;
    }
    if (pid == 0) {
        execvp(prog, argv);
        fprintf(stderr, "vramplan: error: cannot run the GPU replayer '%s': "
                "%s (build it with 'make replay' where nvcc is, or give "
                "--replayer)\n", prog, strerror(errno));
        _exit(127);
    }
    while (waitpid(pid, &status, 0) < 0) {
        if (errno != EINTR) {
            fprintf(stderr, "vramplan: error: waitpid: %s\n",
                    strerror(errno));
            return CLI_USAGE;
        }
    }
    if (WIFEXITED(status))
        return WEXITSTATUS(status) == 127 ? CLI_USAGE
                                          : WEXITSTATUS(status);
    fprintf(stderr, "vramplan: error: the GPU replayer died of signal %d\n",
            WTERMSIG(status));
    return CLI_USAGE;
}

/* Write the event file (--events, else a temporary one) and run the GPU
 * replayer on it. */
static int replay_run(const replay_args *a)
{
    char tmp[1024], exe[1024];
    const char *path, *dir = getenv("TMPDIR");
    FILE *f;
    int rc, fd = -1, bad;

    if (a->events != NULL) {
        path = a->events;
        f = fopen(path, "w");
    } else {
        if (dir == NULL || dir[0] == '\0')
            dir = "/tmp";
        snprintf(tmp, sizeof tmp, "%s/vramplan-replay-XXXXXX", dir);
        fd = mkstemp(tmp);
        path = tmp;
        f = fd >= 0 ? fdopen(fd, "w") : NULL;
    }
    if (f == NULL) {
        rc = cli_fail("cannot write '%s': %s", path, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        return rc;
    }
    rc = write_events(a, f);
    bad = ferror(f);
    if (fclose(f) != 0 || bad)
        rc = cli_fail("cannot write '%s'", path);
    if (rc == CLI_OK && a->events == NULL)
        rc = run_replayer(find_replayer(a, exe, sizeof exe), path, a);
    if (a->events == NULL)
        unlink(tmp);
    return rc;
}

int cli_replay(int argc, char **argv)
{
    replay_args a;
    int rc = replay_parse(argc, argv, &a);

    if (rc < 0)
        rc = replay_run(&a);
    cli_args_free(&a.args);
    return rc;
}
