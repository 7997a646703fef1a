/* Dynamic batching by length (batching.h): the lengths file, padded
 * buckets under one tokens-per-batch budget, and packed (varlen) batches.
 * Memory comes from the simulator (vp_maxbatch at each bucket's padded
 * length), time from the step-time model. docs/SERVING.md §3. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "vramplan/batching.h"
#include "vramplan/search.h"

/* ------------------------------------------------------------------ */
/* The lengths file                                                     */
/* ------------------------------------------------------------------ */

/* Counts per distinct length, open addressing (length 0 marks a free
 * slot). */
typedef struct hist {
    uint64_t *len, *count;
    size_t cap, n;
} hist;

static bool hist_add(hist *h, uint64_t len, uint64_t count)
{
    if (2 * (h->n + 1) > h->cap) {
        hist g = {NULL, NULL, h->cap ? 2 * h->cap : 1024, 0};
        g.len = calloc(g.cap, sizeof *g.len);
        g.count = calloc(g.cap, sizeof *g.count);
        if (!g.len || !g.count) {
            free(g.len);
            free(g.count);
            return false;
        }
        for (size_t i = 0; i < h->cap; i++)
            if (h->len[i])
                hist_add(&g, h->len[i], h->count[i]);
        free(h->len);
        free(h->count);
        *h = g;
    }
    size_t i = (size_t)(len * 0x9E3779B97F4A7C15ull) & (h->cap - 1);
    while (h->len[i] && h->len[i] != len)
        i = (i + 1) & (h->cap - 1);
    if (!h->len[i]) {
        h->len[i] = len;
        h->n++;
    }
    h->count[i] += count;
    return true;
}

typedef struct lparse {
    const char *buf, *path;
    size_t len, i;
    uint32_t line;
    size_t line_start;
    vp_error *err;
} lparse;

static vp_status lerr(const lparse *p, size_t at, size_t width,
                      vp_status code, const char *msg)
{
    return vp_error_at(p->err, code, p->path, p->line,
                       (uint32_t)(at - p->line_start + 1), (uint32_t)width,
                       "%s", msg);
}

/* A decimal field at p->i in [1, max]; leaves p->i after it. */
static vp_status field(lparse *p, uint64_t max, const char *what,
                       uint64_t *out)
{
    size_t s = p->i;
    uint64_t v = 0;
    bool big = false;

    while (p->i < p->len && p->buf[p->i] != ' ' && p->buf[p->i] != '\t' &&
           p->buf[p->i] != '\n' && p->buf[p->i] != '\r')
        p->i++;
    for (size_t k = s; k < p->i; k++) {
        char c = p->buf[k];
        if (c < '0' || c > '9') {
            char msg[96];
            snprintf(msg, sizeof msg, "%s is not a whole number", what);
            return lerr(p, s, p->i - s, VP_ESYNTAX, msg);
        }
        if (v > (UINT64_MAX - 9) / 10)
            big = true;
        else
            v = v * 10 + (uint64_t)(c - '0');
    }
    if (big || v == 0 || v > max) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s must be from 1 to %llu", what,
                 (unsigned long long)max);
        return lerr(p, s, p->i - s, VP_ERANGE, msg);
    }
    *out = v;
    return VP_OK;
}

static void skip_blanks(lparse *p)
{
    while (p->i < p->len && (p->buf[p->i] == ' ' || p->buf[p->i] == '\t'))
        p->i++;
}

static bool at_eol(const lparse *p)
{
    return p->i >= p->len || p->buf[p->i] == '\n' ||
           (p->buf[p->i] == '\r' &&
            (p->i + 1 >= p->len || p->buf[p->i + 1] == '\n'));
}

