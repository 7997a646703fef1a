/* generate()'s logits stage: what transformers 5.17's GenerationMixin.
 * _sample does between two forwards, in its order (traced:
 * groundtruth/traces/llama-1b-gen-b8-p1024-n16-dynamic and
 * qwen2-0.5b-gen-b16-p256-n16-dynamic-sample; docs/GENERATE.md §3):
 *
 *   _update_model_kwargs_for_generation   the attention mask and the
 *                                         positions, one token longer
 *   next_token_logits = outputs.logits[:, -1, :].to(copy=True,
 *                                         dtype=torch.float32)
 *   next_token_scores = logits_processor(input_ids, next_token_logits)
 *   probs = softmax(scores); torch.multinomial(probs, 1)   (sampling)
 *   or torch.argmax(scores, dim=-1)                        (greedy)
 *   input_ids = torch.cat([input_ids, next_tokens[:, None]], dim=-1)
 *   del outputs
 *
 * next_token_logits, next_token_scores and probs are locals of the loop:
 * each lives until the next step assigns its name again, through the
 * next forward. The processors (generation/logits_process.py) are those
 * generate() makes for min_new_tokens (MinLengthLogitsProcessor and
 * MinNewTokensLengthLogitsProcessor, when the model has an EOS token),
 * then TopKLogitsWarper and TopPLogitsWarper when sampling. torch.sort's
 * buffers follow aten/src/ATen/native/cuda/SortStable.cu and cub's radix
 * sort (sort_buffers). Tensors of a few bytes (scalars, next_tokens,
 * the stopping criteria's flags) are left out. */
#include "generate_impl.h"

/* torch.sort sorts in place (sortKeyValueInplace) up to this many
 * elements per row (aten/src/ATen/native/cuda/Sort.cpp,
 * should_use_small_sort); longer rows take SortStable.cu's paths. */
#define SMALL_SORT 4096u
/* SortStable.cu: segmented_sort_pairs_by_full_sort below this many rows
 * (and above one), cub's segmented sort from it. */
#define FULL_SORT_MAX_ROWS 128u
/* cub DeviceRadixSort (onesweep) tiles: items per tile for 4- and
 * 8-byte keys on sm90, from the traced temporary storage of
 * radix_sort_pairs<float, int2> (29,644,287 B for 2,430,976 keys) and
 * radix_sort_keys<int64> (435,711 B). */
#define ONESWEEP_TILE_4 5376u
#define ONESWEEP_TILE_8 5760u
#define RADIX_DIGITS 256u
#define CUB_ALIGN 256u

static uint64_t round_up(sim *S, uint64_t n, uint64_t m)
{
    uint64_t r = n % m ? m - n % m : 0;
    if (n > UINT64_MAX - r) {
        (void)vp__mulc(S, UINT64_MAX, 2); /* sets the overflow error */
        return 0;
    }
    return n + r;
}

/* cub::DeviceRadixSort's temporary storage (onesweep; AliasTemporaries:
 * every slot 256-B aligned, plus 255 B): the digit histograms of every
 * pass (8 B a digit), the per-pass tile counters, a lookback word per
 * digit per tile, and, when there is more than one pass, alternate key
 * and value buffers (the input is not to be overwritten). */
static uint64_t radix_temp(sim *S, uint64_t n, uint32_t kb, uint32_t vb,
                           uint32_t bits)
{
    uint32_t passes = (bits + 7) / 8;
    uint64_t tile = kb > 4 ? ONESWEEP_TILE_8 : ONESWEEP_TILE_4;
    uint64_t tiles = n / tile + (n % tile != 0);
    uint64_t t = round_up(S, (uint64_t)passes * RADIX_DIGITS * 8, CUB_ALIGN);
    t += CUB_ALIGN; /* tile counters */
    t += round_up(S, vp__mulc(S, tiles, RADIX_DIGITS * 4), CUB_ALIGN);
    if (passes > 1) {
        t += round_up(S, vp__mulc(S, n, kb), CUB_ALIGN);
        t += round_up(S, vp__mulc(S, n, vb), CUB_ALIGN);
    }
    return t + CUB_ALIGN - 1; /* bounded: n < 2^40 */
}

/* The buffers of torch.sort(x, dim=-1) on `rows` rows of `cols` fp32
 * values, beyond its values and indices (SortStable.cu,
 * launch_stable_sort_kernel). */
