/* One self-contained HTML page of a simulated run (html.h). The chart is
 * drawn at most COLS columns wide: each column stands for a run of
 * consecutive events and shows the event of that run with the most bytes
 * allocated, so the peaks stay exact. */
#include "vramplan/html.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "hashmap.h"
#include "internal.h"
#include "vramplan/watch.h"

#define COLS 1100 /* chart columns at most */

typedef struct ev {
    uint64_t allocated, reserved;
    uint64_t tensor;
    uint32_t step;
    uint8_t cat, phase, is_free;
} ev;

struct vp_html {
    ev *e;
    size_t n, cap;
    bool nomem;
};

vp_html *vp_html_new(vp_error *err)
{
    vp_html *h = calloc(1, sizeof *h);
    if (!h)
        vp_error_set(err, VP_ENOMEM, "out of memory");
    return h;
}

void vp_html_free(vp_html *h)
{
    if (!h)
        return;
    free(h->e);
    free(h);
}

void vp_html_event(const vp_sim_event *e, void *ud)
{
    vp_html *h = ud;
    if (!h || !e || h->nomem)
        return;
    if (!vp__grow((void **)&h->e, &h->cap, h->n + 1, sizeof *h->e)) {
        h->nomem = true;
        return;
    }
    h->e[h->n++] = (ev){e->allocated, e->reserved, e->tensor, e->step,
                        (uint8_t)e->category, (uint8_t)e->phase,
                        (uint8_t)e->is_free};
}

/* ---- the page ------------------------------------------------------------ */

/* Category colours (Tableau 10, as PyTorch's memory viewer). */
static const char *const COLOUR[VP_CAT__COUNT] = {
    [VP_CAT_PARAM] = "#4e79a7",     [VP_CAT_GRAD] = "#f28e2c",
    [VP_CAT_OPTIM] = "#e15759",     [VP_CAT_ACT] = "#76b7b2",
    [VP_CAT_TEMP] = "#edc949",      [VP_CAT_CAST] = "#af7aa1",
    [VP_CAT_INPUT] = "#ff9da7",     [VP_CAT_WORKSPACE] = "#9c755f"};
static const char *const PHASE_FILL[VP_PHASE__COUNT] = {
    [VP_PHASE_SETUP] = "#f4f4f4", [VP_PHASE_FORWARD] = "#eaf2fb",
    [VP_PHASE_BACKWARD] = "#fbefe6", [VP_PHASE_OPTIMIZER] = "#eef7ec"};
static const char *const PHASE_SHORT[VP_PHASE__COUNT] = {
    [VP_PHASE_SETUP] = "setup", [VP_PHASE_FORWARD] = "fwd",
    [VP_PHASE_BACKWARD] = "bwd", [VP_PHASE_OPTIMIZER] = "opt"};

/* Chart geometry (SVG user units). */
enum { W = 1180, H = 470, L = 70, R = 20, T = 34, B = 40 };

typedef struct col {
    uint64_t cat[VP_CAT__COUNT]; /* live bytes by category               */
    uint64_t allocated, reserved;
    size_t event;                /* the event it shows                   */
} col;

static void esc(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '&': fputs("&amp;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static const char *size_str(uint64_t b, char *buf, size_t n)
{
    return vp_size_format(b, buf, n);
}

/* The category each allocation is drawn in: the one its free reports (the
 * simulator moves a gradient from the temporaries to the gradients once
 * it becomes .grad, with no event), else the one it was allocated in.
 * Maps the tensor to category + 1. */
static bool final_categories(const vp_html *h, vp__map *m)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->e[i].is_free && h->e[i].tensor &&
            !vp__map_put(m, h->e[i].tensor, (uint64_t)h->e[i].cat + 1))
            return false;
    return true;
}

/* The columns: per run of events, the event with the most allocated and
 * the categories live after it. The baseline (workspaces allocated before
 * the model) comes off the total and the workspace category, as in the
 * estimate's figures. */
