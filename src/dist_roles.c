/* The roles of a data-parallel run: ranks whose event streams are alike
 * (the same shard shapes, the same optimizer partition) share one, and
 * each role is simulated once (vp_simulate_ranks). */
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

/* Roles of ZeroRedundancyOptimizer with overlap_with_ddp depend on the
 * rebuilt buckets (the backward's order): each rank is simulated, up to
 * this many. */
#define MAX_ROLES_SIMULATED 64u

static uint64_t mix(uint64_t h, uint64_t v)
{
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

/* One signature per rank: equal signatures, equal streams. */
static vp_status signatures(const vp_graph *g, const vp_dist *d,
                            uint64_t *sig, vp_error *err)
{
    uint32_t w = d->world;
    uint32_t group = d->shard ? d->shard : w;

    memset(sig, 0, w * sizeof *sig);
    switch (d->strategy) {
    case VP_DIST_DDP_ZERO1: {
        if (d->overlap_with_ddp) {
            if (w > MAX_ROLES_SIMULATED)
                return vp_error_set(err, VP_EARG,
                                    "overlap_with_ddp over %u ranks: its "
                                    "partition follows the rebuilt buckets, "
                                    "so every rank is simulated, up to %u",
                                    w, MAX_ROLES_SIMULATED);
            for (uint32_t r = 0; r < w; r++)
                sig[r] = r;
            return VP_OK;
        }
        uint32_t *rank_of = calloc(g->n_params ? g->n_params : 1,
                                   sizeof *rank_of);
        if (!rank_of || vp__zero_partition(g, w, rank_of) != VP_OK) {
            free(rank_of);
            return vp_error_set(err, VP_ENOMEM, "out of memory");
        }
        for (uint32_t p = 0; p < g->n_params; p++)
            if (rank_of[p] != UINT32_MAX)
                sig[rank_of[p]] = mix(sig[rank_of[p]], p + 1);
        free(rank_of);
        return VP_OK;
    }
    case VP_DIST_FSDP2:
        /* the local chunks (the optimizer's tensors) differ where dim 0
         * does not divide; replicas of a shard rank are alike */
        for (uint32_t r = 0; r < w; r++) {
            uint32_t gr = r % group;
            if (r >= group) {
                sig[r] = sig[gr];
                continue;
            }
            for (uint32_t p = 0; p < g->n_params; p++)
                if (!vp__dist_is_buffer(g, p))
                    sig[r] = mix(sig[r],
                                 vp__chunk_numel(g, p, group, gr, NULL));
        }
        return VP_OK;
    case VP_DIST_DS_ZERO1:
    case VP_DIST_DS_ZERO2:
    case VP_DIST_DS_ZERO3:
        return vp__ds_signatures(g, d, sig, err);
    default:
        /* DDP and FSDP1 (equal, padded shards): every rank alike */
        return VP_OK;
    }
}

vp_status vp_dist_roles(const vp_graph *g, const vp_dist *d,
                        uint32_t **ranks, uint32_t **counts, size_t *n,
                        vp_error *err)
{
    *ranks = *counts = NULL;
    *n = 0;
    if (!d || d->world < 1 || d->world > VP_DIST_MAX_WORLD ||
        (d->shard && (d->shard > d->world || d->world % d->shard)))
        return vp_error_set(err, VP_EARG,
                            "invalid data-parallel run (world %u, shard "
                            "group %u)", d ? d->world : 0, d ? d->shard : 0);
    uint32_t w = d->world;
    uint64_t *sig = malloc(w * sizeof *sig);
    uint32_t *rk = malloc(w * sizeof *rk), *ct = malloc(w * sizeof *ct);
    if (!sig || !rk || !ct) {
        free(sig);
        free(rk);
        free(ct);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    vp_status st = signatures(g, d, sig, err);
    size_t m = 0;
    for (uint32_t r = 0; st == VP_OK && r < w; r++) {
        size_t k = 0;
        /* roles are few: a linear search over them */
        while (k < m && sig[rk[k]] != sig[r])
            k++;
        if (k == m) {
            rk[m] = r;
            ct[m++] = 0;
        }
        ct[k]++;
    }
    free(sig);
    if (st != VP_OK) {
        free(rk);
        free(ct);
        return st;
    }
    *ranks = rk;
    *counts = ct;
    *n = m;
    return VP_OK;
}

/* More loaded: the larger peak allocated, then reserved. */
static bool heavier(const vp_estimate *a, const vp_estimate *b)
{
    if (a->peak_alloc != b->peak_alloc)
        return a->peak_alloc > b->peak_alloc;
    return a->peak_reserved > b->peak_reserved;
}

vp_status vp_simulate_ranks(const vp_graph *g, const vp_setup *setup,
                            vp_rank_estimate **out, size_t *n,
                            size_t *worst, vp_error *err)
{
    *out = NULL;
    *n = *worst = 0;
    if (!setup->dist || setup->dist->strategy == VP_DIST_NONE)
        return vp_error_set(err, VP_EARG,
                            "vp_simulate_ranks needs a data-parallel run "
                            "(setup->dist)");
    uint32_t *ranks, *counts;
    size_t m;
    vp_status st = vp_dist_roles(g, setup->dist, &ranks, &counts, &m, err);
    if (st != VP_OK)
        return st;
    vp_rank_estimate *r = calloc(m ? m : 1, sizeof *r);
    if (!r) {
        free(ranks);
        free(counts);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    vp_dist d = *setup->dist;
    vp_setup s = *setup;
    s.dist = &d;
    for (size_t k = 0; k < m && st == VP_OK; k++) {
        d.rank = ranks[k];
        r[k].rank = ranks[k];
        r[k].n_ranks = counts[k];
        st = vp_simulate(g, &s, &r[k].est, NULL, NULL, err);
        if (st == VP_OK && heavier(&r[k].est, &r[*worst].est))
            *worst = k;
    }
    free(ranks);
    free(counts);
    if (st != VP_OK) {
        free(r);
        *worst = 0;
        return st;
    }
    *out = r;
    *n = m;
    return VP_OK;
}
