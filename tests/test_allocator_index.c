/* The allocator's index of free blocks (size classes with a bitmap, an
 * array sorted by key per class) finds the block PyTorch's best fit
 * finds: the lowest (size, address) among the free blocks of the
 * request's stream and pool that hold the rounded request. Checked
 * against a search over the allocator's own listing
 * (vp_allocator_segments) before every allocation of long random runs.
 * And the simulator's transient (vp__allocator_transient) leaves the
 * allocator as a malloc and a release do. */
#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "../src/allocator_internal.h"
#include "vramplan/allocator.h"
#include "vramplan/units.h"

#define MiB VP_MiB
#define SMALL_SIZE MiB /* kSmallSize: the small pool's largest block */

typedef struct {
    uint64_t size;   /* the rounded request */
    int stream;
    bool large;
    bool found;      /* a free block holds it */
    uint64_t addr, best; /* that block's address and size */
    uint64_t seg_lo, seg_hi; /* lowest and highest address of any segment */
} want;

static vp_status visit(const vp_allocator_segment_info *seg, void *ud)
{
    want *w = ud;
    if (seg->addr < w->seg_lo)
        w->seg_lo = seg->addr;
    if (seg->addr + seg->size > w->seg_hi)
        w->seg_hi = seg->addr + seg->size;
    if (seg->stream != w->stream || seg->large != w->large)
        return VP_OK;
    for (size_t i = 0; i < seg->n_blocks; i++) {
        const vp_allocator_block_info *b = &seg->blocks[i];
        if (b->allocated || b->size < w->size)
            continue;
        if (!w->found || b->size < w->best ||
            (b->size == w->best && b->addr < w->addr)) {
            w->found = true;
            w->best = b->size;
            w->addr = b->addr;
        }
    }
    return VP_OK;
}