static col *columns(const vp_html *h, uint64_t baseline, size_t *ncols)
{
    size_t nc = h->n < COLS ? h->n : COLS;
    col *c = calloc(nc, sizeof *c);
    bool *used = calloc(nc, sizeof *used);
    vp__map fin = {0};
    if (!c || !used || !final_categories(h, &fin)) {
        free(c);
        free(used);
        vp__map_free(&fin);
        return NULL;
    }
    uint64_t live[VP_CAT__COUNT] = {0}, prev = 0;
    for (size_t i = 0; i < h->n; i++) {
        const ev *e = &h->e[i];
        /* the allocated counter moves by the block's size */
        uint64_t d = e->is_free ? prev - e->allocated : e->allocated - prev;
        uint64_t f = vp__map_get(&fin, e->tensor);
        unsigned k = f ? (unsigned)(f - 1) : e->cat;
        if (k < VP_CAT__COUNT) {
            if (e->is_free)
                live[k] -= d; /* added in the same category at its alloc */
            else
                live[k] += d;
        }
        prev = e->allocated;
        size_t ci = (size_t)((uint64_t)i * nc / h->n); /* nc small: no wrap */
        uint64_t a = e->allocated >= baseline ? e->allocated - baseline : 0;
        if (!used[ci] || a > c[ci].allocated) {
            used[ci] = true;
            memcpy(c[ci].cat, live, sizeof live);
            uint64_t *ws = &c[ci].cat[VP_CAT_WORKSPACE];
            *ws = *ws >= baseline ? *ws - baseline : 0;
            c[ci].allocated = a;
            c[ci].event = i;
        }
        if (e->reserved > c[ci].reserved)
            c[ci].reserved = e->reserved;
    }
    free(used);
    vp__map_free(&fin);
    *ncols = nc;
    return c;
}

/* A tick step for values up to max: 1, 2 or 5 x 10^k GiB (MiB, KiB for
 * smaller charts), at most 8 ticks. */
static uint64_t tick_step(uint64_t max)
{
    uint64_t unit = max >= 4 * VP_GiB ? VP_GiB : max >= 4 * VP_MiB ? VP_MiB
                                                                     : 1024;
    static const uint64_t mult[] = {1, 2, 5};
    for (uint64_t p = 1; p <= UINT64_MAX / 10; p *= 10)
        for (int i = 0; i < 3; i++) {
            uint64_t step = unit * mult[i] * p; /* max < 2^64: no wrap */
            if (max / step <= 8)
                return step;
        }
    return max;
}

static double xpos(size_t event, size_t n)
{
    return L + (double)(W - L - R) * (n > 1 ? (double)event / (double)(n - 1)
                                            : 0.0);
}

static double ypos(uint64_t bytes, uint64_t top)
{
    return (double)(H - B) - (double)(H - B - T) * (double)bytes / (double)top;
}

/* Bands behind the chart, one per phase of each step, with a label. */
static void phase_bands(FILE *f, const vp_html *h)
{
    size_t start = 0;
    for (size_t i = 1; i <= h->n; i++) {
        if (i < h->n && h->e[i].phase == h->e[start].phase &&
            h->e[i].step == h->e[start].step)
            continue;
        const ev *e = &h->e[start];
        double x0 = xpos(start, h->n), x1 = xpos(i - 1, h->n);
        fprintf(f,
                "<rect x=\"%.1f\" y=\"%d\" width=\"%.1f\" height=\"%d\" "
                "fill=\"%s\"><title>step %" PRIu32 ", %s: events %zu to "
                "%zu</title></rect>\n",
                x0, T, x1 - x0 > 0.5 ? x1 - x0 : 0.5, H - B - T,
                PHASE_FILL[e->phase % VP_PHASE__COUNT], e->step,
                vp_phase_name((vp_phase)e->phase), start + 1, i);
        if (x1 - x0 > 28)
            fprintf(f,
                    "<text x=\"%.1f\" y=\"%d\" class=\"ph\">%s %" PRIu32
                    "</text>\n",
                    (x0 + x1) / 2, T - 6,
                    PHASE_SHORT[e->phase % VP_PHASE__COUNT], e->step);
        start = i;
    }
}

/* The horizontal grid lines with their byte labels. */
static void y_grid(FILE *f, uint64_t top)
{
    char buf[32];
    uint64_t step = tick_step(top);
    for (uint64_t v = 0; v <= top; v += step) {
        double y = ypos(v, top);
        fprintf(f,
                "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" "
                "class=\"grid\"/><text x=\"%d\" y=\"%.1f\" "
                "class=\"yl\">%s</text>\n",
                L, W - R, y, y, L - 6, y + 4, size_str(v, buf, sizeof buf));
        if (v > UINT64_MAX - step)
            break;
    }
}

