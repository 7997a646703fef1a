/* Collectives: the time of one NCCL call, after NCCL's own tuning model
 * (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel and
 * ncclTopoGetAlgoTime, commit 5067397): per algorithm (ring; tree for
 * all-reduce across nodes) and protocol (LL, LL128, Simple), a latency of
 * base + steps x hop latency and a bus bandwidth; NCCL runs the fastest
 * pair, and so does the model. The constants are NCCL's defaults
 * (ncclTunerConstantsDefaults); docs/STEP_TIME.md lists them.
 *
 * Two departures, both documented there: the bus bandwidth is the link's
 * (NVLink within a node; across nodes the NICs of the group's ranks on a
 * node, one ring channel per rail, at most NVLink) times the cluster's
 * efficiency rather than NCCL's per-channel search, and a group that
 * straddles a node boundary (tp = 6 on 8-GPU nodes) runs at one NIC's
 * speed. */
#include <math.h>

#include "cluster_impl.h"

enum { LL, LL128, SIMPLE, NPROTO };
enum { HW_NVLINK, HW_PCI, HW_NET };

/* baseLatencies (us): tree, ring */
static const double base_tree[NPROTO] = {6.8, 14.0, 8.4};
static const double base_ring[NPROTO] = {6.6, 14.0, 8.4};
/* hwLatencies (us) [hw][proto], tree and ring */
static const double lat_tree[3][NPROTO] = {
    {0.6, 1.25, 4.0}, {1.0, 1.9, 4.0}, {5.0, 8.5, 14.0}};
static const double lat_ring[3][NPROTO] = {
    {0.6, 1.9, 3.4}, {1.0, 2.5, 5.7}, {2.7, 4.0, 14.0}};
/* llMaxBws (GB/s): one node (Ampere), two nodes, more (Intel hosts) */
static const double ll_max[3] = {87.7, 39.0, 20.4};
/* network post overhead (us), x3 for Simple (getNetOverhead, Intel) */
#define NET_OVERHEAD 1.0
/* treeCorrectionFactor[proto][log2(bytes / 64)] */
static const double tree_corr[NPROTO][24] = {
    {1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5,
     .4,  .4,  .5,  .6,  .7, .8, .9, 1.0, 1.0, 1.0, 1.0, 1.0},
    {1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6,
     .6,  .6,  .6,  .6,  .8,  .9, .9, .9, .9, 1.0, 1.0, 1.0},
    {.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5,
     .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9, .9}};

void vp__group_shape(const vp_cluster *c, double n, double stride,
                     vp__group *g)
{
    double gpn = (double)c->gpus_per_node;
    double span = n * stride;
    g->n = n;
    if (span <= gpn && fmod(gpn, span) == 0.0) {
        g->nodes = 1;
        g->ppn = n;
    } else if (span < gpn) {
        /* groups of this size do not tile the node: some straddle two */
        g->nodes = 2;
        g->ppn = ceil(n / 2.0);
    } else if (stride >= gpn || fmod(gpn, stride) != 0.0) {
        g->nodes = n;
        g->ppn = 1;
    } else {
        g->ppn = gpn / stride;
        g->nodes = ceil(n / g->ppn);
    }
    double nv = c->hw.nvlink * c->nvlink_eff;
    double net = c->hw.network * c->net_eff;
    if (nv <= 0)
        nv = net > 0 ? net : 1e9;
    if (net <= 0)
        net = nv;
    g->intra_bw = nv;
    g->net_bw = net < nv ? net : nv;
    /* Across nodes a rank's own traffic (a send, the network share of
     * an all-to-all) leaves through its own NIC. A ring or tree of a
     * group that tiles its nodes with ppn ranks each runs one channel
     * per rail: NCCL's busBw is nChannels x the per-channel inter-node
     * bandwidth (tuning.cc ncclTopoTuneModel), its search puts the
     * channels on the ranks' own NICs (src/graph/search.cc), so each
     * rank's NIC carries 1/ppn of its ring traffic and NVLink the rest:
     * ppn x the NIC, at most NVLink (measured: NVIDIA/nccl #1048, two
     * A100 nodes with 4 x 200 Gb/s HCAs reach 86 GB/s of all-reduce bus
     * bandwidth, one HCA 24 GB/s). A group that straddles a node
     * boundary keeps one NIC's speed. */
    double rails = g->nodes > 1 && g->ppn > 1 && span > gpn ? g->ppn : 1;
    g->bw = g->nodes > 1 ? fmin(rails * g->net_bw, nv) : nv;
    g->pci = !(c->hw.nvlink > c->hw.host);
}

static double lg2i(double n)
{
    return n > 1 ? floor(log2(n)) : 0;
}