static uint64_t rnd(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* A request size: small and large pool, sizes that share a class with
 * their neighbours (a few distinct values) and log-uniform ones. */
static uint64_t request(uint64_t *seed)
{
    static const uint64_t common[] = {512, 4096, 1536, 786432,
                                      2 * MiB + 512, 3 * MiB, 24 * MiB,
                                      25 * MiB, 96 * MiB};
    if (rnd(seed) % 2)
        return common[rnd(seed) % (sizeof common / sizeof common[0])];
    uint64_t e = rnd(seed) % 27;
    return ((uint64_t)1 << e) + rnd(seed) % ((uint64_t)1 << e);
}

static void run(uint64_t seed, int ops, int streams)
{
    vp_error err;
    vp_allocator *a = vp_allocator_new(NULL, &err);
    cr_assert_not_null(a, "%s", err.msg);
    uint64_t *live = calloc((size_t)ops, sizeof *live);
    cr_assert_not_null(live);
    size_t n = 0, reused = 0, fresh = 0;
    for (int op = 0; op < ops; op++) {
        uint64_t r = rnd(&seed) % 100;
        if (r < 2) {
            vp_allocator_empty_cache(a);
            continue;
        }
        if (r < 45 && n > 0) {
            size_t k = (size_t)(rnd(&seed) % n);
            cr_assert_eq(vp_allocator_release(a, live[k], &err), VP_OK);
            live[k] = live[--n];
            continue;
        }
        uint64_t sz = request(&seed);
        want w = {0};
        w.size = vp_allocator_round_size(NULL, sz);
        w.stream = (int)(rnd(&seed) % (uint64_t)streams);
        w.large = w.size > SMALL_SIZE;
        w.seg_lo = UINT64_MAX;
        cr_assert_eq(vp_allocator_segments(a, visit, &w, &err), VP_OK);
        uint64_t h = 0;
        cr_assert_eq(vp_allocator_malloc(a, sz, w.stream, &h, &err), VP_OK,
                     "%s", err.msg);
        uint64_t at = vp_allocator_block_addr(a, h);
        if (w.found) {
            cr_assert_eq(at, w.addr,
                         "op %d: %llu B (stream %d) at %#llx, best fit is "
                         "the %llu B block at %#llx",
                         op, (unsigned long long)w.size, w.stream,
                         (unsigned long long)at,
                         (unsigned long long)w.best,
                         (unsigned long long)w.addr);
            reused++;
        } else {
            /* no free block holds it: a new segment above all others */
            cr_assert(w.seg_lo == UINT64_MAX || at >= w.seg_hi,
                      "op %d: %llu B at %#llx inside the segments",
                      op, (unsigned long long)w.size,
                      (unsigned long long)at);
            fresh++;
        }
        live[n++] = h;
        cr_assert_eq(vp_allocator_check(a, &err), VP_OK, "%s", err.msg);
    }
    /* both paths were exercised many times */
    cr_assert_gt(reused, (size_t)ops / 10);
    cr_assert_gt(fresh, (size_t)10);
    free(live);
    vp_allocator_free(a);
}

Test(allocator_index, best_fit_one_stream)
{
    run(11, 3000, 1);
}

Test(allocator_index, best_fit_three_streams)
{
    run(12, 3000, 3);
}

/* Eight streams, whose first requests come in random order (the index
 * keeps one directory per stream, sorted by stream). */
Test(allocator_index, best_fit_streams_out_of_order)
{
    run(13, 600, 8);
}

/* Everything the allocator reports and decides by from now on, and the
 * handle its next allocation gets (slots and generations). */
static void same_state(vp_allocator *a, vp_allocator *b, int op)
{
    vp_words wa = {0}, wb = {0};
    cr_assert(vp__allocator_state(a, &wa) && vp__allocator_state(b, &wb));
    cr_assert_eq(wa.n, wb.n, "op %d: state sizes differ", op);
    cr_assert_arr_eq(wa.v, wb.v, wa.n * sizeof *wa.v, "op %d: states differ",
                     op);
    free(wa.v);
    free(wb.v);
    vp_allocator_stats sa, sb;
    vp_allocator_stats_get(a, &sa);
    vp_allocator_stats_get(b, &sb);
    cr_assert_arr_eq(&sa, &sb, sizeof sa, "op %d: statistics differ", op);
}

/* Two allocators fed the same random run; where one makes a transient,
 * the other a malloc and a release: the same handle, block size and
 * allocated bytes after the malloc, the same state after, and the same
 * handles for every later allocation. */
static void run_transient(uint64_t seed, int ops, int streams)
{
    vp_error err;
    vp_allocator *a = vp_allocator_new(NULL, &err);
    vp_allocator *b = vp_allocator_new(NULL, &err);
    cr_assert(a && b);
    uint64_t *live = calloc((size_t)ops, sizeof *live);
    cr_assert_not_null(live);
    size_t n = 0, transients = 0;
    for (int op = 0; op < ops; op++) {
        uint64_t r = rnd(&seed) % 100, sz = request(&seed);
        int stream = (int)(rnd(&seed) % (uint64_t)streams);
        if (r < 40 && n > 0) {
            size_t k = (size_t)(rnd(&seed) % n);
            cr_assert_eq(vp_allocator_release(a, live[k], &err), VP_OK);
            cr_assert_eq(vp_allocator_release(b, live[k], &err), VP_OK);
            live[k] = live[--n];
        } else if (r < 70) {
            uint64_t ha, hb, sa, sb, at;
            cr_assert_eq(vp__allocator_transient(a, sz, stream, &ha, &sa,
                                                 &at, &err),
                         VP_OK, "%s", err.msg);
            cr_assert_eq(vp__allocator_alloc(b, sz, stream, &hb, &sb, &err),
                         VP_OK, "%s", err.msg);
            cr_assert_eq(ha, hb, "op %d: handles differ", op);
            cr_assert_eq(sa, sb, "op %d: block sizes differ", op);
            cr_assert_eq(at, vp__allocator_stats(b)->allocated);
            cr_assert_eq(vp_allocator_release(b, hb, &err), VP_OK);
            cr_assert_eq(vp_allocator_block_addr(a, ha),
                         vp_allocator_block_addr(b, hb));
            transients++;
        } else {
            uint64_t ha, hb;
            cr_assert_eq(vp_allocator_malloc(a, sz, stream, &ha, &err), VP_OK);
            cr_assert_eq(vp_allocator_malloc(b, sz, stream, &hb, &err), VP_OK);
            cr_assert_eq(ha, hb, "op %d: handles differ", op);
            live[n++] = ha;
        }
        same_state(a, b, op);
        cr_assert_eq(vp_allocator_check(a, &err), VP_OK, "%s", err.msg);
    }
    cr_assert_gt(transients, (size_t)ops / 5);
    free(live);
    vp_allocator_free(a);
    vp_allocator_free(b);
}

Test(allocator_index, transient_is_malloc_and_release)
{
    run_transient(21, 2000, 1);
}

Test(allocator_index, transient_is_malloc_and_release_three_streams)
{
    run_transient(22, 2000, 3);
}

/* The state written segment by segment (vp__allocator_state) is the one
 * with every live block sorted, word for word, along random runs of
 * mallocs, releases and cache releases on several streams, with and
 * without expandable segments. */
static void state_run(uint64_t seed, int ops, bool expandable)
{
    vp_error err;
    vp_allocator_config cfg;
    vp_allocator_config_init(&cfg);
    cfg.expandable_segments = expandable;
    vp_allocator *a = vp_allocator_new(&cfg, &err);
    cr_assert_not_null(a, "%s", err.msg);
    uint64_t *live = calloc((size_t)ops, sizeof *live);
    cr_assert_not_null(live);
    size_t n = 0;
    vp_words ws = {0}, wq = {0};
    for (int op = 0; op < ops; op++) {
        uint64_t r = rnd(&seed) % 100;
        if (r < 2) {
            vp_allocator_empty_cache(a);
        } else if (r < 45 && n > 0) {
            size_t k = (size_t)(rnd(&seed) % n);
            cr_assert_eq(vp_allocator_release(a, live[k], &err), VP_OK);
            live[k] = live[--n];
        } else {
            int stream = (int)(rnd(&seed) % 3);
            cr_assert_eq(vp_allocator_malloc(a, request(&seed), stream,
                                             &live[n++], &err),
                         VP_OK, "%s", err.msg);
        }
        ws.n = wq.n = 0;
        cr_assert(vp__allocator_state(a, &ws) &&
                  vp__allocator_state_sorted(a, &wq));
        cr_assert_eq(ws.n, wq.n, "op %d: state sizes differ", op);
        cr_assert_arr_eq(ws.v, wq.v, ws.n * sizeof *ws.v,
                         "op %d: states differ", op);
    }
    free(ws.v);
    free(wq.v);
    free(live);
    vp_allocator_free(a);
}

Test(allocator_index, state_by_segment_is_the_sorted_state)
{
    state_run(31, 1500, false);
}

Test(allocator_index, state_by_segment_is_the_sorted_state_expandable)
{
    state_run(32, 1500, true);
}

/* The allocator checked (its segments' numbering included) and its state
 * written along the numbered segments equal to the sorted one. */
static void numbered_state_ok(vp_allocator *a, const char *row)
{
    vp_error err;
    cr_assert_eq(vp_allocator_check(a, &err), VP_OK, "%s: %s", row, err.msg);
    vp_words ws = {0}, wq = {0};
    cr_assert(vp__allocator_state(a, &ws) &&
              vp__allocator_state_sorted(a, &wq));
    cr_assert_eq(ws.n, wq.n, "%s: state sizes differ", row);
    cr_assert_arr_eq(ws.v, wq.v, ws.n * sizeof *ws.v, "%s: states differ",
                     row);
    free(ws.v);
    free(wq.v);
}

/* Each segment's first block moves (a split at its start, the merge that
 * gives it back, the transient's rename of a split free first block) and
 * segments are released and made again: the numbering follows, and the
 * state walks the segments in the order of their addresses. */
Test(allocator_index, segments_numbered_through_splits_merges_releases)
{
    vp_error err;
    vp_allocator *a = vp_allocator_new(NULL, &err);
    cr_assert_not_null(a, "%s", err.msg);
    uint64_t h[8], sz;
    /* three segments: a small one filled by two 1 MiB blocks, two large */
    for (int i = 0; i < 4; i++)
        cr_assert_eq(vp_allocator_malloc(a, i < 2 ? SMALL_SIZE : 30 * MiB,
                                         0, &h[i], &err),
                     VP_OK);
    numbered_state_ok(a, "three segments");
    /* the small segment's first block freed, then split at its start */
    cr_assert_eq(vp_allocator_release(a, h[0], &err), VP_OK);
    cr_assert_eq(vp_allocator_malloc(a, 4096, 0, &h[4], &err), VP_OK);
    cr_assert_eq(vp_allocator_block_addr(a, h[4]),
                 vp_allocator_block_addr(a, h[1]) - SMALL_SIZE);
    cr_assert_eq(vp_allocator_malloc(a, 512, 0, &h[5], &err), VP_OK);
    numbered_state_ok(a, "split at a segment's start");
    /* the 4 KiB first block freed, then a transient splits it: the rename
     * at the segment's start */
    cr_assert_eq(vp_allocator_release(a, h[4], &err), VP_OK);
    numbered_state_ok(a, "first block free");
    uint64_t ht, at;
    cr_assert_eq(vp__allocator_transient(a, 512, 0, &ht, &sz, &at, &err),
                 VP_OK);
    cr_assert_eq(sz, 512);
    numbered_state_ok(a, "transient at a segment's start");
    /* the 512-B block after it freed: it absorbs the free first block */
    cr_assert_eq(vp_allocator_release(a, h[5], &err), VP_OK);
    numbered_state_ok(a, "merge at a segment's start");
    /* the first large segment released, a new one made above the rest */
    cr_assert_eq(vp_allocator_release(a, h[2], &err), VP_OK);
    vp_allocator_empty_cache(a);
    numbered_state_ok(a, "segments released");
    cr_assert_eq(vp_allocator_malloc(a, 50 * MiB, 0, &h[6], &err), VP_OK);
    cr_assert_eq(vp_allocator_malloc(a, 8192, 0, &h[7], &err), VP_OK);
    numbered_state_ok(a, "segments made again");
    vp_allocator_free(a);
}