static void axes(FILE *f, uint64_t top, size_t n)
{
    y_grid(f, top);
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" class=\"xl\">event (allocation or "
            "free) 1 to %zu</text>\n",
            (W + L) / 2, H - 8, n);
}

/* The stacked areas: one polygon per category, its top edge along the
 * columns and its bottom edge back along the categories under it. */
static void stack(FILE *f, const col *c, size_t nc, size_t n, uint64_t top)
{
    for (int k = VP_CAT__COUNT - 1; k >= 0; k--) {
        fprintf(f, "<polygon fill=\"%s\" points=\"", COLOUR[k]);
        for (size_t i = 0; i < nc; i++) {
            uint64_t s = 0;
            for (int j = 0; j <= k; j++)
                s += c[i].cat[j];
            fprintf(f, "%.1f,%.1f ", xpos(c[i].event, n), ypos(s, top));
        }
        for (size_t i = nc; i-- > 0;) {
            uint64_t s = 0;
            for (int j = 0; j < k; j++)
                s += c[i].cat[j];
            fprintf(f, "%.1f,%.1f ", xpos(c[i].event, n), ypos(s, top));
        }
        fprintf(f, "\"><title>%s</title></polygon>\n",
                vp_category_name((vp_category)k));
    }
    fputs("<polyline class=\"res\" points=\"", f);
    for (size_t i = 0; i < nc; i++)
        fprintf(f, "%.1f,%.1f ", xpos(c[i].event, n),
                ypos(c[i].reserved, top));
    fputs("\"><title>reserved (memory_reserved)</title></polyline>\n", f);
}

static void marks(FILE *f, const vp_html_info *in, const col *c, size_t nc,
                  size_t n, uint64_t top)
{
    char b1[32];
    if (in->budget) {
        double y = ypos(in->budget, top);
        fprintf(f,
                "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" "
                "class=\"budget\"/><text x=\"%d\" y=\"%.1f\" "
                "class=\"note\">budget %s</text>\n",
                L, W - R, y, y, W - R - 4, y - 5,
                size_str(in->budget, b1, sizeof b1));
    }
    size_t best = 0;
    for (size_t i = 1; i < nc; i++)
        if (c[i].allocated > c[best].allocated)
            best = i;
    if (nc == 0)
        return;
    double x = xpos(c[best].event, n), y = ypos(c[best].allocated, top);
    fprintf(f,
            "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\" "
            "class=\"peak\"/><circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" "
            "class=\"peakdot\"/>\n<text x=\"%.1f\" y=\"%.1f\" "
            "class=\"note\" text-anchor=\"%s\">peak %s</text>\n",
            x, x, T, H - B, x, y, x + (x > W / 2 ? -8 : 8), y - 8,
            x > W / 2 ? "end" : "start",
            size_str(c[best].allocated, b1, sizeof b1));
}

static void legend(FILE *f)
{
    fputs("<div class=\"legend\">", f);
    for (int k = 0; k < VP_CAT__COUNT; k++)
        fprintf(f, "<span><i style=\"background:%s\"></i>%s</span>",
                COLOUR[k], vp_category_name((vp_category)k));
    fputs("<span><i class=\"resl\"></i>reserved</span>"
          "<span><i class=\"pkl\"></i>peak</span></div>\n",
          f);
}

static void figures(FILE *f, const vp_html_info *in)
{
    const vp_estimate *e = in->est;
    char b1[32], b2[32], b3[32];
    fprintf(f,
            "<table class=\"fig\"><tr><th>peak allocated</th><td>%s</td>"
            "<td>max_memory_allocated, step %" PRIu32 ", %s, ",
            size_str(e->peak_alloc, b1, sizeof b1), e->peak_step,
            vp_phase_name(e->peak_phase));
    esc(f, e->peak_op[0] ? e->peak_op : "(model)");
    fprintf(f,
            "</td></tr>\n<tr><th>peak reserved</th><td>%s</td>"
            "<td>max_memory_reserved</td></tr>\n<tr><th>device</th>"
            "<td>%s</td><td>as nvidia-smi shows it (reserved + CUDA "
            "context)</td></tr>\n",
            size_str(e->peak_reserved, b2, sizeof b2),
            size_str(e->device_used, b3, sizeof b3));
    if (in->budget)
        fprintf(f, "<tr><th>budget</th><td>%s</td><td>%.1f%% used at the "
                   "peak</td></tr>\n",
                size_str(in->budget, b1, sizeof b1),
                100.0 * (double)e->peak_reserved / (double)in->budget);
    fputs("</table>\n", f);
}

