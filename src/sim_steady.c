/* Gradient accumulation in closed form: the steady state of the
 * micro-batch loop.
 *
 * The simulator is deterministic: what a micro-batch allocates and frees
 * depends only on the state it starts from (the allocator's blocks, the
 * live tensors and what refers to them). When a micro-batch starts from
 * exactly the state the previous one started from, that previous
 * micro-batch took the state to itself, so every later one repeats it
 * event for event: the same peaks, the same figures after each phase. The
 * rest of the loop is then skipped, and only what grows with every
 * repetition (the event count, the allocator's retries, the host traffic
 * of offloads) is advanced by the remaining count times what one
 * repetition added. The output is the loop's, byte for byte (tested in
 * tests/test_steady.c against the loop, and with `make equiv`), and the work
 * is that of the micro-batches before the steady state, whatever --accum
 * is.
 *
 * The state is written out as words and compared whole (not hashed): the
 * allocator's (vp__allocator_state) and the simulator's: every tensor's
 * reference count, bytes, category, op and block address (not its handle,
 * new with every allocation), the free tensor ids in order, every per-op
 * and per-parameter slot, the Python and checkpoint holds, the tensors
 * the autograd graph keeps until the loss is deleted and an op's casts of
 * frozen weights (fine-tuning), the INT8 weights and whether
 * bitsandbytes' quantization maps are on the GPU, the live bytes by
 * category (generate()'s KV cache included), the peaks so far with the
 * op and token they name, and the loop's own tensors (the batch and the
 * loss). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "allocator_internal.h"
#include "sim_internal.h"

/* Room for k more words in w, false when memory runs out. */
static inline bool room(vp_words *w, size_t k)
{
    return k <= w->cap - w->n ||
           (k <= SIZE_MAX - w->n &&
            vp__grow((void **)&w->v, &w->cap, w->n + k, sizeof *w->v));
}

/* Bytes as words (the last one padded with zeros), copied in place. */
static bool add_bytes(vp_words *w, const void *p, size_t n)
{
    size_t k = n / 8 + (n % 8 != 0);
    if (!room(w, k))
        return false;
    if (k > 0) {
        w->v[w->n + k - 1] = 0;
        memcpy(w->v + w->n, p, n);
    }
    w->n += k;
    return true;
}

static bool add1(vp_words *w, uint64_t x)
{
    return vp__words_add(w, &x, 1);
}

/* Tensor ids are names: the loop frees and makes the batch's tensors in
 * an order that swaps their ids from one micro-batch to the next. The
 * state names each tensor by where it is first referred to (the loop's
 * tensors, the holds, then the per-op and per-parameter slots, in that
 * order); the live tensors nothing refers to are listed as a sorted
 * multiset. */
typedef struct names {
    const sim *S;
    vp_words *w;
    uint32_t *canon; /* per tensor id: its name, NONE before it is seen */
    uint32_t *order; /* per name: the tensor id                        */
    uint32_t n;
} names;

static uint32_t name_of(names *m, uint32_t id)
{
    if (id == NONE)
        return NONE;
    if (m->canon[id] == NONE) {
        m->canon[id] = m->n;
        m->order[m->n++] = id;
    }
    return m->canon[id];
}

/* Tensor ids (NONE allowed) by their names, two a word (the first in the
 * low half), written at o (room made): the word after them. */
static inline uint64_t *put_ids(names *m, uint64_t *o, const uint32_t *v,
                                size_t n)
{
    for (size_t i = 0; i + 1 < n; i += 2) {
        uint64_t x = name_of(m, v[i]); /* named in this order */
        *o++ = x | (uint64_t)name_of(m, v[i + 1]) << 32;
    }
    if (n % 2)
        *o++ = name_of(m, v[n - 1]);
    return o;
}

static bool add_ids(names *m, const uint32_t *v, size_t n)
{
    vp_words *w = m->w;
    size_t k = n / 2 + n % 2;
    if (!room(w, k))
        return false;
    put_ids(m, w->v + w->n, v, n);
    w->n += k;
    return true;
}

/* The per-op saved-tensor slots in use, room made for all at once. */
static bool saved_ids(names *m)
{
    const sim *S = m->S;
    size_t no = S->g->n_ops, k = 0;
    for (size_t i = 0; i < no; i++)
        k += S->n_saved[i] / 2u + S->n_saved[i] % 2u;
    if (!room(m->w, k))
        return false;
    uint64_t *o = m->w->v + m->w->n;
    for (size_t i = 0; i < no; i++)
        o = put_ids(m, o, S->saved + i * MAX_SAVED, S->n_saved[i]);
    m->w->n += k;
    return true;
}