/* Ring time of one call: the fastest protocol. */
static double ring_time(const vp__group *g, vp_coll k, double bytes)
{
    double n = g->n, N = g->nodes;
    double nsteps = k == VP_COLL_ALL_REDUCE ? 2.0 * (n - 1) : n - 1;
    double ninter = N <= 1 ? 0 : k == VP_COLL_ALL_REDUCE ? 2.0 * (N - 1)
                                                         : N - 1;
    int intra = g->pci ? HW_PCI : HW_NVLINK;
    double best = INFINITY;
    for (int p = 0; p < NPROTO; p++) {
        double bw = g->bw / 1e9; /* GB/s, as NCCL counts */
        if (p == LL) {
            double cap = ll_max[N <= 1 ? 0 : N <= 2 ? 1 : 2];
            bw = bw * 0.5 < cap ? bw * 0.5 : cap;
        } else if (p == LL128) {
            bw *= 0.92;
        }
        double algbw = bw * n / nsteps;
        double il = lat_ring[intra][p];
        double el = g->ppn <= 1 ? lat_tree[HW_NET][p] : lat_ring[HW_NET][p];
        if (N > 1) {
            double ov = NET_OVERHEAD * (p == SIMPLE ? 3.0 : 1.0);
            if (il < ov)
                il = ov;
        }
        double lat = base_ring[p] + (nsteps - ninter) * il + ninter * el;
        if (p == SIMPLE && N > 1 && k == VP_COLL_ALL_REDUCE &&
            bytes / (16.0 * n) >= 64)
            lat *= 1.4; /* ring plateau (compute capability >= 8.0) */
        double t = lat * 1e-6 + bytes / (1e9 * algbw);
        if (t < best)
            best = t;
    }
    return best;
}

/* Tree all-reduce across nodes (NCCL's double binary tree). */
static double tree_time(const vp__group *g, double bytes)
{
    double N = g->nodes, ppn = g->ppn;
    int intra = g->pci ? HW_PCI : HW_NVLINK;
    double best = INFINITY;
    int lb = bytes >= 64 ? (int)floor(log2(bytes / 64.0)) : 0;
    for (int p = 0; p < NPROTO; p++) {
        double bw = g->bw / 1e9 * 0.92;
        if (p == LL) {
            bw = g->bw / 1e9 / 3.8;
            double cap = ll_max[N <= 2 ? 1 : 2];
            if (bw > cap)
                bw = cap;
        } else if (p == LL128) {
            bw = g->bw / 1e9 * (120.0 / 128.0);
        }
        if (lb < 23)
            bw *= tree_corr[p][lb];
        double algbw = bw * 0.5;
        double lat = base_tree[p] +
                     2.0 * ((ppn - 1) * lat_tree[intra][p] +
                            lg2i(N) * lat_tree[HW_NET][p]);
        double t = lat * 1e-6 + bytes / (1e9 * algbw);
        if (t < best)
            best = t;
    }
    return best;
}

double vp__coll(const vp__group *g, vp_coll k, double bytes)
{
    if (g->n <= 1 || bytes <= 0)
        return 0;
    int intra = g->pci ? HW_PCI : HW_NVLINK;
    switch (k) {
    case VP_COLL_ALL_REDUCE: {
        double r = ring_time(g, k, bytes);
        if (g->nodes > 1) {
            double t = tree_time(g, bytes);
            if (t < r)
                r = t;
        }
        return r;
    }
    case VP_COLL_ALL_GATHER:
    case VP_COLL_REDUCE_SCATTER:
        return ring_time(g, k, bytes);
    case VP_COLL_ALL_TO_ALL: {
        /* n - 1 sends and receives at once: the NVLink share and the
         * network share each at its link's speed */
        double n = g->n, ppn = g->ppn;
        double in = bytes * (ppn - 1) / n / g->intra_bw;
        double out = bytes * (n - ppn) / n / g->net_bw;
        double lat = base_ring[SIMPLE] +
                     (g->nodes > 1 ? lat_ring[HW_NET][SIMPLE]
                                   : lat_ring[intra][SIMPLE]);
        return lat * 1e-6 + (in > out ? in : out);
    }
    case VP_COLL_SEND:
    default: {
        double lat = base_ring[SIMPLE] + (g->nodes > 1
                                              ? lat_ring[HW_NET][SIMPLE]
                                              : lat_ring[intra][SIMPLE]);
        return lat * 1e-6 +
               bytes / (g->nodes > 1 ? g->net_bw : g->intra_bw);
    }
    }
}

double vp_coll_time(const vp_cluster *c, vp_coll k, double bytes, uint32_t n,
                    uint32_t stride)
{
    if (n <= 1 || bytes <= 0 || !c->gpus_per_node)
        return 0;
    vp__group g;
    vp__group_shape(c, (double)n, stride ? (double)stride : 1.0, &g);
    return vp__coll(&g, k, bytes);
}