/* What holds the peak: categories with bars, then the layers. */
static void holders(FILE *f, const vp_estimate *e)
{
    char b1[32];
    uint64_t total = 0;
    for (int k = 0; k < VP_CAT__COUNT; k++)
        total += e->by_category[k];
    fputs("<div class=\"cols\"><div><h2>What holds the peak</h2>"
          "<table class=\"hold\">\n",
          f);
    for (int k = 0; k < VP_CAT__COUNT; k++) {
        double pct = total ? 100.0 * (double)e->by_category[k] / (double)total
                           : 0.0;
        fprintf(f,
                "<tr><td><i style=\"background:%s\"></i>%s</td>"
                "<td class=\"n\">%s</td><td class=\"n\">%.1f%%</td>"
                "<td class=\"bar\"><b style=\"width:%.1f%%;background:%s\">"
                "</b></td></tr>\n",
                COLOUR[k], vp_category_name((vp_category)k),
                size_str(e->by_category[k], b1, sizeof b1), pct, pct,
                COLOUR[k]);
    }
    fputs("</table></div>\n<div><h2>Layers holding the most activations"
          "</h2><table class=\"hold\">\n",
          f);
    for (uint32_t i = 0; i < e->n_top_layers && i < VP_TOP_LAYERS; i++) {
        fputs("<tr><td>", f);
        esc(f, e->top_layers[i].name);
        fprintf(f, "</td><td class=\"n\">%s</td></tr>\n",
                size_str(e->top_layers[i].bytes, b1, sizeof b1));
    }
    if (e->n_top_layers == 0)
        fputs("<tr><td>(none)</td></tr>\n", f);
    fputs("</table></div></div>\n", f);
}

static void steps(FILE *f, const vp_estimate *e)
{
    char b[6][32];
    fputs("<h2>Steps</h2><table class=\"steps\"><tr><th>step</th>"
          "<th>start</th><th>forward peak</th><th>backward peak</th>"
          "<th>optimizer peak</th><th>end</th><th>reserved</th></tr>\n",
          f);
    for (uint32_t s = 0; s < e->steps && s < VP_MAX_STEPS; s++) {
        const vp_phase_peaks *p = &e->step[s];
        fprintf(f,
                "<tr><td>%" PRIu32 "</td><td>%s</td><td>%s</td><td>%s</td>"
                "<td>%s</td><td>%s</td><td>%s</td></tr>\n",
                s + 1, size_str(p->start, b[0], 32),
                size_str(p->peak[VP_PHASE_FORWARD], b[1], 32),
                size_str(p->peak[VP_PHASE_BACKWARD], b[2], 32),
                size_str(p->peak[VP_PHASE_OPTIMIZER], b[3], 32),
                size_str(p->end, b[4], 32), size_str(p->reserved, b[5], 32));
    }
    fputs("</table>\n", f);
}