/* Tensor id's record, its block at `addr`. */
static void tensor_rec_at(const sim *S, uint32_t id, uint64_t addr,
                          uint64_t rec[5])
{
    const vp__tensor *t = &S->t[id];
    rec[0] = t->refs;
    rec[1] = t->bytes;
    rec[2] = t->cat;
    rec[3] = (uint64_t)(uint32_t)t->op;
    rec[4] = addr;
}

static void tensor_rec(const sim *S, uint32_t id, uint64_t rec[5])
{
    tensor_rec_at(S, id, vp_allocator_block_addr(S->a, S->t[id].handle),
                  rec);
}

static int rec_cmp(const void *x, const void *y)
{
    const uint64_t *a = x, *b = y;
    for (int i = 0; i < 5; i++)
        if (a[i] != b[i])
            return a[i] < b[i] ? -1 : 1;
    return 0;
}

static bool holds(names *m)
{
    const sim *S = m->S;
    if (!add1(m->w, S->n_held) || !add_ids(m, S->held, S->n_held) ||
        !add1(m->w, S->n_ckin))
        return false;
    for (size_t k = 0; k < S->n_ckin; k++)
        if (!add1(m->w, (uint64_t)(uint32_t)S->ckin[k].seg << 32 |
                            name_of(m, S->ckin[k].id)))
            return false;
    if (!add1(m->w, S->n_leaf) || !add_ids(m, S->leaf, S->n_leaf) ||
        !add1(m->w, S->n_opc) || !add_ids(m, S->opc, S->n_opc))
        return false;
    if (!add1(m->w, S->n_ph))
        return false;
    for (size_t k = 0; k < S->n_ph; k++) {
        const struct vp__pyhold *h = &S->ph[k];
        uint64_t rec[2] = {name_of(m, h->id),
                           (uint64_t)h->kind << 32 | (uint32_t)h->seg};
        if (!vp__words_add(m->w, rec, 2))
            return false;
    }
    return true;
}

static bool slots(names *m)
{
    const sim *S = m->S;
    size_t no = S->g->n_ops, np = S->g->n_params;
    return add_bytes(m->w, S->n_saved, no) && saved_ids(m) &&
           add_ids(m, S->out_t, no) && add_bytes(m->w, S->out_eb, no) &&
           add_bytes(m->w, S->lay, no) && add_bytes(m->w, S->glay, no) &&
           add_ids(m, S->grad_t, no) &&
           add_bytes(m->w, S->reload, no * sizeof *S->reload) &&
           add_ids(m, S->pgrad, np) && add_ids(m, S->cast, np) &&
           add_ids(m, S->st1, np) && add_ids(m, S->st2, np) &&
           (S->int8 == NULL ||
            add_bytes(m->w, S->int8, np * sizeof *S->int8));
}

/* The n live tensors nothing refers to, as (block address, id) pairs at
 * p (room for 4n words), in the order of their addresses (a radix sort),
 * their records appended to w in that order, when no two share an
 * address: true. Otherwise (or when memory runs out) w is as it was and
 * false. In address order the records are in rec_cmp's order: a listing
 * of the multiset, as the sort of the records that tensors falls back
 * to. */
static bool by_address(const sim *S, vp_words *w, uint64_t *p, size_t n)
{
    const uint64_t *q = vp__radix_pairs(p, p + 2 * n, n);
    bool ok = q != NULL && n <= (SIZE_MAX - w->n) / 5 &&
              vp__grow((void **)&w->v, &w->cap, w->n + 5 * n, sizeof *w->v);
    for (size_t i = 1; i < n && ok; i++)
        ok = q[2 * i] > q[2 * i - 2];
    if (!ok)
        return false;
    uint64_t *o = w->v + w->n;
    for (size_t i = 0; i < n; i++)
        tensor_rec_at(S, (uint32_t)q[2 * i + 1], q[2 * i], o + 5 * i);
    w->n += 5 * n;
    return true;
}

/* The tensors referred to, in the order of their names: room for all
 * their records at once, each written in place. */
static bool named_tensors(names *m)
{
    const sim *S = m->S;
    vp_words *w = m->w;
    size_t n = m->n;
    if (n > (SIZE_MAX - w->n) / 5 ||
        !vp__grow((void **)&w->v, &w->cap, w->n + 5 * n, sizeof *w->v))
        return false;
    uint64_t *o = w->v + w->n;
    for (size_t k = 0; k < n; k++)
        tensor_rec(S, m->order[k], o + 5 * k);
    w->n += 5 * n;
    return true;
}

