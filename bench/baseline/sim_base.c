/* The baseline simulator for bench_sim (make bench): this file is
 * compiled against the headers of the commit that issue 11 was filed
 * against (BENCH_BASE_REV in bench/bench.mk, extracted with git archive
 * into build/bench/baseline/src and built there as its own
 * libvramplan.a), and linked with that library into one object whose only
 * global symbols are the three below, so that both simulators run in the
 * same process on the same models (each reading the model files of its
 * own commit). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "vramplan/vramplan.h"

typedef struct {
    vp_model *m;
    vp_graph *g;
    vp_setup s;
} base_run;

/* A setup of the baseline: its model, graph and setup (the layer
 * breakdown off, as bench_sim runs the current tree). NULL with the
 * message in msg. */
void *vp_bench_base_open(const char *model, uint64_t batch, uint64_t seq,
                         const char *precision, char *msg, size_t n);
/* One simulation; 0 on success, the events simulated in *events. */
int vp_bench_base_sim(void *run, uint64_t *events);
void vp_bench_base_close(void *run);

void *vp_bench_base_open(const char *model, uint64_t batch, uint64_t seq,
                         const char *precision, char *msg, size_t n)
{
    vp_error err;
    base_run *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(msg, n, "out of memory");
        return NULL;
    }
    vp_setup_init(&r->s);
    r->s.batch = batch;
    r->s.skip_breakdown = true;
    if (vp_precision_parse(precision, &r->s.precision) != VP_OK) {
        snprintf(msg, n, "unknown precision %s", precision);
        free(r);
        return NULL;
    }
    r->m = vp_model_load(model, &err);
    r->g = r->m ? vp_graph_build(r->m, batch, seq, &err) : NULL;
    if (!r->g) {
        snprintf(msg, n, "%s: %s", model, err.msg);
        vp_model_free(r->m);
        free(r);
        return NULL;
    }
    return r;
}

int vp_bench_base_sim(void *run, uint64_t *events)
{
    base_run *r = run;
    vp_error err;
    vp_estimate e;
    if (vp_simulate(r->g, &r->s, &e, NULL, NULL, &err) != VP_OK)
        return 1;
    *events = e.events;
    return 0;
}

void vp_bench_base_close(void *run)
{
    base_run *r = run;
    if (!r)
        return;
    vp_graph_free(r->g);
    vp_model_free(r->m);
    free(r);
}