static const char STYLE[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px;color:#222}"
    "h1{font-size:20px;margin:0 0 4px}h2{font-size:15px;margin:18px 0 6px}"
    ".sub{color:#555;margin-bottom:10px}.fail{color:#b00;font-weight:600}"
    "svg text{font:11px system-ui,sans-serif;fill:#333}"
    ".yl{text-anchor:end}.xl{text-anchor:middle}.ph{text-anchor:middle;"
    "fill:#666}.grid{stroke:#ddd;stroke-width:1}.res{fill:none;"
    "stroke:#222;stroke-width:1.3;stroke-dasharray:4 3}.budget{stroke:#b00;"
    "stroke-width:1.5;stroke-dasharray:7 4}.note{text-anchor:end;"
    "fill:#b00;font-weight:600}.peak{stroke:#b00;stroke-width:1}"
    ".peakdot{fill:#b00}.legend span{margin-right:14px;white-space:nowrap}"
    ".legend i,.hold i{display:inline-block;width:12px;height:12px;"
    "margin-right:5px;vertical-align:-1px}.legend i.resl{border-top:2px "
    "dashed #222;height:0}.legend i.pkl{background:#b00;width:2px}"
    "table{border-collapse:collapse}td,th{padding:2px 10px 2px 0;"
    "text-align:left}.n{text-align:right}.bar{width:220px}.bar b{display:"
    "block;height:10px}.cols{display:flex;gap:48px}.steps td,.steps th{"
    "text-align:right;padding-right:16px}.fig th{font-weight:600}";

vp_status vp_html_write(const vp_html *h, const vp_html_info *in, FILE *f,
                        vp_error *err)
{
    if (!h || !in || !in->est || !f)
        return vp_error_set(err, VP_EARG, "no events or estimate to draw");
    if (h->nomem)
        return vp_error_set(err, VP_ENOMEM, "out of memory recording events");
    if (h->n == 0)
        return vp_error_set(err, VP_EARG, "no events to draw");
    size_t nc = 0;
    col *c = columns(h, in->est->baseline, &nc);
    if (!c)
        return vp_error_set(err, VP_ENOMEM, "out of memory drawing");
    uint64_t top = in->budget;
    for (size_t i = 0; i < nc; i++)
        if (c[i].reserved > top)
            top = c[i].reserved;
    top = top + top / 20 + 1; /* headroom for labels */

    fputs("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
          "<title>vramplan: ",
          f);
    esc(f, in->title ? in->title : "simulated run");
    fprintf(f, "</title>\n<style>%s</style></head><body>\n<h1>", STYLE);
    esc(f, in->title ? in->title : "simulated run");
    fputs("</h1>\n<div class=\"sub\">", f);
    esc(f, in->setup);
    fputs("</div>\n", f);
    if (in->failure) {
        fputs("<p class=\"fail\">Does not fit: ", f);
        esc(f, in->failure);
        fputs(" (the chart ends where the run stopped)</p>\n", f);
    }
    figures(f, in);
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d %d\" "
            "width=\"%d\" height=\"%d\" role=\"img\">\n",
            W, H, W, H);
    phase_bands(f, h);
    axes(f, top, h->n);
    stack(f, c, nc, h->n, top);
    marks(f, in, c, nc, h->n, top);
    fputs("</svg>\n", f);
    legend(f);
    holders(f, in->est);
    steps(f, in->est);
    fputs("<p class=\"sub\">Simulated by vramplan " VRAMPLAN_VERSION
          ": allocated bytes stacked by category (less the workspaces "
          "allocated before the model), reserved bytes dashed. Each of the "
          "chart's columns shows the event with the most bytes allocated "
          "among the events it stands for.</p>\n</body></html>\n",
          f);
    free(c);
    if (ferror(f))
        return vp_error_set(err, VP_EIO, "cannot write the page");
    return VP_OK;
}

/* ---- the page of `vramplan watch` -------------------------------------- */

static double tpos(double t, double tmax)
{
    return L + (double)(W - L - R) * (tmax > 0 ? t / tmax : 0.0);
}

static void hline(FILE *f, uint64_t v, uint64_t top, const char *cls,
                  const char *label)
{
    char b[32];
    double y = ypos(v, top);
    fprintf(f,
            "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" class=\"%s\"/>"
            "<text x=\"%d\" y=\"%.1f\" class=\"note\">%s %s</text>\n",
            L, W - R, y, y, cls, W - R - 4, y - 5, label,
            size_str(v, b, sizeof b));
}

/* Measured bytes per GPU, and the plan's prediction at each sample's
 * step, over time. */
static void watch_chart(FILE *f, const vp_watch_result *r,
                        const vp_watch_config *cfg, uint64_t top)
{
    double tmax = r->seconds > 0 ? r->seconds : 1.0;
    y_grid(f, top);
    fprintf(f,
            "<text x=\"%d\" y=\"%d\" class=\"xl\">seconds since the job "
            "started (0 to %.1f)</text>\n",
            (W + L) / 2, H - 8, tmax);
    if (cfg->n_predicted) {
        fputs("<polyline class=\"pred\" points=\"", f);
        for (size_t i = 0; i < r->n_trace; i++)
            if (r->trace[i].gpu == 0)
                fprintf(f, "%.1f,%.1f ", tpos(r->trace[i].t, tmax),
                        ypos(vp_watch_predicted(cfg, r->trace[i].step),
                             top));
        fputs("\"><title>predicted (the plan at the job's step)</title>"
              "</polyline>\n",
              f);
    }
    for (unsigned g = 0; g < r->n_gpus; g++) {
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" "
                   "stroke-width=\"1.6\" points=\"",
                COLOUR[g % VP_CAT__COUNT]);
        for (size_t i = 0; i < r->n_trace; i++)
            if (r->trace[i].gpu == g)
                fprintf(f, "%.1f,%.1f ", tpos(r->trace[i].t, tmax),
                        ypos(r->trace[i].used, top));
        fprintf(f, "\"><title>GPU %u measured</title></polyline>\n",
                r->gpu[g].index);
    }
}

