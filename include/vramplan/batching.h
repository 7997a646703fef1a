/* vramplan: dynamic batching by sequence length, for training or
 * inference.
 *
 * Given the lengths of a data set, two ways to fill batches under a memory
 * budget are sized with the simulator:
 *
 *  - padded: sequences are grouped into length buckets and padded to the
 *    bucket's longest; every bucket takes batch = floor(T / padded_len)
 *    sequences for one tokens-per-batch budget T, the largest T under which
 *    every bucket's batch fits;
 *  - packed: sequences are concatenated into batches of T tokens and
 *    attended one by one (flash-attention varlen with cu_seqlens), so memory
 *    follows the total tokens and attention work each sequence's own length.
 *
 * The report gives each bucket's batch, the padding waste and the expected
 * throughput of both (docs/SERVING.md §3). */
#ifndef VRAMPLAN_BATCHING_H
#define VRAMPLAN_BATCHING_H

#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"
#include "vramplan/model.h"
#include "vramplan/sim.h"
#include "vramplan/timing.h"

/* Bounds on a lengths file. */
#define VP_LENGTHS_MAX_BYTES (64u << 20)
#define VP_LENGTHS_MAX_LEN (1u << 24)       /* tokens of one sequence    */
#define VP_LENGTHS_MAX_DISTINCT 1000000u
#define VP_LENGTHS_MAX_COUNT (1ull << 40)   /* sequences in all          */

/* A length distribution: distinct lengths ascending, with their counts. */
typedef struct vp_lengths {
    uint64_t *len, *count;   /* n entries each; vp_lengths_destroy frees  */
    size_t n;
    uint64_t sequences, tokens, max_len;
} vp_lengths;

/* Parse a lengths file: one length per line, or a histogram of
 * "LENGTH COUNT" lines (one form per file). Blank lines and lines starting
 * with '#' are skipped; lengths are decimal integers from 1 to
 * VP_LENGTHS_MAX_LEN, counts from 1. Errors carry file:line:column:
 * VP_ESYNTAX (not a number, extra fields, mixed forms), VP_ERANGE,
 * VP_ELIMIT (size bounds above), VP_EIO, VP_ENOMEM. */
vp_status vp_lengths_parse(const char *buf, size_t len, const char *path,
                           vp_lengths *out, vp_error *err);
vp_status vp_lengths_load(const char *path, vp_lengths *out, vp_error *err);
void vp_lengths_destroy(vp_lengths *l);

#define VP_BATCHING_MAX_BUCKETS 32

typedef struct vp_bucket {
    uint64_t upper;       /* bucket bound: lengths up to this             */
    uint64_t padded_len;  /* the longest length in it (what batches pad to) */
    uint64_t sequences, tokens;
    uint64_t max_batch;   /* largest batch at padded_len under the budget */
    uint64_t batch;       /* floor(token_budget / padded_len)             */
    uint64_t batches;     /* ceil(sequences / batch)                      */
    double step_s;        /* one batch (0 without a GPU)                  */
} vp_bucket;

typedef struct vp_batching_result {
    size_t n_buckets;     /* non-empty buckets, ascending                 */
    vp_bucket bucket[VP_BATCHING_MAX_BUCKETS];
    uint64_t token_budget;      /* padded: tokens per batch               */
    size_t limiting;            /* the bucket that sets token_budget      */
    double padding_waste;       /* padded tokens that are padding, 0..1   */
    double padded_time_s;       /* one pass over the data                 */
    double padded_tokens_per_s; /* real (unpadded) tokens per second      */
    uint64_t packed_tokens;     /* packed: tokens per batch               */
    uint64_t packed_batches;    /* ceil(all tokens / packed_tokens)       */
    double packed_step_s;       /* one packed batch                       */
    double packed_time_s, packed_tokens_per_s;
    uint32_t simulations;
} vp_batching_result;

/* Size padded and packed batching of the lengths l for model m under
 * setup (its budget setup->alloc.limit, precision, optimizer or
 * inference; setup->batch and seq are ignored). bounds[] (ascending, n
 * entries) are the bucket bounds; n 0 takes powers of two. hw NULL leaves
 * the times 0. VP_EOOM when not even one sequence of the longest length
 * fits; VP_EARG without a budget or with more than VP_BATCHING_MAX_BUCKETS
 * buckets or bounds below the longest length. */
vp_status vp_batching_plan(const vp_model *m, const vp_setup *setup,
                           const vp_hw *hw, const vp_lengths *l,
                           const uint64_t *bounds, size_t n_bounds,
                           vp_batching_result *out, vp_error *err);

#endif