/* One data line into h; *form is 1 or 2 (fields), 0 before the first. */
static vp_status data_line(lparse *p, hist *h, int *form, uint64_t *total)
{
    uint64_t len, count = 1;
    int fields = 1;

    VP_TRY(field(p, VP_LENGTHS_MAX_LEN, "a length", &len));
    skip_blanks(p);
    if (!at_eol(p)) {
        VP_TRY(field(p, VP_LENGTHS_MAX_COUNT, "a count", &count));
        fields = 2;
        skip_blanks(p);
        if (!at_eol(p))
            return lerr(p, p->i, 1, VP_ESYNTAX,
                        "a line holds a length, or a length and a count");
    }
    if (*form && fields != *form)
        return lerr(p, p->line_start, 1, VP_ESYNTAX,
                    fields == 2 ? "a histogram line in a file of lengths"
                                : "a lone length in a histogram file");
    *form = fields;
    if (!vp_add_u64(*total, count, total) || *total > VP_LENGTHS_MAX_COUNT)
        return lerr(p, p->line_start, 1, VP_ELIMIT,
                    "more than 2^40 sequences");
    if (!hist_add(h, len, count))
        return vp_error_set(p->err, VP_ENOMEM, "out of memory");
    if (h->n > VP_LENGTHS_MAX_DISTINCT)
        return lerr(p, p->line_start, 1, VP_ELIMIT,
                    "more than 1000000 distinct lengths");
    return VP_OK;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The histogram as sorted arrays in *out. */
static vp_status collect(const hist *h, vp_lengths *out, vp_error *err)
{
    out->len = malloc((h->n ? h->n : 1) * sizeof *out->len);
    out->count = malloc((h->n ? h->n : 1) * sizeof *out->count);
    if (!out->len || !out->count)
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    for (size_t i = 0; i < h->cap; i++)
        if (h->len[i])
            out->len[out->n++] = h->len[i];
    qsort(out->len, out->n, sizeof *out->len, cmp_u64);
    for (size_t k = 0; k < out->n; k++) {
        size_t i = (size_t)(out->len[k] * 0x9E3779B97F4A7C15ull) &
                   (h->cap - 1);
        while (h->len[i] != out->len[k])
            i = (i + 1) & (h->cap - 1);
        uint64_t t;
        out->count[k] = h->count[i];
        out->sequences += h->count[i];
        if (!vp_mul_u64(h->count[i], out->len[k], &t) ||
            !vp_add_u64(out->tokens, t, &out->tokens))
            return vp_error_set(err, VP_EOVERFLOW, "tokens overflow");
    }
    out->max_len = out->len[out->n - 1];
    return VP_OK;
}

vp_status vp_lengths_parse(const char *buf, size_t len, const char *path,
                           vp_lengths *out, vp_error *err)
{
    lparse p = {buf, path ? path : "<buffer>", len, 0, 1, 0, err};
    hist h = {0};
    int form = 0;
    uint64_t total = 0;
    vp_status st = VP_OK;

    vp_error_clear(err);
    memset(out, 0, sizeof *out);
    if (len > VP_LENGTHS_MAX_BYTES)
        return vp_error_at(err, VP_ELIMIT, p.path, 0, 0, 0,
                           "a lengths file is at most %u bytes",
                           VP_LENGTHS_MAX_BYTES);
    while (p.i < p.len && st == VP_OK) {
        p.line_start = p.i;
        skip_blanks(&p);
        if (p.i < p.len && p.buf[p.i] == '#')
            while (p.i < p.len && p.buf[p.i] != '\n')
                p.i++;
        else if (!at_eol(&p))
            st = data_line(&p, &h, &form, &total);
        if (st == VP_OK && p.i < p.len && p.buf[p.i] == '\r')
            p.i++;
        if (st == VP_OK && p.i < p.len) {
            p.i++; /* the newline */
            p.line++;
        }
    }
    if (st == VP_OK && h.n == 0)
        st = vp_error_at(err, VP_ESYNTAX, p.path, 0, 0, 0,
                         "no lengths in the file");
    if (st == VP_OK)
        st = collect(&h, out, err);
    free(h.len);
    free(h.count);
    if (st != VP_OK)
        vp_lengths_destroy(out);
    return st;
}

vp_status vp_lengths_load(const char *path, vp_lengths *out, vp_error *err)
{
    char *buf;
    size_t len;
    vp_status st;

    memset(out, 0, sizeof *out);
    VP_TRY(vp__read_file(path, VP_LENGTHS_MAX_BYTES, &buf, &len, err));
    st = vp_lengths_parse(buf, len, path, out, err);
    free(buf);
    return st;
}

void vp_lengths_destroy(vp_lengths *l)
{
    if (!l)
        return;
    free(l->len);
    free(l->count);
    memset(l, 0, sizeof *l);
}

/* ------------------------------------------------------------------ */
/* Padded buckets                                                       */
/* ------------------------------------------------------------------ */

static uint64_t cdiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

/* Non-empty buckets of l under bounds (or powers of two). */
static vp_status make_buckets(const vp_lengths *l, const uint64_t *bounds,
                              size_t n_bounds, vp_batching_result *r,
                              vp_error *err)
{
    uint64_t pow2[VP_BATCHING_MAX_BUCKETS];

    if (n_bounds == 0) {
        uint64_t b = 1;
        while (b < l->len[0])
            b *= 2;
        for (; n_bounds < VP_BATCHING_MAX_BUCKETS; b *= 2) {
            pow2[n_bounds++] = b;
            if (b >= l->max_len)
                break;
        }
        bounds = pow2;
    }
    if (n_bounds > VP_BATCHING_MAX_BUCKETS)
        return vp_error_set(err, VP_EARG, "more than %d buckets",
                            VP_BATCHING_MAX_BUCKETS);
    for (size_t k = 1; k < n_bounds; k++)
        if (bounds[k] <= bounds[k - 1])
            return vp_error_set(err, VP_EARG,
                                "bucket bounds must increase");
    if (bounds[n_bounds - 1] < l->max_len)
        return vp_error_set(err, VP_EARG,
                            "the last bucket bound %llu is below the longest "
                            "length %llu",
                            (unsigned long long)bounds[n_bounds - 1],
                            (unsigned long long)l->max_len);
    size_t b = 0;
    for (size_t i = 0; i < l->n; i++) {
        while (bounds[b] < l->len[i])
            b++;
        if (r->n_buckets == 0 || r->bucket[r->n_buckets - 1].upper !=
                                     bounds[b])
            r->bucket[r->n_buckets++] = (vp_bucket){.upper = bounds[b]};
        vp_bucket *k = &r->bucket[r->n_buckets - 1];
        k->padded_len = l->len[i];
        k->sequences += l->count[i];
        k->tokens += l->count[i] * l->len[i];
    }
    return VP_OK;
}

/* The largest batch at seq under the setup's budget. */
static vp_status max_batch(const vp_model *m, const vp_setup *s, uint64_t seq,
                           uint64_t *out, vp_batching_result *r,
                           vp_error *err)
{
    vp_setup t = *s;
    vp_maxbatch_result mb;

    t.seq = seq;
    VP_TRY(vp_maxbatch(m, &t, NULL, 0, &mb, err));
    r->simulations += mb.trials;
    *out = mb.max_batch;
    return VP_OK;
}

/* One step's time at (batch, seq), and the attention core's share of its
 * FLOPs. */
static vp_status step_time(const vp_model *m, const vp_setup *s,
                           const vp_hw *hw, uint64_t batch, uint64_t seq,
                           double *time, double *attn_share, vp_error *err)
{
    vp_setup t = *s;
    vp_step_time st;
    vp_graph *g = vp_graph_build(m, batch, seq, err);
    double attn = 0.0;
    vp_status rc;

    if (!g)
        return err->code;
    if (vp__graph_search_check(g, err) != VP_OK) {
        vp_graph_free(g);
        return VP_ELIMIT;
    }
    t.batch = batch;
    t.seq = seq;
    rc = vp_step_time_estimate(g, &t, hw, &st, err);
    for (size_t i = 0; rc == VP_OK && i < vp_graph_op_count(g); i++) {
        const vp_op *o = vp_graph_op(g, i);
        if (o->kind == VP_OP_ATTENTION)
            attn += o->flops_fwd + (s->inference ? 0.0 : o->flops_bwd);
    }
    vp_graph_free(g);
    VP_TRY(rc);
    *time = st.total;
    *attn_share = st.flops > 0.0 ? attn / st.flops : 0.0;
    if (*attn_share > 1.0)
        *attn_share = 1.0;
    return VP_OK;
}

static vp_status padded(const vp_model *m, const vp_setup *s,
                        const vp_hw *hw, const vp_lengths *l,
                        vp_batching_result *r, vp_error *err)
{
    double padded_tokens = 0.0, share;

    r->token_budget = UINT64_MAX;
    for (size_t k = 0; k < r->n_buckets; k++) {
        vp_bucket *b = &r->bucket[k];
        VP_TRY(max_batch(m, s, b->padded_len, &b->max_batch, r, err));
        if (b->max_batch == 0)
            return vp_error_set(err, VP_EOOM,
                                "one sequence of %llu tokens does not fit "
                                "the budget",
                                (unsigned long long)b->padded_len);
        /* floor(T / L) <= max_batch  <=>  T <= (max_batch + 1) L - 1 */
        uint64_t t = (b->max_batch + 1) * b->padded_len - 1;
        if (t < r->token_budget) {
            r->token_budget = t;
            r->limiting = k;
        }
    }
    for (size_t k = 0; k < r->n_buckets; k++) {
        vp_bucket *b = &r->bucket[k];
        b->batch = r->token_budget / b->padded_len;
        b->batches = cdiv(b->sequences, b->batch);
        padded_tokens += (double)b->sequences * (double)b->padded_len;
        if (hw) {
            VP_TRY(step_time(m, s, hw, b->batch, b->padded_len, &b->step_s,
                             &share, err));
            r->padded_time_s += (double)b->batches * b->step_s;
        }
    }
    r->padding_waste = 1.0 - (double)l->tokens / padded_tokens;
    if (r->padded_time_s > 0.0)
        r->padded_tokens_per_s = (double)l->tokens / r->padded_time_s;
    return VP_OK;
}

/* Packed: flash-attention varlen, memory by total tokens (measured with
 * batches of the longest length), attention work by each sequence's own
 * length: a batch of T tokens holds sequences whose squared lengths sum to
 * T x sum(c L^2) / sum(c L) on average. */
static vp_status packed(const vp_model *m, const vp_setup *s,
                        const vp_hw *hw, const vp_lengths *l,
                        vp_batching_result *r, vp_error *err)
{
    vp_setup f = *s;
    uint64_t rows;
    double t_full, share, sq = 0.0;

    f.attn = VP_ATTN_FLASH;
    f.attn_set = true;
    VP_TRY(max_batch(m, &f, l->max_len, &rows, r, err));
    r->packed_tokens = rows * l->max_len;
    if (rows == 0)
        return VP_OK;
    r->packed_batches = cdiv(l->tokens, r->packed_tokens);
    if (!hw)
        return VP_OK;
    VP_TRY(step_time(m, &f, hw, rows, l->max_len, &t_full, &share, err));
    for (size_t i = 0; i < l->n; i++)
        sq += (double)l->count[i] * (double)l->len[i] * (double)l->len[i];
    double ratio = (double)r->packed_tokens * sq / (double)l->tokens /
                   ((double)rows * (double)l->max_len * (double)l->max_len);
    r->packed_step_s = t_full * (1.0 - share + share * ratio);
    r->packed_time_s = r->packed_step_s * (double)l->tokens /
                       (double)r->packed_tokens;
    r->packed_tokens_per_s = (double)l->tokens / r->packed_time_s;
    return VP_OK;
}

vp_status vp_batching_plan(const vp_model *m, const vp_setup *setup,
                           const vp_hw *hw, const vp_lengths *l,
                           const uint64_t *bounds, size_t n_bounds,
                           vp_batching_result *out, vp_error *err)
{
    vp_error_clear(err);
    memset(out, 0, sizeof *out);
    if (setup->alloc.limit == 0)
        return vp_error_set(err, VP_EARG, "batching needs a memory budget");
    if (!l || l->n == 0)
        return vp_error_set(err, VP_EARG, "no lengths");
    VP_TRY(make_buckets(l, bounds, n_bounds, out, err));
    VP_TRY(padded(m, setup, hw, l, out, err));
    return packed(m, setup, hw, l, out, err);
}