/* The n live tensors nothing refers to, as (handle, id) pairs at p, in
 * the order of their block addresses, read off the allocator's live
 * blocks in address order (nb (handle, address) pairs at hb,
 * vp__allocator_state_handles): true when each tensor's handle is a
 * distinct live allocated block's, its records then in by_address's
 * order (its addresses rise strictly). Otherwise (or when memory runs
 * out) w is as it was and false. */
static bool along_blocks(names *m, const uint64_t *p, size_t n,
                         const uint64_t *hb, size_t nb)
{
    const sim *S = m->S;
    vp_words *w = m->w;
    size_t ns = vp__allocator_slot_bound(S->a), k = 0;
    uint32_t *tid = malloc((ns ? ns : 1) * sizeof *tid); /* per slot */
    bool ok = tid != NULL && n <= (SIZE_MAX - w->n) / 5 &&
              vp__grow((void **)&w->v, &w->cap, w->n + 5 * n, sizeof *w->v);
    if (ok)
        memset(tid, 0xff, ns * sizeof *tid); /* NONE */
    for (size_t i = 0; i < n && ok; i++) {
        uint64_t lo = p[2 * i] & 0xffffffffu;
        ok = lo != 0 && lo <= ns && tid[lo - 1] == NONE;
        if (ok)
            tid[lo - 1] = (uint32_t)p[2 * i + 1];
    }
    uint64_t *o = ok ? w->v + w->n : NULL; /* not reloaded per record */
    for (size_t j = 0; j < nb && ok && k < n; j++) {
        uint64_t h = hb[2 * j];
        if (h == 0)
            continue;
        uint32_t id = tid[(h & 0xffffffffu) - 1];
        if (id != NONE && S->t[id].handle == h)
            tensor_rec_at(S, id, hb[2 * j + 1], o + 5 * k++);
    }
    free(tid);
    if (!ok || k != n)
        return false;
    w->n += 5 * n;
    return true;
}

/* The allocator's state, then the live tensors nothing refers to and
 * their count: along_blocks where the live blocks are at most five a
 * tensor (the walk and the handles the allocator writes cost about 14
 * instructions a block, by_address's radix sort and handle lookups about
 * 45 a tensor: measured, resnet50 with 1.2 blocks a tensor gains, gpt2
 * with 4 to 5 gains a little, llama-3-70b with 6 loses), else by_address,
 * else (two share an address, a handle names no live block) sorted whole.
 * The three write the same words. */
static bool allocator_and_unnamed(names *m)
{
    const sim *S = m->S;
    /* one pass: room for every tensor (by_address wants 4 words a pair) */
    uint64_t *p = malloc((S->nt ? S->nt : 1) * 4 * sizeof *p);
    size_t n = 0, nb = 0, live = vp__allocator_live_blocks(S->a);
    /* in locals: p's words could be S's or the table's, to the compiler */
    const vp__tensor *t = S->t;
    const uint32_t *canon = m->canon;
    size_t nt = S->nt;
    for (uint32_t id = 0; id < nt && p; id++)
        if (t[id].refs != 0 && canon[id] == NONE) {
            p[2 * n] = t[id].handle;
            p[2 * n + 1] = id;
            n++;
        }
    if (!p) /* the count, for the sorted fallback below */
        for (uint32_t id = 0; id < S->nt; id++)
            n += S->t[id].refs != 0 && m->canon[id] == NONE;
    uint64_t *hb = p && n > 0 && live / 5 <= n
                       ? malloc(live * 2 * sizeof *hb)
                       : NULL;
    bool ok = hb ? vp__allocator_state_handles(S->a, m->w, hb, &nb)
                 : vp__allocator_state(S->a, m->w);
    bool done = ok && hb && nb > 0 && along_blocks(m, p, n, hb, nb);
    free(hb);
    if (ok && !done && p) {
        for (size_t i = 0; i < n; i++)
            p[2 * i] = vp_allocator_block_addr(S->a, p[2 * i]);
        done = by_address(S, m->w, p, n);
    }
    free(p);
    if (ok && !done) {
        size_t from = m->w->n;
        uint64_t rec[5];
        for (uint32_t id = 0; id < S->nt && ok; id++) {
            if (S->t[id].refs == 0 || m->canon[id] != NONE)
                continue;
            tensor_rec(S, id, rec);
            ok = vp__words_add(m->w, rec, 5);
        }
        if (ok)
            qsort(m->w->v + from, n, 5 * sizeof *m->w->v, rec_cmp);
    }
    return ok && add1(m->w, n);
}