static void sort_buffers(sim *S, uint64_t rows, uint64_t cols)
{
    uint64_t n = vp__mulc(S, rows, cols);
    if (cols <= SMALL_SORT)
        return;
    if (rows == 1 || cols >= 1000000) {
        /* segmented_sort_large_segments: the row's index ramp, then a
         * radix sort of (value, int64 index) pairs per row */
        uint32_t idx = vp__talloc(S, vp__mulc(S, cols, 8), VP_CAT_TEMP);
        vp__transient(S, radix_temp(S, cols, 4, 8, 32));
        vp__tunref(S, idx);
    } else if (rows < FULL_SORT_MAX_ROWS) {
        /* segmented_sort_pairs_by_full_sort: (index, segment) pairs
         * twice, a keys buffer for radix_sort_pairs' discarded output,
         * then a sort of the segment ids' bits */
        uint32_t is = vp__talloc(S, vp__mulc(S, n, 8), VP_CAT_TEMP);
        uint32_t is2 = vp__talloc(S, vp__mulc(S, n, 8), VP_CAT_TEMP);
        uint32_t keys = vp__talloc(S, vp__mulc(S, n, 4), VP_CAT_TEMP);
        vp__transient(S, radix_temp(S, n, 4, 8, 32));
        vp__tunref(S, keys);
        uint32_t bits = 1;
        while (bits < 32 && ((uint64_t)1 << bits) < rows)
            bits++;
        vp__transient(S, radix_temp(S, n, 8, 0, bits));
        vp__tunref(S, is2);
        vp__tunref(S, is);
    } else {
        /* segmented_sort_pairs: the index ramp, then cub's
         * DeviceSegmentedSort: alternate key and value buffers and the
         * segments' partition (two index arrays and the group sizes) */
        uint32_t rev = vp__talloc(S, vp__mulc(S, n, 8), VP_CAT_TEMP);
        uint64_t t = round_up(S, vp__mulc(S, n, 4), CUB_ALIGN) +
                     round_up(S, vp__mulc(S, n, 8), CUB_ALIGN) +
                     2 * round_up(S, vp__mulc(S, rows, 4), CUB_ALIGN) +
                     CUB_ALIGN + CUB_ALIGN - 1;
        vp__transient(S, t);
        vp__tunref(S, rev);
    }
}

/* ---- the processors ------------------------------------------------------------ */

/* MinLengthLogitsProcessor (new_first false) or
 * MinNewTokensLengthLogitsProcessor (true): torch.arange(V) (int64),
 * isin's eos mask (V bools, with two of its own), scores.clone(), and
 * torch.where(eos_mask, -inf, scores) while fewer tokens than min_new
 * are made (the clone is then dropped). Returns the output, owned. */
static uint32_t min_length(vp__gen *G, uint32_t in, uint64_t t,
                           bool new_first)
{
    sim *S = G->S;
    uint64_t bv4 = vp__mulc(S, vp__mulc(S, G->B, G->vocab), 4);
    uint32_t c = new_first ? vp__talloc(S, bv4, VP_CAT_TEMP) : NONE;
    uint32_t ar = vp__talloc(S, vp__mulc(S, G->vocab, 8), VP_CAT_TEMP);
    uint32_t m = vp__talloc(S, G->vocab, VP_CAT_TEMP);
    uint32_t i1 = vp__talloc(S, G->vocab, VP_CAT_TEMP);
    uint32_t i2 = vp__talloc(S, G->vocab, VP_CAT_TEMP);
    vp__tunref(S, i2);
    vp__tunref(S, i1);
    if (!new_first)
        c = vp__talloc(S, bv4, VP_CAT_TEMP);
    uint32_t out = c;
    if (t < G->cfg->min_new) {
        out = vp__talloc(S, bv4, VP_CAT_TEMP);
        vp__tunref(S, c);
    }
    vp__tunref(S, ar);
    vp__tunref(S, m);
    vp__tunref(S, in); /* the processor loop's `scores` is rebound */
    return out;
}

/* TopKLogitsWarper: torch.topk's values and indices (k per row), the
 * boolean `scores < kth`, then masked_fill. */