static void watch_table(FILE *f, const vp_watch_result *r,
                        const vp_watch_config *cfg)
{
    char b[4][32];
    fputs("<table class=\"steps\"><tr><th>GPU</th><th>name</th>"
          "<th>in use before</th><th>budget</th><th>peak</th>"
          "<th>at step</th><th>predicted</th><th>vs plan</th>"
          "<th>alerts</th></tr>\n",
          f);
    for (unsigned g = 0; g < r->n_gpus; g++) {
        const vp_watch_gpu *gp = &r->gpu[g];
        uint64_t pred = vp_watch_predicted(cfg, gp->peak_step);
        fprintf(f, "<tr><td>%u</td><td>", gp->index);
        esc(f, gp->name);
        fprintf(f, "</td><td>%s</td><td>%s</td><td>%s</td><td>%" PRIu32
                   "</td><td>%s</td>",
                size_str(gp->before, b[0], 32), size_str(gp->budget, b[1], 32),
                size_str(gp->peak, b[2], 32), gp->peak_step,
                pred ? size_str(pred, b[3], 32) : "-");
        if (pred)
            fprintf(f, "<td>%+.1f%%</td>",
                    100.0 * ((double)gp->peak - (double)pred) / (double)pred);
        else
            fputs("<td>-</td>", f);
        fprintf(f, "<td>%" PRIu32 "</td></tr>\n", gp->alerts);
    }
    fputs("</table>\n", f);
}

vp_status vp_watch_write_html(const vp_watch_result *r,
                              const vp_watch_config *cfg, const char *title,
                              FILE *f, vp_error *err)
{
    if (!r || !cfg || !f || r->n_gpus == 0)
        return vp_error_set(err, VP_EARG, "nothing to draw");
    uint64_t top = vp_watch_predicted(cfg, 0);
    for (unsigned g = 0; g < r->n_gpus; g++) {
        if (r->gpu[g].budget > top)
            top = r->gpu[g].budget;
        if (r->gpu[g].peak > top)
            top = r->gpu[g].peak;
    }
    top = top + top / 20 + 1;
    fprintf(f, "<!DOCTYPE html>\n<html lang=\"en\"><head><meta "
               "charset=\"utf-8\"><title>vramplan watch</title>\n<style>%s"
               ".pred{fill:none;stroke:#222;stroke-width:1.3;"
               "stroke-dasharray:4 3}.alert{stroke:#e08a00;stroke-width:1;"
               "stroke-dasharray:3 3}</style></head><body>\n<h1>",
            STYLE);
    esc(f, title ? title : "vramplan watch");
    fprintf(f, "</h1>\n<div class=\"sub\">%.1f s, %" PRIu64
               " samples per GPU, %s</div>\n",
            r->seconds, r->samples,
            r->killed      ? "stopped at the kill threshold"
            : r->cancelled ? "stopped by the user"
                           : "the job ended by itself");
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 %d "
               "%d\" width=\"%d\" height=\"%d\" role=\"img\">\n",
            W, H, W, H);
    watch_chart(f, r, cfg, top);
    uint64_t budget = r->gpu[0].budget;
    hline(f, budget, top, "budget", "budget");
    hline(f, vp__share_ppm(budget, cfg->alert_ppm), top, "alert", "alert");
    if (cfg->kill_ppm)
        hline(f, vp__share_ppm(budget, cfg->kill_ppm), top, "budget", "stop at");
    fputs("</svg>\n<div class=\"legend\">", f);
    for (unsigned g = 0; g < r->n_gpus; g++)
        fprintf(f, "<span><i style=\"background:%s\"></i>GPU %u measured"
                   "</span>",
                COLOUR[g % VP_CAT__COUNT], r->gpu[g].index);
    fputs("<span><i class=\"resl\"></i>predicted</span></div>\n", f);
    watch_table(f, r, cfg);
    fputs("<p class=\"sub\">Measured: NVML's used bytes of each GPU less "
          "what was in use before the job. Predicted: the simulator's "
          "device bytes (reserved + CUDA context) by the end of the step "
          "the job last printed.</p>\n</body></html>\n",
          f);
    if (ferror(f))
        return vp_error_set(err, VP_EIO, "cannot write the page");
    return VP_OK;
}