/* Everything that decides the rest of the loop, in *w. */
static bool state(const sim *S, const uint32_t *batch, size_t nb,
                  uint32_t loss_t, bool any_peak, vp_words *w)
{
    uint64_t scalars[] = {nb,
                          S->host_now,
                          S->phase_peak,
                          any_peak ? 0 : S->peak,
                          (uint64_t)S->ws_fwd_lt << 2 |
                              (uint64_t)S->ws_bwd << 1 | S->ws_bwd_lt,
                          (uint64_t)S->saving_offloadable << 32 |
                              (uint32_t)S->recompute_slot,
                          S->out->host_bytes,
                          (uint64_t)S->kbit << 1 | S->qmaps,
                          S->gen_token,
                          any_peak ? 0 : (uint64_t)(uintptr_t)S->peak_op};
    names m = {S, w, malloc((S->nt ? S->nt : 1) * sizeof(uint32_t)),
               malloc((S->nt ? S->nt : 1) * sizeof(uint32_t)), 0};
    bool ok = m.canon && m.order;
    if (ok)
        memset(m.canon, 0xff, S->nt * sizeof(uint32_t)); /* NONE */
    w->n = 0;
    ok = ok &&
         vp__words_add(w, scalars, sizeof scalars / sizeof scalars[0]) &&
         vp__words_add(w, S->cat_live, VP_CAT__COUNT + 1) &&
         add_ids(&m, &loss_t, 1) && add_ids(&m, batch, nb) && holds(&m) &&
         slots(&m) && named_tensors(&m) && allocator_and_unnamed(&m);
    free(m.canon);
    free(m.order);
    return ok;
}

/* The counters that grow with every micro-batch. */
static void counters(const sim *S, uint64_t c[3])
{
    vp_allocator_stats st;
    vp_allocator_stats_get(S->a, &st);
    c[0] = S->events;
    c[1] = st.num_alloc_retries;
    c[2] = S->out->host_traffic;
}

void vp__steady_free(vp__steady *d)
{
    free(d->prev.v);
    free(d->cur.v);
    memset(d, 0, sizeof *d);
}

bool vp__steady_reached(sim *S, vp__steady *d, const uint32_t *batch,
                        size_t nb, uint32_t loss_t, uint64_t left)
{
    if (!OK(S))
        return false;
    /* room for the state at once, not by doubling from 16 words: the
     * last one's size, or at first a share of the tensors and ops and
     * the allocator's words (which come last: a doubling there copied
     * the whole state) */
    size_t room = d->have ? d->prev.n
                          : 8 * S->nt + 4 * (size_t)S->g->n_ops + 1024 +
                                vp__allocator_state_words(S->a);
    if (!vp__grow((void **)&d->cur.v, &d->cur.cap, room, sizeof *d->cur.v) ||
        !state(S, batch, nb, loss_t, d->any_peak, &d->cur)) {
        S->st = vp_error_set(S->err, VP_ENOMEM, "out of memory");
        return false;
    }
    uint64_t now[3];
    counters(S, now);
    bool same = d->have && d->prev.n == d->cur.n &&
                memcmp(d->prev.v, d->cur.v, d->cur.n * sizeof *d->cur.v) == 0;
    if (!same) {
        vp_words t = d->prev;
        d->prev = d->cur;
        d->cur = t;
        memcpy(d->at, now, sizeof now);
        d->have = true;
        return false;
    }
    /* the micro-batch since the last snapshot repeats `left` more times */
    uint64_t add[3];
    for (int i = 0; i < 3; i++)
        if (!vp_mul_u64(now[i] - d->at[i], left, &add[i])) {
            S->st = vp_error_set(S->err, VP_EOVERFLOW,
                                 "the accumulated counters overflow 64 bits");
            return false;
        }
    if (!vp_add_u64(S->events, add[0], &S->events) ||
        !vp_add_u64(S->retries_skipped, add[1], &S->retries_skipped) ||
        !vp_add_u64(S->out->host_traffic, add[2], &S->out->host_traffic)) {
        S->st = vp_error_set(S->err, VP_EOVERFLOW,
                             "the accumulated counters overflow 64 bits");
        return false;
    }
    d->have = false;
    return true;
}