static uint32_t top_k(vp__gen *G, uint32_t in)
{
    sim *S = G->S;
    uint64_t bv = vp__mulc(S, G->B, G->vocab);
    uint64_t bk = vp__mulc(S, G->B, G->cfg->top_k);
    uint32_t tv = vp__talloc(S, vp__mulc(S, bk, 4), VP_CAT_TEMP);
    uint32_t ti = vp__talloc(S, vp__mulc(S, bk, 8), VP_CAT_TEMP);
    vp__tunref(S, ti);
    uint32_t rm = vp__talloc(S, bv, VP_CAT_TEMP);
    vp__tunref(S, tv);
    uint32_t out = vp__talloc(S, vp__mulc(S, bv, 4), VP_CAT_TEMP);
    vp__tunref(S, rm);
    vp__tunref(S, in);
    return out;
}

/* TopPLogitsWarper: torch.sort (values, int64 indices and the sort's own
 * buffers), softmax and cumsum, the boolean `cumulative <= 1 - top_p`,
 * its scatter back, masked_fill. */
static uint32_t top_p(vp__gen *G, uint32_t in)
{
    sim *S = G->S;
    uint64_t bv = vp__mulc(S, G->B, G->vocab);
    uint32_t sv = vp__talloc(S, vp__mulc(S, bv, 4), VP_CAT_TEMP);
    uint32_t si = vp__talloc(S, vp__mulc(S, bv, 8), VP_CAT_TEMP);
    sort_buffers(S, G->B, G->vocab);
    uint32_t sm = vp__talloc(S, vp__mulc(S, bv, 4), VP_CAT_TEMP);
    uint32_t cs = vp__talloc(S, vp__mulc(S, bv, 4), VP_CAT_TEMP);
    vp__tunref(S, sm);
    uint32_t r1 = vp__talloc(S, bv, VP_CAT_TEMP);
    uint32_t r2 = vp__talloc(S, bv, VP_CAT_TEMP);
    uint32_t out = vp__talloc(S, vp__mulc(S, bv, 4), VP_CAT_TEMP);
    vp__tunref(S, sv);
    vp__tunref(S, si);
    vp__tunref(S, cs);
    vp__tunref(S, r1);
    vp__tunref(S, r2);
    vp__tunref(S, in);
    return out;
}

/* ---- one step ---------------------------------------------------------------- */

/* A tensor that replaces *slot (allocated before the old one is freed). */
static void replace(sim *S, uint32_t *slot, uint64_t bytes, vp_category c)
{
    uint32_t n = vp__talloc(S, bytes, c);
    vp__tunref(S, *slot);
    *slot = n;
}

static void next_token(vp__gen *G, uint64_t t)
{
    sim *S = G->S;
    const vp_generate *c = G->cfg;
    uint64_t bv4 = vp__mulc(S, vp__mulc(S, G->B, G->vocab), 4);
    uint32_t cur = G->l32;
    vp__tref(S, cur);
    if (G->eos && c->min_new > 0) {
        cur = min_length(G, cur, t, false);
        cur = min_length(G, cur, t, true);
    }
    if (c->sample && c->top_k > 0)
        cur = top_k(G, cur);
    if (c->sample && c->top_p)
        cur = top_p(G, cur);
    vp__tunref(S, G->scores); /* next_token_scores = ... */
    G->scores = cur;
    if (c->sample) {
        replace(S, &G->probs, bv4, VP_CAT_TEMP);
        /* torch.multinomial(probs, 1): an exponential draw per logit */
        vp__transient(S, bv4);
    }
}

void vp__gen_logits_stage(vp__gen *G, uint64_t t)
{
    sim *S = G->S;
    uint64_t len = vp__mulc(S, vp__mulc(S, G->B, G->P + t + 1), 8);
    S->cur_op = "logits";
    replace(S, &G->mask, len, VP_CAT_INPUT);
    replace(S, &G->pos, len, VP_CAT_INPUT);
    replace(S, &G->l32,
            vp__mulc(S, vp__mulc(S, G->B, G->vocab), 4), VP_CAT_TEMP);
    next_token(G, t);
    replace(S, &G->ids, len, VP_CAT_INPUT);
    vp__tunref(S, G->logits); /* del outputs */
    G->logits = NONE;
    S->cur_op = "";
}

void vp__gen_logits_release(vp__gen *G)
{
    sim *S = G->S;
    uint32_t *ts[] = {&G->l32, &G->scores, &G->probs, &G->ids, &G->mask,
                      &G->pos, &G->logits};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++) {
        vp__tunref(S, *ts[i]);
        *ts[i] = NONE;
    }
}
