/* Tests of the HTML page of a simulated run (src/html.c). Run from the
 * repository root. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/html.h"
#include "vramplan/vramplan.h"

typedef struct page {
    char *buf;
    size_t len;
    vp_estimate est;
    vp_status sim, write;
} page;

/* Simulate MODEL at batch with a page recorder and write the page. */
static void draw(const char *model, uint64_t batch, uint64_t budget,
                 page *p)
{
    vp_error err;
    vp_model *m = vp_model_load(model, &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, batch, 0, &err);
    cr_assert_not_null(g, "%s", err.msg);
    vp_setup s;
    vp_setup_init(&s);
    s.batch = batch;
    s.alloc.limit = budget;
    vp_html *h = vp_html_new(&err);
    cr_assert_not_null(h);
    p->sim = vp_simulate(g, &s, &p->est, vp_html_event, h, &err);
    vp_html_info info = {"mlp <10> & co", "batch 2", &p->est, budget,
                         p->sim == VP_EOOM ? err.msg : NULL};
    FILE *f = open_memstream(&p->buf, &p->len);
    p->write = vp_html_write(h, &info, f, &err);
    fclose(f);
    vp_html_free(h);
    vp_graph_free(g);
    vp_model_free(m);
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p++)
        n++;
    return n;
}

Test(html, page_is_self_contained_with_a_layer_per_category)
{
    page p;
    draw("models/mlp10.yaml", 2, 0, &p);
    cr_assert_eq(p.write, VP_OK);
    cr_assert(strncmp(p.buf, "<!DOCTYPE html>", 15) == 0);
    cr_assert_eq(count(p.buf, "<polygon"), VP_CAT__COUNT);
    cr_assert_eq(count(p.buf, "<svg"), 1);
    cr_assert(!strstr(p.buf, "<script") && !strstr(p.buf, "src=") &&
              !strstr(p.buf, "href="));
    cr_assert(strstr(p.buf, "mlp &lt;10&gt; &amp; co"), "title escaped");
    free(p.buf);
}

Test(html, the_chart_keeps_the_exact_peak)
{
    page p;
    char want[64], b[32];
    draw("models/gpt2-small.yaml", 2, 0, &p);
    cr_assert_eq(p.write, VP_OK);
    /* more events than columns: each column shows its largest event */
    snprintf(want, sizeof want, "peak %s</text>",
             vp_size_format(p.est.peak_alloc, b, sizeof b));
    cr_assert(strstr(p.buf, want), "%s not in the page", want);
    free(p.buf);
}

Test(html, phases_are_labelled_per_step)
{
    page p;
    draw("models/gpt2-small.yaml", 2, 0, &p);
    cr_assert(strstr(p.buf, ">fwd 1<") && strstr(p.buf, ">bwd 4<") &&
              strstr(p.buf, ">opt 2<"));
    free(p.buf);
}

Test(html, budget_and_failure_are_shown)
{
    page p;
    draw("models/mlp10.yaml", 2, (uint64_t)1 << 30, &p);
    cr_assert_eq(p.sim, VP_EOOM);
    cr_assert_eq(p.write, VP_OK);
    cr_assert(strstr(p.buf, "budget 1.00 GiB"));
    cr_assert(strstr(p.buf, "Does not fit: out of memory"));
    free(p.buf);
}

Test(html, nothing_recorded_is_an_error)
{
    vp_error err;
    vp_html *h = vp_html_new(&err);
    vp_estimate e;
    memset(&e, 0, sizeof e);
    vp_html_info info = {NULL, NULL, &e, 0, NULL};
    cr_assert_eq(vp_html_write(h, &info, stdout, &err), VP_EARG);
    info.est = NULL;
    cr_assert_eq(vp_html_write(h, &info, stdout, &err), VP_EARG);
    vp_html_free(h);
}
