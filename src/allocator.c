/* vramplan: model of PyTorch's CUDA caching allocator (native backend).
 *
 * Rules: shared/docs/PYTORCH_MEMORY.md §1, c10/cuda/CUDACachingAllocator.cpp
 * (DeviceCachingAllocator::malloc/free, get_free_block, should_split,
 * alloc_block, release_available_cached_blocks, release_cached_blocks,
 * find_expandable_block, map_block, unmap_block).
 *
 * Data layout.
 *  - Every block lives in two parallel tables and is named by its index:
 *    a->b, 32 bytes a block, 64-byte aligned (what malloc, free and the
 *    merge test read), and a->bc (the stream, the expandable segment, the
 *    requested bytes). Dead slots are chained through `next` into a free
 *    list. A handle is
 *    (generation << 32) | (index + 1); the slot's generation is bumped on
 *    every free and on slot reuse, so stale handles are refused.
 *  - The blocks of a segment form a doubly linked list (prev/next) in
 *    address order.
 *  - Each pool (small, large) keeps its free mapped blocks ordered by
 *    (stream, size, address), like BlockComparatorSize, and, for
 *    expandable segments, its unmapped ranges ordered by (stream,
 *    address), like BlockComparatorAddress: per stream, eight size
 *    classes per power of two with a bitmap of those in use, each class an
 *    array sorted by key ("index" below). A block is in at most one tree.
 *  - Segments get simulated, increasing, 2 MiB aligned addresses.
 *
 * Cost: malloc and free are O(1) when the block taken or given back is
 * the lowest of its size class (nearly always: see the index), else
 * O(log k) to find it and O(k) to move the entries below it (k = free
 * blocks in the size class, a bit scan finds the next class); handle
 * lookup is O(1); empty_cache and the OOM path are O(n k). */
#include "vramplan/allocator.h"

#include "allocator_internal.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "allocator_internal.h"
#include "vramplan/error.h"
#include "vramplan/units.h"

#define NIL UINT32_MAX
#define NO_SOLO INT64_MIN /* tree.solo: not exactly one directory */

/* The request's path, inlined into both callers (malloc and transient);
 * what it seldom takes, out of line. */
#if defined(__GNUC__)
#define HOT static inline __attribute__((always_inline))
#define COLD static __attribute__((noinline, cold))
#else
#define HOT static inline
#define COLD static
#endif

enum {
    K_MIN_BLOCK = 512,                 /* kMinBlockSize   */
    K_SMALL_SIZE = 1048576,            /* kSmallSize      */
    K_SMALL_BUFFER = 2097152,          /* kSmallBuffer    */
    K_MIN_LARGE_ALLOC = 10485760,      /* kMinLargeAlloc  */
    K_ROUND_LARGE = 2097152,           /* kRoundLarge     */
    K_SEG_ALIGN = 2097152              /* simulated address alignment */
};
#define K_LARGE_BUFFER ((uint64_t)20 * VP_MiB)
/* Device size assumed for the address space of an expandable segment when
 * cfg.device_total is 0. */
#define K_DEFAULT_VA_TOTAL ((uint64_t)1 << 46)

enum { POOL_SMALL = 0, POOL_LARGE = 1 };

/* A block, in two parallel tables: what malloc, free and the merge test
 * read (32 bytes: two blocks a cache line, a block never across two) and
 * what they seldom read (the stream: the directory of a tree with one
 * stream is known without it; the expandable segment: only with
 * expandable segments; the requested bytes: only stored and counted). */
typedef struct blk {
    uint64_t addr;      /* simulated device address                       */
    uint64_t size;      /* bytes                                          */
    uint32_t prev, next;  /* neighbours in the segment, NIL at the ends;
                             next links the dead slots                    */
    uint32_t gen;         /* handle generation                            */
    uint8_t pool, allocated, mapped, live;
} blk;

typedef struct blkc {
    uint64_t requested; /* bytes asked for (read of allocated blocks
                           only: a free block keeps its last)            */
    uint32_t es;          /* expandable segment index, NIL if cudaMalloc  */
    int32_t stream;
    uint32_t seg;         /* a segment's first block: the segment's number
                             (seg_head), NIL for every other block and
                             with expandable segments                    */
} blkc;

_Static_assert(sizeof(blk) == 32, "a block's hot record is 32 bytes");

/* Size classes (index below), eight per power of two. */
#define N_CLASSES 512
#define CLASS_WORDS (N_CLASSES / 64)
#define FIRST_CAP 8 /* a class's first array, cut from its directory's slab */

/* One free block in a size class: its key and its slot. */
typedef struct ent {
    uint64_t size; /* 0 in an address-keyed tree */
    uint64_t addr;
    uint32_t i;
} ent;

/* A size class: its blocks sorted by descending key, so that the lowest
 * (the one best fit takes) is the last. */
typedef struct cls {
    ent *v;
    uint32_t n, cap;
} cls;

/* The blocks of one stream in one tree, by size class. */
typedef struct sdir {
    cls c[N_CLASSES];
    uint64_t used[CLASS_WORDS];/* the classes holding blocks */
    uint64_t owned[CLASS_WORDS];/* the classes with an array of their
                                   own (free_dirs frees those, not all
                                   512) */
    ent *slab;                  /* every class's first FIRST_CAP
                                   entries, NULL until a class is used */
    int32_t stream;
} sdir;

typedef struct tree {
    sdir *d;      /* ascending stream */
    size_t n, cap;
    int64_t solo; /* the stream of the only directory; NO_SOLO when there
                     are none or several (one load tells the common case,
                     one stream, where d[0].stream took two) */
    bool by_size; /* key (stream, size, addr) if true, else (stream, addr) */
} tree;

typedef struct pool {
    tree free_t;     /* free, mapped blocks        */
    tree unmapped_t; /* unmapped expandable ranges */
} pool;

typedef struct xseg {
    uint64_t base, size, page;
    bool live;
} xseg;

struct vp_allocator {
    vp_allocator_config cfg;
    blk *b;                      /* hot records                           */
    blkc *bc;                    /* cold records, same slots              */
    uint32_t n_slots, cap_slots; /* high-water mark and capacity          */
    uint32_t free_slot;          /* head of the dead-slot list            */
    uint32_t n_dead;             /* slots on that list                    */
    bool broken;                 /* host memory ran out inside the index:
                                    every later call is refused          */
    bool plain_round;            /* no roundup_power2_divisions: every
                                    size rounds to 512 B                 */
    bool plain_fit;              /* no expandable segments and no
                                    max_split_size: best fit's block is
                                    taken as found, a large block splits
                                    on its rest alone                    */
    bool seg_lost;               /* seg_head could not grow: not used    */
    uint32_t *seg_head;          /* per segment made (cudaMalloc, in the
                                    order of their rising addresses): its
                                    first block, NIL once released       */
    uint32_t n_seg, cap_seg;
    pool pools[2];
    xseg *xs;
    size_t n_xs, cap_xs;
    uint64_t next_addr;
    uint64_t n_xs_live;
    vp_allocator_stats st;
    vp_allocator_segment_fn seg_fn; /* segment hook, NULL when unset     */
    void *seg_ud;
    vp_allocator_segment_fn map_fn; /* page map hook, NULL when unset    */
    void *map_ud;
    uint64_t last_freed;            /* handle released last, 0 if none   */
    uint64_t last_freed_addr;       /* and where its block was           */
};

/* One request, as AllocParams. */
typedef struct req {
    int32_t stream;
    uint64_t size;       /* rounded */
    uint64_t alloc_size; /* get_allocation_size(size), for new memory */
    int pool;
} req;

typedef struct bkey {
    int32_t stream;
    uint64_t size;
    uint64_t addr;
} bkey;

/* ---------------------------------------------------------------- sizes */

static void cfg_defaults(vp_allocator_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->limit = 0;
    cfg->device_total = 0;
    cfg->expandable_segments = false;
    cfg->max_split_size = UINT64_MAX;
    cfg->max_non_split_rounding = 20 * VP_MiB;
    cfg->large_segment_size = K_LARGE_BUFFER;
}

void vp_allocator_config_init(vp_allocator_config *cfg)
{
    if (cfg)
        cfg_defaults(cfg);
}

static inline unsigned log2_floor(uint64_t v) /* v > 0 */
{
#if defined(__GNUC__)
    /* 63 - clz, written as clz ^ 63 (equal for clz in 0..63), which GCC
     * folds with the bsr it makes clz from: one instruction, not three */
    return (unsigned)__builtin_clzll(v) ^ 63u;
#else
    unsigned r = 0;
    while (v >>= 1)
        r++;
    return r;
#endif
}

static inline unsigned ctz64(uint64_t v) /* v > 0 */
{
#if defined(__GNUC__)
    return (unsigned)__builtin_ctzll(v);
#else
    unsigned r = 0;
    while (!(v & 1)) {
        v >>= 1;
        r++;
    }
    return r;
#endif
}

/* roundup_power2_next_division; false on overflow. */
static bool round_pow2_div(uint64_t size, uint64_t divisions, uint64_t *out)
{
    if ((size & (size - 1)) == 0) {
        *out = size;
        return true;
    }
    uint64_t floor2 = (uint64_t)1 << log2_floor(size);
    uint64_t step = floor2 >> log2_floor(divisions);
    if (step == 0) {
        if (floor2 > UINT64_MAX / 2)
            return false;
        *out = floor2 << 1;
        return true;
    }
    uint64_t lo = size & ~(step - 1);
    if (lo == size) {
        *out = size;
        return true;
    }
    return vp_add_u64(lo, step, out);
}

/* round_size; false on overflow. */
static bool round_size(const vp_allocator_config *cfg, uint64_t n,
                       uint64_t *out)
{
    if (n <= K_MIN_BLOCK) {
        *out = K_MIN_BLOCK;
        return true;
    }
    unsigned lg = log2_floor(n);
    unsigned idx = lg > 20 ? lg - 20 : 0;
    if (idx > 15)
        idx = 15;
    uint64_t div = cfg->roundup_power2_divisions[idx];
    if (div > 1 && n > (uint64_t)K_MIN_BLOCK * div)
        return round_pow2_div(n, div, out);
    return vp_round_up_u64(n, K_MIN_BLOCK, out);
}

/* get_allocation_size; false on overflow. A large_segment_size below the
 * request (only possible with a tiny large_segment_size) is raised to the
 * 2 MiB-rounded request so that the segment always holds the block. */
static bool allocation_size(const vp_allocator_config *cfg, uint64_t size,
                            uint64_t *out)
{
    if (size <= K_SMALL_SIZE) {
        *out = K_SMALL_BUFFER;
        return true;
    }
    if (size < K_MIN_LARGE_ALLOC) {
        if (cfg->large_segment_size >= size) {
            *out = cfg->large_segment_size;
            return true;
        }
    }
    return vp_round_up_u64(size, K_ROUND_LARGE, out);
}

uint64_t vp_allocator_round_size(const vp_allocator_config *cfg, uint64_t n)
{
    vp_allocator_config def;
    uint64_t r;
    if (!cfg) {
        cfg_defaults(&def);
        cfg = &def;
    }
    return round_size(cfg, n, &r) ? r : 0;
}

uint64_t vp_allocator_segment_size(const vp_allocator_config *cfg,
                                   uint64_t rounded)
{
    vp_allocator_config def;
    uint64_t r;
    if (!cfg) {
        cfg_defaults(&def);
        cfg = &def;
    }
    return allocation_size(cfg, rounded, &r) ? r : 0;
}

/* ---------------------------------------------------------------- slots */

/* reserve_slots when the slots at hand are too few: grow the array. */
static bool grow_slots(vp_allocator *a, uint64_t n)
{
    uint64_t need = (uint64_t)a->n_slots + (n - a->n_dead);
    if (need >= NIL - 1) /* index + 1 must fit in 32 bits, below NIL */
        return false;
    uint64_t cap = a->cap_slots ? a->cap_slots : 64;
    while (cap < need)
        cap *= 2;
    if (cap >= NIL - 1)
        cap = NIL - 2;
    if ((uint64_t)SIZE_MAX / sizeof(blk) - 1 < cap)
        return false;
    /* cache-line aligned, so that no block straddles two lines (the
     * size a multiple of the alignment, as aligned_alloc asks) */
    blk *nb = aligned_alloc(64, ((size_t)cap + 1) / 2 * 2 * sizeof(blk));
    if (!nb)
        return false;
    if (a->n_slots)
        memcpy(nb, a->b, (size_t)a->n_slots * sizeof(blk));
    free(a->b);
    a->b = nb; /* larger than cap_slots says until both have grown */
    blkc *nc = realloc(a->bc, (size_t)cap * sizeof(blkc));
    if (!nc)
        return false;
    a->bc = nc;
    a->cap_slots = (uint32_t)cap;
    return true;
}

/* Make sure n more blocks can be created without allocating. */
static inline bool reserve_slots(vp_allocator *a, uint64_t n)
{
    uint64_t avail = (uint64_t)a->n_dead + (a->cap_slots - a->n_slots);
    return avail >= n || grow_slots(a, n);
}

/* A new block; reserve_slots must have been called. */
/* A slot for a new block and its handle generation (*gen); both records
 * are the caller's to write. reserve_slots must have been called. */
static inline uint32_t take_slot(vp_allocator *a, uint32_t *gen)
{
    uint32_t i;
    *gen = 0;
    if (a->free_slot != NIL) {
        i = a->free_slot;
        a->free_slot = a->b[i].next;
        a->n_dead--;
        *gen = a->b[i].gen;
    } else {
        i = a->n_slots++;
    }
    return i;
}

static inline uint32_t new_block(vp_allocator *a)
{
    uint32_t gen, i = take_slot(a, &gen);
    blk *x = &a->b[i];
    memset(x, 0, sizeof *x);
    x->prev = x->next = NIL;
    x->gen = gen;
    a->bc[i] = (blkc){0, NIL, 0, NIL};
    x->mapped = 1;
    x->live = 1;
    return i;
}

/* Block `to` is now the first block of the segment `from` began (a
 * split or a merge at the segment's start). */
static inline void head_moved(vp_allocator *a, uint32_t from, uint32_t to)
{
    uint32_t s = a->bc[from].seg;
    a->bc[from].seg = NIL;
    a->bc[to].seg = s;
    if (s != NIL)
        a->seg_head[s] = to;
}

/* The segments are numbered (seg_head) in the order they were made,
 * which is the order of their addresses (take_address hands out rising
 * ones): without expandable segments, unless the numbering stopped. */
static inline bool numbered(const vp_allocator *a)
{
    return !a->cfg.expandable_segments && !a->seg_lost;
}

/* Number the new segment whose first block is i (seg_head); when the
 * table cannot grow, the numbering stops for good (seg_lost: the state
 * then sorts the segments). */
static void seg_made(vp_allocator *a, uint32_t i)
{
    if (a->seg_lost)
        return;
    if (a->n_seg == a->cap_seg) {
        uint64_t cap = a->cap_seg ? 2 * (uint64_t)a->cap_seg : 256;
        uint32_t *v = cap < NIL && (uint64_t)SIZE_MAX / sizeof *v >= cap
                          ? realloc(a->seg_head, (size_t)cap * sizeof *v)
                          : NULL;
        if (!v) {
            a->seg_lost = true;
            return;
        }
        a->seg_head = v;
        a->cap_seg = (uint32_t)cap;
    }
    a->bc[i].seg = a->n_seg;
    a->seg_head[a->n_seg++] = i;
}

/* Kill free block i (its allocated byte is 0 already: every caller's
 * block is free). */
static void delete_block(vp_allocator *a, uint32_t i)
{
    blk *x = &a->b[i];
    x->live = 0;
    x->gen++;
    x->next = a->free_slot;
    a->free_slot = i;
    a->n_dead++;
}

/* ---------------------------------------------------------------- index */

/* A pool's free (or unmapped) blocks in the order of their key (stream,
 * size, address), or (stream, address). Each stream present has a
 * directory; in it the blocks are split into size classes, eight per
 * power of two (the classes of TLSF, two-level segregated fit), each
 * class an array of (size, address, slot) sorted by descending key, and a
 * bitmap of the classes in use. Every block of an address-keyed tree is
 * in class 0. Best fit is the last entry of the request's class (when it
 * is not below the request), a binary search in that class, or the last
 * entry of the next class in use (a bit scan).
 *
 * Why arrays: a training step frees and reuses its blocks last in, first
 * out, so nearly every insert is the new lowest block of its class and
 * nearly every erase takes the lowest (llama-3-70b's step: 31,016 of
 * 42,239 inserts). Both are at the array's end: no search and no move.
 * The classes that hold many blocks hold few distinct sizes (one to
 * three), so a binary search over inline keys finds the rest without
 * touching the blocks. An insert or erase elsewhere moves the entries
 * below it (linear in the class, a memmove of 24-byte entries).
 *
 * A class's array grows by doubling; when host memory runs out there the
 * block stays out of the index and the allocator is broken: the call
 * that ran out returns VP_ENOMEM and every later call is refused (no
 * answer from an index that lost a block). */

static inline bkey key_of(const vp_allocator *a, uint32_t i)
{
    bkey k = {a->bc[i].stream, a->b[i].size, a->b[i].addr};
    return k;
}

/* The class of a size of 8 or more (every block's: 512 or more). */
static inline unsigned size_class8(uint64_t s)
{
    /* (fl - 2) * 8 + the three bits below the top one (fl = log2_floor):
     * s >> (fl - 3) is those bits with the top one, 8 + them, so the
     * class is that plus 8 * (fl - 3), without the mask */
    unsigned sh = log2_floor(s) - 3;
    return (unsigned)(s >> sh) + 8 * sh;
}

static inline unsigned size_class(uint64_t s)
{
    return s < 8 ? (unsigned)s : size_class8(s);
}

/* Entry e's key below (z, addr)? Below or equal when `or_eq`. */
static inline bool e_below(const ent *e, uint64_t z, uint64_t addr,
                           bool or_eq)
{
    if (e->size != z)
        return e->size < z;
    return or_eq ? e->addr <= addr : e->addr < addr;
}

/* The entries of class k with a key >= (z, addr) (strict: >); they are
 * its first ones. */
static uint32_t c_count_above(const cls *k, uint64_t z, uint64_t addr,
                              bool strict)
{
    uint32_t lo = 0, hi = k->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (e_below(&k->v[mid], z, addr, strict))
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* The lowest and the highest block of a class in use. */
static inline uint32_t c_lowest(const cls *k)
{
    return k->v[k->n - 1].i;
}

static inline uint32_t c_highest(const cls *k)
{
    return k->v[0].i;
}

/* Room for one more entry in class c of directory d (c_room; c_grow
 * doubles the array); false, with the allocator broken, when host memory
 * runs out. A class's first FIRST_CAP entries are its part of the
 * directory's slab (one malloc for all 512 classes: most classes never
 * hold more, and a malloc and a free each were a simulation's tenth of
 * its allocator calls on resnet50); past them, an array of its own,
 * doubled by realloc. */
static bool c_grow(vp_allocator *a, sdir *d, unsigned c)
{
    cls *k = &d->c[c];
    if (k->cap == 0) {
        if (!d->slab &&
            !(d->slab = malloc((size_t)N_CLASSES * FIRST_CAP * sizeof(ent)))) {
            a->broken = true;
            return false;
        }
        k->v = d->slab + (size_t)c * FIRST_CAP;
        k->cap = FIRST_CAP;
        return true;
    }
    uint64_t cap = 2 * (uint64_t)k->cap;
    bool own = (d->owned[c / 64] >> (c % 64)) & 1;
    ent *v = NULL;
    if (cap <= UINT32_MAX && (uint64_t)SIZE_MAX / sizeof(ent) >= cap) {
        v = own ? realloc(k->v, (size_t)cap * sizeof *v)
                : malloc((size_t)cap * sizeof *v);
        if (v && !own)
            memcpy(v, k->v, (size_t)k->n * sizeof *v);
    }
    if (!v) {
        a->broken = true;
        return false;
    }
    k->v = v;
    k->cap = (uint32_t)cap;
    d->owned[c / 64] |= (uint64_t)1 << (c % 64);
    return true;
}

static inline bool c_room(vp_allocator *a, sdir *d, unsigned c)
{
    return d->c[c].n < d->c[c].cap || c_grow(a, d, c);
}

/* The directory of `stream` in t, or where it would go (index of the
 * first directory with a larger stream). */
static size_t dir_at(const tree *t, int32_t stream)
{
    if (t->solo == stream)
        return 0;
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->d[mid].stream < stream)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static inline sdir *dir_of(const tree *t, int32_t stream)
{
    return &t->d[dir_at(t, stream)]; /* the directory exists */
}

/* Make the directory of `stream` (false: out of host memory). */
static bool ensure_dir(tree *t, int32_t stream)
{
    size_t i = dir_at(t, stream);
    if (i < t->n && t->d[i].stream == stream)
        return true;
    if (t->n == t->cap) {
        size_t cap = t->cap ? 2 * t->cap : 1;
        if (SIZE_MAX / sizeof(sdir) < cap)
            return false;
        sdir *nd = realloc(t->d, cap * sizeof *nd);
        if (!nd)
            return false;
        t->d = nd;
        t->cap = cap;
    }
    memmove(&t->d[i + 1], &t->d[i], (t->n - i) * sizeof *t->d);
    t->n++;
    sdir *d = &t->d[i];
    memset(d, 0, sizeof *d);
    d->stream = stream;
    t->solo = t->n == 1 ? stream : NO_SOLO;
    return true;
}

static void free_dirs(tree *t)
{
    for (size_t i = 0; i < t->n; i++)
        for (unsigned w = 0; w < CLASS_WORDS; w++)
            for (uint64_t bits = t->d[i].owned[w]; bits; bits &= bits - 1)
                free(t->d[i].c[w * 64 + ctz64(bits)].v);
    for (size_t i = 0; i < t->n; i++)
        free(t->d[i].slab);
    free(t->d);
}

/* First class in use >= c (N_CLASSES if none), last one < c (-1). */
static unsigned next_class(const sdir *d, unsigned c)
{
    unsigned w = c / 64;
    if (w >= CLASS_WORDS)
        return N_CLASSES;
    uint64_t bits = d->used[w] & (~(uint64_t)0 << (c % 64));
    while (!bits) {
        if (++w == CLASS_WORDS)
            return N_CLASSES;
        bits = d->used[w];
    }
    return w * 64 + (unsigned)ctz64(bits);
}

static int prev_class(const sdir *d, unsigned c)
{
    if (c == 0)
        return -1;
    int w = (int)((c - 1) / 64);
    unsigned sh = 63 - (c - 1) % 64;
    uint64_t bits = d->used[w] & (~(uint64_t)0 >> sh);
    while (!bits) {
        if (--w < 0)
            return -1;
        bits = d->used[w];
    }
    return w * 64 + (int)log2_floor(bits);
}

/* Where block b goes in t: its stream's directory, its class and its key
 * size (0 in an address-keyed tree). */
typedef struct {
    sdir *d;
    unsigned c;
    uint64_t z;
} slot;

/* Where a block is in its tree: its directory, class and entry. */
typedef struct tpos {
    sdir *d;
    unsigned c;
    uint32_t p;
} tpos;

/* Block x's place in t: a tree with one directory holds only its
 * stream's blocks (every request makes its stream's directory in both
 * trees of its pool first, open_request), so the stream is read only
 * when there are several. */
static inline slot slot_in(const vp_allocator *a, const tree *t, uint32_t x,
                           bool by_size)
{
    sdir *d = t->solo != NO_SOLO ? t->d : dir_of(t, a->bc[x].stream);
    uint64_t z = a->b[x].size;
    return by_size ? (slot){d, size_class8(z), z} : (slot){d, 0, 0};
}

static inline slot slot_of(const vp_allocator *a, const tree *t, uint32_t x)
{
    return slot_in(a, t, x, t->by_size);
}

static inline void set_used(sdir *d, unsigned c, bool used)
{
    if (used)
        d->used[c / 64] |= (uint64_t)1 << (c % 64);
    else
        d->used[c / 64] &= ~((uint64_t)1 << (c % 64));
}

/* Block x into class sl of tree t, in its place. */
HOT void t_insert_in(vp_allocator *a, uint32_t x, slot sl)
{
    const blk *b = &a->b[x];
    cls *k = &sl.d->c[sl.c];
    if (!c_room(a, sl.d, sl.c))
        return;
    /* the entries below x move up one: the last few one by one (a block
     * freed just above the lowest ones), the rest at once */
    uint32_t p = k->n, moved = 0;
    while (p > 0 && moved < 4 && e_below(&k->v[p - 1], sl.z, b->addr, false)) {
        k->v[p] = k->v[p - 1];
        p--;
        moved++;
    }
    if (moved == 4 && p > 0 && e_below(&k->v[p - 1], sl.z, b->addr, false)) {
        uint32_t q = c_count_above(k, sl.z, b->addr, false);
        memmove(&k->v[q + 1], &k->v[q], (size_t)(p - q) * sizeof *k->v);
        p = q;
    }
    k->v[p] = (ent){sl.z, b->addr, x};
    if (k->n++ == 0)
        set_used(sl.d, sl.c, true);
}

static void t_insert(vp_allocator *a, tree *t, uint32_t x)
{
    t_insert_in(a, x, slot_of(a, t, x));
}

/* t_insert of a block into the free tree t, inline (release and the
 * split's remainder); the block is appended in place when it is the new
 * lowest of its class and the class has room (nearly always: see above),
 * or is the first of an empty class with room (the split's rest that
 * changes class, most often: t_insert_in's steps without its search). */
HOT void t_push_at(vp_allocator *a, uint32_t x, slot sl)
{
    const blk *b = &a->b[x];
    cls *k = &sl.d->c[sl.c];
    if (k->n == 0 && k->cap > 0) { /* an empty class with room */
        k->v[0] = (ent){sl.z, b->addr, x};
        k->n = 1;
        set_used(sl.d, sl.c, true);
        return;
    }
    if (k->n == 0 || k->n == k->cap ||
        e_below(&k->v[k->n - 1], sl.z, b->addr, false)) {
        t_insert_in(a, x, sl);
        return;
    }
    k->v[k->n++] = (ent){sl.z, b->addr, x};
}

HOT void t_push(vp_allocator *a, tree *t, uint32_t x)
{
    t_push_at(a, x, slot_in(a, t, x, true)); /* a free tree: by size */
}

/* Where block x is in tree t (false: not in the index, only once it
 * broke). */
static inline bool t_locate(const vp_allocator *a, const tree *t,
                            uint32_t x, tpos *at)
{
    const blk *b = &a->b[x];
    slot sl = slot_of(a, t, x);
    const cls *k = &sl.d->c[sl.c];
    uint32_t p = k->n;
    if (p > 0 && k->v[p - 1].i == x)
        p--;
    else
        p = c_count_above(k, sl.z, b->addr, true);
    *at = (tpos){sl.d, sl.c, p};
    return p < k->n && k->v[p].i == x;
}

/* Take the entry at `at` out of tree t. */
static inline void t_erase_at(const tpos *at)
{
    cls *k = &at->d->c[at->c];
    if (at->p + 1 < k->n)
        memmove(&k->v[at->p], &k->v[at->p + 1],
                (size_t)(k->n - 1 - at->p) * sizeof *k->v);
    if (--k->n == 0)
        set_used(at->d, at->c, false);
}

static void t_erase(vp_allocator *a, tree *t, uint32_t x)
{
    tpos at;
    if (t_locate(a, t, x, &at))
        t_erase_at(&at);
}

/* Slot n takes over the entry at `at` (the same key). */
static inline void t_rename_at(const tpos *at, uint32_t n)
{
    at->d->c[at->c].v[at->p].i = n;
}

/* Block x, at `at` in the free tree t (keyed by size), loses its first
 * `size` bytes (a split keeps the rest in x). When x is the lowest of its
 * class and the rest is in the same class, the rest is still below every
 * other block of the class (smaller than x was, and x was the lowest): its
 * entry is updated where it is. Otherwise the entry moves to the rest's
 * class, in the same directory: the class is computed once and the
 * directory not looked up again (t_push_at). */
HOT void t_shrink_at(vp_allocator *a, uint32_t x, const tpos *at,
                     uint64_t size)
{
    blk *b = &a->b[x];
    cls *k = &at->d->c[at->c];
    b->addr += size;
    b->size -= size;
    unsigned c = size_class8(b->size);
    if (at->p + 1 == k->n && c == at->c) {
        k->v[at->p].size = b->size;
        k->v[at->p].addr = b->addr;
        return;
    }
    t_erase_at(at);
    t_push_at(a, x, (slot){at->d, c, b->size});
}

/* The first block of directory i or of a later one, NIL if none. */
static uint32_t dirs_first(const tree *t, size_t i)
{
    for (; i < t->n; i++) {
        unsigned c = next_class(&t->d[i], 0);
        if (c < N_CLASSES)
            return c_lowest(&t->d[i].c[c]);
    }
    return NIL;
}

/* First block with key >= k (strict: > k), NIL if none; *at is where it
 * is when it has k's stream (at->d NULL otherwise). by_size is t's key
 * (given where the caller knows it: the compiler then drops the test);
 * request: k's size is a request's, 512 or more. */
HOT uint32_t t_find_in(const tree *t, const bkey *k, bool strict, tpos *at,
                       bool by_size, bool request)
{
    at->d = NULL;
    size_t i = 0; /* the only directory is k's stream's: no search */
    if (t->solo != k->stream) {
        i = dir_at(t, k->stream);
        if (i == t->n || t->d[i].stream != k->stream)
            return dirs_first(t, i);
    }
    sdir *d = &t->d[i];
    uint64_t z = by_size ? k->size : 0;
    /* a request's size is 512 or more; other keys may be 0 */
    unsigned c = request ? size_class8(z) : size_class(z);
    const cls *kc = &d->c[c];
    if (kc->n > 0) {
        const ent *lo = &kc->v[kc->n - 1];
        if (!e_below(lo, z, k->addr, strict)) {
            *at = (tpos){d, c, kc->n - 1};
            return lo->i;
        }
        if (!e_below(&kc->v[0], z, k->addr, strict)) {
            uint32_t q = c_count_above(kc, z, k->addr, strict);
            *at = (tpos){d, c, q - 1}; /* q >= 1: v[0] counts */
            return kc->v[q - 1].i;
        }
    }
    unsigned nc = next_class(d, c + 1);
    if (nc < N_CLASSES) {
        *at = (tpos){d, nc, d->c[nc].n - 1};
        return c_lowest(&d->c[nc]);
    }
    return dirs_first(t, i + 1);
}

static uint32_t t_above(const tree *t, const bkey *k, bool strict)
{
    tpos at;
    return t_find_in(t, k, strict, &at, t->by_size, false);
}

static uint32_t t_lower_bound(const tree *t, const bkey *k)
{
    return t_above(t, k, false);
}

/* Last block with key < k. */
static uint32_t t_pred(const tree *t, const bkey *k)
{
    size_t i = dir_at(t, k->stream);
    if (i < t->n && t->d[i].stream == k->stream) {
        const sdir *d = &t->d[i];
        uint64_t z = t->by_size ? k->size : 0;
        unsigned c = size_class(z);
        const cls *kc = &d->c[c];
        uint32_t q = c_count_above(kc, z, k->addr, false);
        if (q < kc->n)
            return kc->v[q].i;
        int pc = prev_class(d, c);
        if (pc >= 0)
            return c_highest(&d->c[pc]);
    }
    while (i-- > 0) {
        int pc = prev_class(&t->d[i], N_CLASSES);
        if (pc >= 0)
            return c_highest(&t->d[i].c[pc]);
    }
    return NIL;
}

/* The block after x in its tree. */
static uint32_t t_succ_of(const vp_allocator *a, const tree *t, uint32_t x)
{
    bkey k = key_of(a, x);
    return t_above(t, &k, true);
}

/* ---------------------------------------------------------------- stats */

static void add_allocated(vp_allocator *a, uint64_t size, uint64_t requested)
{
    /* cannot overflow: allocated <= reserved, which is checked */
    a->st.allocated += size;
    if (a->st.allocated > a->st.peak_allocated)
        a->st.peak_allocated = a->st.allocated;
    a->st.requested += requested;
    a->st.active_blocks++;
}

static void add_reserved(vp_allocator *a, uint64_t size)
{
    a->st.reserved += size; /* callers checked the sum */
    if (a->st.reserved > a->st.peak_reserved)
        a->st.peak_reserved = a->st.reserved;
}

/* ---------------------------------------------------------------- blocks */

static inline bool is_split(const blk *x)
{
    return x->prev != NIL || x->next != NIL;
}

static inline tree *tree_of(vp_allocator *a, const blk *x)
{
    return x->mapped ? &a->pools[x->pool].free_t
                     : &a->pools[x->pool].unmapped_t;
}

/* t_erase of free block x for the plain fit (no expandable segments:
 * every block is mapped, a free one is in its pool's free tree t, keyed
 * by size; x is in it). */
static inline void erase_plain(vp_allocator *a, tree *t, uint32_t x)
{
    slot sl = slot_in(a, t, x, true);
    const cls *k = &sl.d->c[sl.c];
    uint32_t p = k->n - 1;
    if (k->v[p].i != x)
        p = c_count_above(k, sl.z, a->b[x].addr, true);
    t_erase_at(&(tpos){sl.d, sl.c, p});
}

/* dst (in no tree) absorbs its neighbour src, free and in the same
 * mapping state, the block before it when `before` (merge_before and
 * merge_after: each side its own code). */
HOT void merge(vp_allocator *a, uint32_t dst, uint32_t src, bool before)
{
    blk *s = &a->b[src];
    blk *d = &a->b[dst];
    if (a->plain_fit)
        erase_plain(a, &a->pools[s->pool].free_t, src);
    else
        t_erase(a, tree_of(a, s), src);
    if (before) {
        d->addr = s->addr;
        d->prev = s->prev;
        if (d->prev != NIL)
            a->b[d->prev].next = dst;
        else
            head_moved(a, src, dst);
    } else {
        d->next = s->next;
        if (d->next != NIL)
            a->b[d->next].prev = dst;
    }
    d->size += s->size;
    delete_block(a, src);
}

static __attribute__((noinline)) void merge_before(vp_allocator *a,
                                                   uint32_t dst, uint32_t src)
{
    merge(a, dst, src, true);
}

static __attribute__((noinline)) void merge_after(vp_allocator *a,
                                                  uint32_t dst, uint32_t src)
{
    merge(a, dst, src, false);
}

/* try_merge_blocks: dst (in no tree) absorbs its neighbour src, the one
 * before it when `before`, if src is free and in the same mapping state
 * (most often it is not: the test inline, the merge out of line). */
HOT void try_merge(vp_allocator *a, uint32_t dst, uint32_t src, bool before)
{
    if (src != NIL && !a->b[src].allocated &&
        a->b[src].mapped == a->b[dst].mapped) {
        if (before)
            merge_before(a, dst, src);
        else
            merge_after(a, dst, src);
    }
}

static bool should_split(const vp_allocator *a, const blk *x, uint64_t size)
{
    uint64_t remaining = x->size - size;
    if (x->pool == POOL_SMALL)
        return remaining >= K_MIN_BLOCK;
    /* plain_fit: no expandable segments, and every size (a multiple of
     * 512) is under max_split_size (UINT64_MAX) */
    if (a->plain_fit)
        return remaining > K_SMALL_SIZE;
    if (a->cfg.expandable_segments)
        return remaining >= K_MIN_BLOCK;
    return size < a->cfg.max_split_size && remaining > K_SMALL_SIZE;
}

/* expandable_size: a block followed by unmapped space counts it too. */
static uint64_t expandable_size(const vp_allocator *a, uint32_t i)
{
    const blk *x = &a->b[i];
    uint64_t s = x->size;
    if (x->next != NIL && !a->b[x->next].mapped) {
        uint64_t t;
        s = vp_add_u64(s, a->b[x->next].size, &t) ? t : UINT64_MAX;
    }
    return s;
}

/* get_free_block: best fit in the pool, or NIL, and where it is in the
 * pool's free tree (*at). It stays in the tree (alloc_found_block takes
 * it out). */
HOT uint32_t get_free_block(vp_allocator *a, const req *r, tpos *at)
{
    tree *t = &a->pools[r->pool].free_t;
    bkey k = {r->stream, r->size, 0};
    /* the free tree (keyed by size), a request's rounded size */
    uint32_t it = t_find_in(t, &k, false, at, true, true);
    /* at->d is set exactly when the block is in the stream's own
     * directory: a block of a later stream is no fit (its stream is not
     * read) */
    if (it == NIL || at->d == NULL)
        return NIL;
    /* no expandable segments and max_split_size UINT64_MAX: no size (a
     * multiple of 512) reaches it, the tests below all pass */
    if (a->plain_fit)
        return it;
    if (a->cfg.expandable_segments && a->bc[it].es != NIL) {
        /* prefer a plain block over one that could grow into unmapped
         * space */
        uint32_t nx = t_succ_of(a, t, it);
        while (nx != NIL && a->bc[nx].stream == r->stream &&
               expandable_size(a, nx) < expandable_size(a, it)) {
            it = nx;
            nx = t_succ_of(a, t, it);
        }
        (void)t_locate(a, t, it, at); /* it is in t */
    }
    uint64_t ms = a->cfg.max_split_size;
    const blk *x = &a->b[it];
    /* do not return an oversized block for a small request */
    if (r->size < ms && x->size >= ms)
        return NIL;
    /* oversized blocks may only be rounded up by max_non_split_rounding */
    uint64_t lim;
    if (r->size >= ms &&
        vp_add_u64(r->size, a->cfg.max_non_split_rounding, &lim) &&
        x->size >= lim)
        return NIL;
    return it;
}

/* Next simulated segment address; false if the address space is used up. */
static bool take_address(vp_allocator *a, uint64_t size, uint64_t *base)
{
    uint64_t end, next;
    if (!vp_add_u64(a->next_addr, size, &end) ||
        !vp_round_up_u64(end, K_SEG_ALIGN, &next))
        return false;
    *base = a->next_addr;
    a->next_addr = next;
    return true;
}

/* Would reserving `more` bytes pass the device? (cudaMalloc failure) */
static bool device_refuses(const vp_allocator *a, uint64_t more)
{
    uint64_t sum;
    if (!vp_add_u64(a->st.reserved, more, &sum))
        return true;
    return a->cfg.device_total != 0 && sum > a->cfg.device_total;
}

/* ------------------------------------------------- expandable segments */

static bool reserve_xs(vp_allocator *a)
{
    for (size_t i = 0; i < a->n_xs; i++)
        if (!a->xs[i].live)
            return true;
    if (a->n_xs < a->cap_xs)
        return true;
    size_t cap = a->cap_xs ? a->cap_xs * 2 : 8;
    if (SIZE_MAX / sizeof(xseg) < cap)
        return false;
    xseg *n = realloc(a->xs, cap * sizeof(xseg));
    if (!n)
        return false;
    a->xs = n;
    a->cap_xs = cap;
    return true;
}

/* map_block: back the first `size` bytes of unmapped block i with pages,
 * merge it with free neighbours and put it in the free tree. */
static bool map_block(vp_allocator *a, uint32_t i, uint64_t size)
{
    const xseg *s = &a->xs[a->bc[i].es];
    uint64_t mapped;
    if (!vp_round_up_u64(size, s->page, &mapped))
        return false;
    if (mapped > a->b[i].size) /* unmapped ranges are whole pages */
        mapped = a->b[i].size;
    if (device_refuses(a, mapped))
        return false;
    pool *p = &a->pools[a->b[i].pool];
    uint64_t at = a->b[i].addr;
    t_erase(a, &p->unmapped_t, i);
    a->b[i].mapped = 1;
    if (mapped < a->b[i].size) {
        uint32_t r = new_block(a);
        blk *x = &a->b[i], *rb = &a->b[r];
        rb->addr = x->addr + mapped;
        rb->size = x->size - mapped;
        a->bc[r].stream = a->bc[i].stream;
        rb->pool = x->pool;
        a->bc[r].es = a->bc[i].es;
        rb->mapped = 0;
        rb->prev = i;
        rb->next = x->next;
        if (x->next != NIL)
            a->b[x->next].prev = r;
        x->next = r;
        x->size = mapped;
        t_insert(a, &p->unmapped_t, r);
    }
    try_merge(a, i, a->b[i].prev, true);
    try_merge(a, i, a->b[i].next, false);
    t_insert(a, &p->free_t, i);
    add_reserved(a, mapped);
    if (a->map_fn)
        a->map_fn(false, at, mapped, a->map_ud);
    return true;
}

/* find_expandable_block: lowest-address free/unmapped run of the stream
 * with room for size, else a new segment's single unmapped block. */
static uint32_t find_expandable_block(vp_allocator *a, const req *r)
{
    pool *p = &a->pools[r->pool];
    bkey k = {r->stream, 0, 0};
    for (uint32_t it = t_lower_bound(&p->unmapped_t, &k);
         it != NIL && a->bc[it].stream == r->stream;
         it = t_succ_of(a, &p->unmapped_t, it)) {
        uint32_t c = it;
        uint32_t pv = a->b[c].prev;
        if (pv != NIL && !a->b[pv].allocated)
            c = pv;
        uint64_t bytes = 0;
        for (uint32_t w = c; bytes < r->size && w != NIL && !a->b[w].allocated;
             w = a->b[w].next)
            bytes += a->b[w].size; /* bounded by the segment size */
        if (bytes >= r->size)
            return c;
    }
    /* a new segment: address space for 1.125 x the device */
    uint64_t page = r->pool == POOL_SMALL ? K_SMALL_BUFFER
                                          : a->cfg.large_segment_size;
    uint64_t total = a->cfg.device_total ? a->cfg.device_total
                                         : K_DEFAULT_VA_TOTAL;
    uint64_t va, va_size, base;
    if (!vp_add_u64(total, total / 8, &va) ||
        !vp_round_up_u64(va, page, &va_size) ||
        !take_address(a, va_size, &base))
        return NIL;
    size_t xi = 0;
    while (xi < a->n_xs && a->xs[xi].live)
        xi++;
    if (xi == a->n_xs)
        a->n_xs++; /* reserve_xs made room */
    a->xs[xi].base = base;
    a->xs[xi].size = va_size;
    a->xs[xi].page = page;
    a->xs[xi].live = true;
    a->n_xs_live++;
    uint32_t c = new_block(a);
    blk *x = &a->b[c];
    x->addr = base;
    x->size = va_size;
    a->bc[c].stream = r->stream;
    x->pool = (uint8_t)r->pool;
    a->bc[c].es = (uint32_t)xi;
    x->mapped = 0;
    t_insert(a, &p->unmapped_t, c);
    return c;
}

static uint32_t try_allocate_expandable_block(vp_allocator *a, const req *r)
{
    uint32_t c = find_expandable_block(a, r);
    if (c == NIL)
        return NIL;
    if (!a->b[c].mapped) {
        uint64_t want = a->b[c].size < r->size ? a->b[c].size : r->size;
        if (!map_block(a, c, want))
            return NIL;
    }
    while (a->b[c].size < r->size) {
        /* free -> unmapped -> ...: map the deficit from the next range */
        uint32_t nx = a->b[c].next;
        if (nx == NIL || a->b[nx].allocated || a->b[nx].mapped)
            return NIL; /* request larger than the address space */
        uint64_t rem = r->size - a->b[c].size;
        if (!map_block(a, nx, rem < a->b[nx].size ? rem : a->b[nx].size))
            return NIL;
        c = nx; /* nx absorbed c */
    }
    t_erase(a, &a->pools[r->pool].free_t, c);
    return c;
}

/* unmap_block: return the whole free pages of free block i. */
static void unmap_block(vp_allocator *a, uint32_t i)
{
    const xseg *s = &a->xs[a->bc[i].es];
    uint64_t off = a->b[i].addr - s->base;
    uint64_t end = off + a->b[i].size;
    uint64_t ub = (off + s->page - 1) / s->page * s->page;
    uint64_t ue = end / s->page * s->page;
    if (ub >= ue)
        return;
    pool *p = &a->pools[a->b[i].pool];
    t_erase(a, &p->free_t, i);
    if (ub > off) {
        uint32_t n = new_block(a);
        blk *x = &a->b[i], *nb = &a->b[n];
        nb->addr = x->addr;
        nb->size = ub - off;
        a->bc[n].stream = a->bc[i].stream;
        nb->pool = x->pool;
        a->bc[n].es = a->bc[i].es;
        nb->prev = x->prev;
        nb->next = i;
        if (x->prev != NIL)
            a->b[x->prev].next = n;
        x->prev = n;
        t_insert(a, &p->free_t, n);
    }
    if (end > ue) {
        uint32_t n = new_block(a);
        blk *x = &a->b[i], *nb = &a->b[n];
        nb->addr = s->base + ue;
        nb->size = end - ue;
        a->bc[n].stream = a->bc[i].stream;
        nb->pool = x->pool;
        a->bc[n].es = a->bc[i].es;
        nb->prev = i;
        nb->next = x->next;
        if (x->next != NIL)
            a->b[x->next].prev = n;
        x->next = n;
        t_insert(a, &p->free_t, n);
    }
    blk *x = &a->b[i];
    x->addr = s->base + ub;
    x->size = ue - ub;
    x->mapped = 0;
    a->st.reserved -= ue - ub;
    try_merge(a, i, a->b[i].prev, true);
    try_merge(a, i, a->b[i].next, false);
    t_insert(a, &p->unmapped_t, i);
    if (a->map_fn)
        a->map_fn(true, s->base + ub, ue - ub, a->map_ud);
}

static void release_expandable_segment(vp_allocator *a, uint32_t i)
{
    blk *x = &a->b[i];
    t_erase(a, &a->pools[x->pool].unmapped_t, i);
    a->xs[a->bc[i].es].live = false;
    a->n_xs_live--;
    delete_block(a, i);
}

/* ------------------------------------------------- segments and release */

/* release_block: cudaFree a whole free segment. */
static void release_block(vp_allocator *a, uint32_t i)
{
    uint64_t addr = a->b[i].addr, size = a->b[i].size;

    t_erase(a, &a->pools[a->b[i].pool].free_t, i);
    a->st.reserved -= size;
    a->st.segments--;
    if (a->bc[i].seg != NIL)
        a->seg_head[a->bc[i].seg] = NIL;
    delete_block(a, i);
    if (a->seg_fn)
        a->seg_fn(true, addr, size, a->seg_ud);
}

/* release_blocks for one pool: cudaFree every free block that is a whole
 * segment; unmap the free pages of expandable segments (only if
 * do_unmap, which needs spare block slots). */
static void release_blocks(vp_allocator *a, int pi, bool do_unmap)
{
    tree *t = &a->pools[pi].free_t;
    bkey k = {INT32_MIN, 0, 0};
    uint32_t it = t_lower_bound(t, &k);
    while (it != NIL) {
        uint32_t nx = t_succ_of(a, t, it); /* stays valid: only `it` and
                                              unmapped ranges go away */
        if (a->bc[it].es != NIL) {
            if (do_unmap) {
                unmap_block(a, it);
                if (!a->b[it].mapped && !is_split(&a->b[it]))
                    release_expandable_segment(a, it);
            }
        } else if (!is_split(&a->b[it])) {
            release_block(a, it);
        }
        it = nx;
    }
}

/* The blocks in tree t (counted here: the index keeps no count, which
 * malloc and free would update on every call for empty_cache alone). */
static uint64_t tree_count(const tree *t)
{
    uint64_t n = 0;
    for (size_t i = 0; i < t->n; i++)
        for (unsigned w = 0; w < CLASS_WORDS; w++)
            for (uint64_t bits = t->d[i].used[w]; bits; bits &= bits - 1)
                n += t->d[i].c[w * 64 + ctz64(bits)].n;
    return n;
}

/* release_cached_blocks (empty_cache). Returns false if expandable pages
 * could not be unmapped for want of host memory (the rest is done). */
static bool release_cached_blocks(vp_allocator *a, uint64_t spare)
{
    uint64_t nfree = tree_count(&a->pools[0].free_t) +
                     tree_count(&a->pools[1].free_t);
    bool ok = !a->cfg.expandable_segments ||
              reserve_slots(a, 2 * nfree + spare);
    release_blocks(a, POOL_LARGE, ok);
    release_blocks(a, POOL_SMALL, ok);
    return ok;
}

/* release_available_cached_blocks (only with max_split_size): cudaFree
 * oversize free segments of the stream, one large enough or else the
 * largest ones until enough is freed. Split and expandable blocks are
 * skipped (PyTorch cannot hold a split oversize block with default sizes,
 * and skips expandable ones). */
static bool release_available_cached_blocks(vp_allocator *a, const req *r)
{
    uint64_t ms = a->cfg.max_split_size;
    if (ms == UINT64_MAX)
        return false;
    tree *t = &a->pools[r->pool].free_t;
    bkey k = {r->stream, r->size < ms ? ms : r->size, 0};
    uint32_t it = t_lower_bound(t, &k);
    if (it != NIL && a->bc[it].stream == r->stream && a->bc[it].es == NIL) {
        if (is_split(&a->b[it]))
            return false;
        release_block(a, it);
        return true;
    }
    uint32_t cur = t_pred(t, &k);
    uint64_t released = 0;
    while (released < k.size && cur != NIL && a->b[cur].size >= ms &&
           a->bc[cur].stream == r->stream) {
        bkey ck = key_of(a, cur);
        uint32_t pv = t_pred(t, &ck);
        if (a->bc[cur].es == NIL && !is_split(&a->b[cur])) {
            released += a->b[cur].size; /* <= reserved, no overflow */
            release_block(a, cur);
        }
        cur = pv;
    }
    return released >= k.size;
}

typedef enum { AB_OK, AB_OOM, AB_NOMEM } ab_result;

/* alloc_block: a new segment (or newly mapped pages) for the request. */
static ab_result alloc_block(vp_allocator *a, const req *r, bool is_retry,
                             uint32_t *out)
{
    *out = NIL;
    if (is_retry)
        a->st.num_alloc_retries++;
    /* three blocks at most: a new range, a mapped remainder, the split */
    if (!reserve_slots(a, 4))
        return AB_NOMEM;
    uint64_t sum;
    if (a->cfg.limit != 0 &&
        (!vp_add_u64(a->st.reserved, r->alloc_size, &sum) ||
         sum > a->cfg.limit))
        return AB_OOM;
    if (a->cfg.expandable_segments) {
        if (!reserve_xs(a))
            return AB_NOMEM;
        *out = try_allocate_expandable_block(a, r);
        return *out == NIL ? AB_OOM : AB_OK;
    }
    uint64_t base;
    if (device_refuses(a, r->alloc_size) ||
        !take_address(a, r->alloc_size, &base))
        return AB_OOM;
    uint32_t i = new_block(a);
    blk *x = &a->b[i];
    x->addr = base;
    x->size = r->alloc_size;
    a->bc[i].stream = r->stream;
    x->pool = (uint8_t)r->pool;
    seg_made(a, i);
    add_reserved(a, r->alloc_size);
    a->st.segments++;
    *out = i;
    if (a->seg_fn)
        a->seg_fn(false, base, r->alloc_size, a->seg_ud);
    return AB_OK;
}

/* alloc_found_block: split if asked, mark allocated, count. Block i is in
 * the pool's free tree at *at (get_free_block's), or in no tree when at
 * is NULL; a spare slot has been reserved. A split keeps the rest in i,
 * which stays in the tree where its order allows (t_shrink_at). */
static inline uint32_t alloc_found_block(vp_allocator *a, uint32_t i,
                                  const req *r, uint64_t nbytes,
                                  const tpos *at)
{
    bool in_tree = at != NULL;
    if (should_split(a, &a->b[i], r->size)) {
        uint32_t gen, n = take_slot(a, &gen);
        blk *rem = &a->b[i], *x = &a->b[n];
        /* the front part, allocated, mapped and live, written whole
         * with its requested bytes (new_block's defaults and then these
         * fields, in one go) */
        *x = (blk){.addr = rem->addr, .size = r->size, .prev = rem->prev,
                   .next = i, .gen = gen, .pool = rem->pool, .allocated = 1,
                   .mapped = 1, .live = 1};
        a->bc[n] = (blkc){.requested = nbytes, .es = a->bc[i].es,
                          .stream = a->bc[i].stream, .seg = NIL};
        if (x->prev != NIL)
            a->b[x->prev].next = n;
        else
            head_moved(a, i, n);
        rem->prev = n;
        if (in_tree) {
            t_shrink_at(a, i, at, r->size);
        } else {
            rem->addr += r->size;
            rem->size -= r->size;
            t_push(a, &a->pools[rem->pool].free_t, i);
        }
        add_allocated(a, r->size, nbytes);
        return n;
    }
    if (in_tree)
        t_erase_at(at);
    blk *x = &a->b[i];
    x->allocated = 1;
    a->bc[i].requested = nbytes;
    add_allocated(a, x->size, nbytes);
    return i;
}

/* The request's block from new memory when no free block meets it:
 * alloc_block, after freeing cached blocks if need be (malloc's path
 * past get_free_block). Out of line: the hot path is the free block. */
COLD vp_status new_memory(vp_allocator *a, const req *r, uint32_t *i,
                          vp_error *err)
{
    ab_result res = alloc_block(a, r, false, i);
    if (res == AB_OOM && release_available_cached_blocks(a, r))
        res = alloc_block(a, r, false, i);
    if (res == AB_OOM) {
        if (!release_cached_blocks(a, 4))
            return vp_error_set(err, VP_ENOMEM, "out of host memory");
        res = alloc_block(a, r, true, i);
    }
    if (res == AB_NOMEM)
        return vp_error_set(err, VP_ENOMEM, "out of host memory");
    if (res == AB_OOM) {
        a->st.num_ooms++;
        return vp_error_set(err, VP_EOOM,
                            "out of memory: tried to allocate %" PRIu64
                            " bytes (segment %" PRIu64 ", stream %d); %" PRIu64
                            " allocated, %" PRIu64 " reserved",
                            r->size, r->alloc_size, r->stream,
                            a->st.allocated, a->st.reserved);
    }
    return VP_OK;
}

/* ------------------------------------------------------------- public */

/* Allocators made in this process: one per simulation (progress lines). */
static _Atomic uint64_t created;

uint64_t vp_allocator_created(void)
{
    return atomic_load(&created);
}

vp_allocator *vp_allocator_new(const vp_allocator_config *cfg, vp_error *err)
{
    vp_allocator_config c;
    if (cfg)
        c = *cfg;
    else
        cfg_defaults(&c);
    if (c.max_split_size != UINT64_MAX && c.max_split_size < 20 * VP_MiB) {
        vp_error_set(err, VP_EARG,
                     "max_split_size %" PRIu64 " is under 20 MiB",
                     c.max_split_size);
        return NULL;
    }
    if (c.large_segment_size <= K_SMALL_SIZE ||
        c.large_segment_size % K_MIN_BLOCK != 0) {
        vp_error_set(err, VP_EARG,
                     "large_segment_size %" PRIu64
                     " must be a multiple of 512 above 1 MiB",
                     c.large_segment_size);
        return NULL;
    }
    for (int i = 0; i < 16; i++) {
        uint32_t d = c.roundup_power2_divisions[i];
        if ((d & (d - 1)) != 0) {
            vp_error_set(err, VP_EARG,
                         "roundup_power2_divisions[%d] = %" PRIu32
                         " is not a power of 2",
                         i, d);
            return NULL;
        }
    }
    vp_allocator *a = calloc(1, sizeof *a);
    if (!a) {
        vp_error_set(err, VP_ENOMEM, "out of memory creating the allocator");
        return NULL;
    }
    a->cfg = c;
    a->free_slot = NIL;
    a->plain_round = true;
    for (int i = 0; i < 16; i++)
        a->plain_round &= c.roundup_power2_divisions[i] <= 1;
    a->plain_fit = !c.expandable_segments && c.max_split_size == UINT64_MAX;
    for (int i = 0; i < 2; i++) {
        a->pools[i].free_t.by_size = true;
        a->pools[i].unmapped_t.by_size = false;
        a->pools[i].free_t.solo = a->pools[i].unmapped_t.solo = NO_SOLO;
    }
    a->next_addr = K_SEG_ALIGN;
    if (!reserve_slots(a, 2048)) {
        free(a);
        vp_error_set(err, VP_ENOMEM, "out of memory creating the allocator");
        return NULL;
    }
    atomic_fetch_add(&created, 1);
    return a;
}

void vp_allocator_set_segment_hook(vp_allocator *a,
                                   vp_allocator_segment_fn fn, void *ud)
{
    a->seg_fn = fn;
    a->seg_ud = ud;
}

void vp_allocator_set_map_hook(vp_allocator *a, vp_allocator_segment_fn fn,
                               void *ud)
{
    a->map_fn = fn;
    a->map_ud = ud;
}

void vp_allocator_free(vp_allocator *a)
{
    if (!a)
        return;
    free(a->b);
    free(a->bc);
    free(a->xs);
    free(a->seg_head);
    for (int i = 0; i < 2; i++) {
        free_dirs(&a->pools[i].free_t);
        free_dirs(&a->pools[i].unmapped_t);
    }
    free(a);
}

vp_status vp_allocator_malloc(vp_allocator *a, uint64_t nbytes, int stream,
                              uint64_t *handle, vp_error *err)
{
    if (!a || !handle)
        return vp_error_set(err, VP_EARG, "allocator or handle is NULL");
    *handle = 0;
    uint64_t size;
    return vp__allocator_alloc(a, nbytes, stream, handle, &size, err);
}

/* The request for nbytes (> 0) on `stream`, as AllocParams, with room
 * made for its blocks and its stream's directories before anything
 * changes: VP_OK, or the error. */
HOT vp_status open_request(vp_allocator *a, uint64_t nbytes, int stream,
                              req *r, vp_error *err)
{
    r->stream = stream;
    bool rounded = true; /* round_size without its call, mostly */
    if (a->plain_round && nbytes < UINT64_MAX - K_MIN_BLOCK)
        r->size = nbytes <= K_MIN_BLOCK
                      ? K_MIN_BLOCK
                      : (nbytes + K_MIN_BLOCK - 1) &
                            ~(uint64_t)(K_MIN_BLOCK - 1);
    else
        rounded = round_size(&a->cfg, nbytes, &r->size);
    /* get_allocation_size overflows exactly above 2^64 - 2 MiB (a size
     * rounded up to 2 MiB); below, it is computed when no free block
     * holds the request (vp__allocator_alloc) */
    if (!rounded || r->size > UINT64_MAX - K_ROUND_LARGE + 1)
        return vp_error_set(err, VP_EOVERFLOW,
                            "allocation of %" PRIu64
                            " bytes overflows when rounded",
                            nbytes);
    r->pool = r->size <= K_SMALL_SIZE ? POOL_SMALL : POOL_LARGE;
    pool *pl = &a->pools[r->pool];
    /* the unmapped ranges' directory only with expandable segments (the
     * only ones that have such ranges): each directory is 8 KiB to clear
     * and, at the end, to walk */
    if (!reserve_slots(a, 4) ||
        (pl->free_t.solo != stream &&
         ((a->cfg.expandable_segments &&
           !ensure_dir(&pl->unmapped_t, stream)) ||
          !ensure_dir(&pl->free_t, stream))))
        return vp_error_set(err, VP_ENOMEM, "out of host memory");
    return VP_OK;
}

vp_status vp__allocator_alloc(vp_allocator *a, uint64_t nbytes, int stream,
                              uint64_t *handle, uint64_t *block_size,
                              vp_error *err)
{
    if (a->broken)
        return vp_error_set(err, VP_ENOMEM, "out of host memory");
    if (nbytes == 0) {
        *handle = *block_size = 0;
        return VP_OK;
    }
    req r;
    vp_status st = open_request(a, nbytes, stream, &r, err);
    if (st != VP_OK)
        return st;
    tpos at;
    uint32_t i = get_free_block(a, &r, &at);
    bool in_tree = i != NIL;
    if (i == NIL) {
        (void)allocation_size(&a->cfg, r.size, &r.alloc_size); /* see above */
        if ((st = new_memory(a, &r, &i, err)) != VP_OK)
            return st;
    }
    i = alloc_found_block(a, i, &r, nbytes, in_tree ? &at : NULL);
    if (a->broken)
        return vp_error_set(err, VP_ENOMEM, "out of host memory");
    *handle = ((uint64_t)a->b[i].gen << 32) | ((uint64_t)i + 1);
    *block_size = a->b[i].size;
    return VP_OK;
}

/* The block of a live allocated handle in *i (false when the handle
 * names none); lookup gives it as a slot or NIL. */
static inline bool find_live(const vp_allocator *a, uint64_t handle,
                             uint32_t *i)
{
    /* the slot is the low word less one: 0 wraps above every slot */
    uint64_t k = (handle & 0xffffffffu) - 1;
    if (k >= a->n_slots)
        return false;
    const blk *x = &a->b[k];
    *i = (uint32_t)k;
    return x->live && x->allocated && x->gen == (uint32_t)(handle >> 32);
}

static uint32_t lookup(const vp_allocator *a, uint64_t handle)
{
    uint32_t i;
    return find_live(a, handle, &i) ? i : NIL;
}

/* vp_allocator_release of a non-NULL allocator. Handle 0 (the
 * allocation of 0 bytes) names no live block (its slot, the low word
 * less one, wraps above every slot): tested where find_live fails. */
HOT vp_status release(vp_allocator *a, uint64_t handle, vp_error *err)
{
    if (a->broken)
        return vp_error_set(err, VP_ENOMEM, "out of host memory");
    uint32_t i;
    if (!find_live(a, handle, &i))
        return handle == 0 ? VP_OK
                           : vp_error_set(err, VP_EARG,
                                          "handle %#" PRIx64
                                          " is unknown or already freed",
                                          handle);
    blk *x = &a->b[i];
    a->last_freed = handle;
    a->last_freed_addr = x->addr;
    x->gen++;
    x->allocated = 0;
    a->st.allocated -= x->size;
    a->st.requested -= a->bc[i].requested;
    a->st.active_blocks--; /* requested stays: read of allocated blocks */
    try_merge(a, i, a->b[i].prev, true);
    try_merge(a, i, a->b[i].next, false);
    t_push(a, &a->pools[a->b[i].pool].free_t, i);
    if (a->broken)
        return vp_error_set(err, VP_ENOMEM, "out of host memory");
    return VP_OK;
}

vp_status vp_allocator_release(vp_allocator *a, uint64_t handle,
                               vp_error *err)
{
    if (!a)
        return vp_error_set(err, VP_EARG, "allocator is NULL");
    return release(a, handle, err);
}

vp_status vp__allocator_release(vp_allocator *a, uint64_t handle,
                                vp_error *err)
{
    return release(a, handle, err);
}

/* vp__allocator_transient when the request is met from free block i,
 * without expandable segments: block i's neighbours are allocated (free
 * ones would have been merged with it), so the release merges back only
 * the rest of a split. Unsplit, i is taken and given back where it was.
 * Split, the part taken gets a new slot n, and the release merges the
 * rest (slot i) into it: n ends up holding i's block with i's place in
 * the index, and slot i is dead. Done here without the steps between. */
static void take_and_give_back(vp_allocator *a, uint32_t i,
                               const tpos *where, const req *r,
                               uint64_t *handle, uint64_t *block_size,
                               uint64_t *at)
{
    uint64_t size = a->b[i].size;
    if (should_split(a, &a->b[i], r->size)) {
        size = r->size;
        uint32_t gen, n = take_slot(a, &gen); /* both records copied */
        blk *x = &a->b[i], *y = &a->b[n];
        *y = *x;
        y->gen = gen;
        a->bc[n] = a->bc[i];
        if (x->prev != NIL)
            a->b[x->prev].next = n;
        else if (a->bc[n].seg != NIL)
            a->seg_head[a->bc[n].seg] = n;
        if (x->next != NIL)
            a->b[x->next].prev = n;
        t_rename_at(where, n);
        delete_block(a, i);
        i = n;
    }
    blk *y = &a->b[i];
    *handle = ((uint64_t)y->gen << 32) | ((uint64_t)i + 1);
    *block_size = size;
    y->gen++;
    a->last_freed = *handle;
    a->last_freed_addr = y->addr;
    *at = a->st.allocated + size; /* <= reserved: no overflow */
    if (*at > a->st.peak_allocated)
        a->st.peak_allocated = *at;
}

vp_status vp__allocator_transient(vp_allocator *a, uint64_t nbytes,
                                  int stream, uint64_t *handle,
                                  uint64_t *block_size, uint64_t *at,
                                  vp_error *err)
{
    if (!a || !handle)
        return vp_error_set(err, VP_EARG, "allocator or handle is NULL");
    req r;
    if (!a->broken && nbytes > 0 && !a->cfg.expandable_segments &&
        open_request(a, nbytes, stream, &r, NULL) == VP_OK) {
        tpos where;
        uint32_t i = get_free_block(a, &r, &where);
        if (i != NIL) {
            take_and_give_back(a, i, &where, &r, handle, block_size, at);
            return VP_OK;
        }
    }
    *handle = *block_size = 0;
    vp_status st = vp__allocator_alloc(a, nbytes, stream, handle,
                                       block_size, err);
    if (st != VP_OK)
        return st;
    *at = a->st.allocated;
    return vp__allocator_release(a, *handle, err);
}

void vp_allocator_empty_cache(vp_allocator *a)
{
    if (a && !a->broken)
        (void)release_cached_blocks(a, 0);
}

uint64_t vp_allocator_block_size(const vp_allocator *a, uint64_t handle)
{
    if (!a)
        return 0;
    uint32_t i = lookup(a, handle);
    return i == NIL ? 0 : a->b[i].size;
}

uint64_t vp_allocator_block_addr(const vp_allocator *a, uint64_t handle)
{
    if (!a || handle == 0)
        return 0;
    uint32_t i = lookup(a, handle);
    if (i != NIL)
        return a->b[i].addr;
    return handle == a->last_freed ? a->last_freed_addr : 0;
}

const vp_allocator_stats *vp__allocator_stats(const vp_allocator *a)
{
    return &a->st;
}

void vp_allocator_stats_get(const vp_allocator *a, vp_allocator_stats *out)
{
    if (!out)
        return;
    if (!a) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = a->st;
}

void vp_allocator_reset_peaks(vp_allocator *a)
{
    if (!a)
        return;
    a->st.peak_allocated = a->st.allocated;
    a->st.peak_reserved = a->st.reserved;
}

/* ------------------------------------------------------------- checks */

typedef struct range {
    uint64_t lo, hi;
} range;

static int range_cmp(const void *x, const void *y)
{
    const range *p = x, *q = y;
    return p->lo < q->lo ? -1 : p->lo > q->lo;
}

/* One class in ascending key order: keys strictly increasing from *last,
 * each entry's key its block's, every block live, free, of the tree's
 * kind, stream and class. */
static const char *check_class(const vp_allocator *a, const tree *t,
                               const sdir *d, unsigned c, int pi,
                               bool mapped, uint32_t *last, uint64_t *count)
{
    const cls *k = &d->c[c];
    if (k->n > k->cap)
        return "a size class overflows its array";
    for (uint32_t j = k->n; j-- > 0;) {
        const ent *e = &k->v[j];
        if (e->i >= a->n_slots)
            return "tree holds a block of the wrong kind";
        const blk *x = &a->b[e->i];
        uint64_t z = t->by_size ? x->size : 0;
        if (!x->live || x->allocated || x->pool != pi ||
            (bool)x->mapped != mapped || a->bc[e->i].stream != d->stream ||
            size_class(z) != c)
            return "tree holds a block of the wrong kind";
        if (e->size != z || e->addr != x->addr)
            return "a size class's key is not its block's";
        if (*last != NIL) {
            const blk *y = &a->b[*last];
            if (e_below(e, t->by_size ? y->size : 0, y->addr, true))
                return "tree out of order";
        }
        *last = e->i;
        (*count)++;
    }
    return NULL;
}

static const char *check_tree(const vp_allocator *a, const tree *t, int pi,
                              bool mapped, uint64_t *count)
{
    *count = 0;
    for (size_t i = 0; i < t->n; i++) {
        const sdir *d = &t->d[i];
        if (i > 0 && d->stream <= t->d[i - 1].stream)
            return "tree out of order";
        if ((t->n == 1) != (t->solo == d->stream))
            return "a tree's only stream is wrong";
        uint32_t last = NIL;
        for (unsigned c = 0; c < N_CLASSES; c++) {
            bool used = (d->used[c / 64] >> (c % 64)) & 1;
            if (used != (d->c[c].n != 0))
                return "a size class's bitmap is wrong";
            bool in_slab = d->c[c].v != NULL &&
                           d->c[c].v == d->slab + (size_t)c * FIRST_CAP;
            if (in_slab != (d->c[c].cap == FIRST_CAP))
                return "a size class's first array is not its slab's";
            if (((d->owned[c / 64] >> (c % 64)) & 1) !=
                (d->c[c].v != NULL && !in_slab))
                return "a size class's array is not listed (free_dirs)";
            const char *why = check_class(a, t, d, c, pi, mapped, &last,
                                          count);
            if (why)
                return why;
        }
    }
    return NULL;
}

/* The segments' numbering (seg_head): each live segment's first block
 * carries its number and is its entry, no other block carries one, the
 * entries name live first blocks in the order of their addresses, and
 * with the numbering in use every first block is numbered. NULL, or what
 * is wrong. */
static const char *check_numbering(const vp_allocator *a)
{
    for (uint32_t i = 0; i < a->n_slots; i++) {
        const blk *x = &a->b[i];
        uint32_t s = a->bc[i].seg;
        if (!x->live)
            continue;
        if (x->prev != NIL && s != NIL)
            return "a block inside a segment is numbered";
        if (x->prev == NIL && s == NIL && numbered(a))
            return "a segment is not numbered";
        if (s != NIL && (s >= a->n_seg || a->seg_head[s] != i))
            return "a segment's number does not name it";
    }
    uint64_t last = 0;
    for (uint32_t s = 0; s < a->n_seg; s++) {
        uint32_t h = a->seg_head[s];
        if (h == NIL)
            continue;
        if (h >= a->n_slots || !a->b[h].live || a->b[h].prev != NIL ||
            a->bc[h].seg != s)
            return "a numbered segment's first block is not one";
        if (a->b[h].addr <= last)
            return "numbered segments not in the order of their addresses";
        last = a->b[h].addr;
    }
    return NULL;
}

vp_status vp_allocator_check(const vp_allocator *a, vp_error *err)
{
    if (!a)
        return vp_error_set(err, VP_EARG, "allocator is NULL");
    const char *why = NULL;
    size_t n_ranges = 0;
    uint64_t allocated = 0, active = 0, reserved = 0, segments = 0;
    uint64_t n_blocks = 0, n_free = 0, n_unmapped = 0;
    if (a->broken)
        return vp_error_set(err, VP_ENOMEM,
                            "the allocator ran out of host memory");
    if (a->plain_fit != (!a->cfg.expandable_segments &&
                         a->cfg.max_split_size == UINT64_MAX))
        return vp_error_set(err, VP_ERANGE, "allocator invariant broken: %s",
                            "plain_fit disagrees with the configuration");
    size_t nr_cap = (size_t)a->n_slots + a->n_xs + 1;
    range *ranges = malloc(nr_cap * sizeof *ranges);
    if (!ranges)
        return vp_error_set(err, VP_ENOMEM, "out of host memory");
    for (uint32_t h = 0; h < a->n_slots && !why; h++) {
        const blk *x = &a->b[h];
        if (!x->live || x->prev != NIL)
            continue;
        /* a segment head: walk the segment */
        uint64_t base = x->addr, end = x->addr, bytes = 0;
        const blkc *xc = &a->bc[h];
        const xseg *s = xc->es != NIL ? &a->xs[xc->es] : NULL;
        if (s && (!s->live || s->base != base))
            why = "expandable segment does not start at its base";
        for (uint32_t i = h, pv = NIL; i != NIL && !why; pv = i, i = a->b[i].next) {
            const blk *y = &a->b[i];
            if (!y->live || y->prev != pv)
                why = "broken segment list";
            else if (y->addr != end || y->size == 0)
                why = "blocks of a segment do not tile it";
            else if (y->size % K_MIN_BLOCK != 0)
                why = "block size not a multiple of 512 (the state packs "
                      "its bits there)";
            else if (a->bc[i].stream != xc->stream || y->pool != x->pool ||
                     a->bc[i].es != xc->es)
                why = "blocks of a segment disagree";
            else if (pv != NIL && !y->allocated && !a->b[pv].allocated &&
                     y->mapped == a->b[pv].mapped)
                why = "two free neighbours were not merged";
            else if (!y->mapped && (!s || (y->addr - s->base) % s->page ||
                                    y->size % s->page))
                why = "unmapped range not on page boundaries";
            if (why)
                break;
            n_blocks++;
            end += y->size;
            if (y->mapped)
                bytes += y->size;
            if (y->allocated) {
                allocated += y->size;
                active++;
            } else if (y->mapped) {
                n_free++;
            } else {
                n_unmapped++;
            }
        }
        if (why)
            break;
        if (s && end - base != s->size)
            why = "expandable segment blocks do not cover its range";
        if (!s)
            segments++;
        reserved += bytes;
        ranges[n_ranges].lo = base;
        ranges[n_ranges].hi = end;
        n_ranges++;
    }
    if (!why && n_blocks != (uint64_t)a->n_slots - a->n_dead)
        why = "live blocks outside any segment";
    if (!why && (allocated != a->st.allocated || active != a->st.active_blocks))
        why = "allocated bytes or block count disagree with the blocks";
    if (!why && reserved != a->st.reserved)
        why = "reserved bytes disagree with the segments";
    if (!why && segments != a->st.segments)
        why = "segment count disagrees";
    if (!why && (a->st.peak_allocated < a->st.allocated ||
                 a->st.peak_reserved < a->st.reserved ||
                 a->st.allocated > a->st.reserved))
        why = "peaks or totals inconsistent";
    if (!why) {
        qsort(ranges, n_ranges, sizeof *ranges, range_cmp);
        for (size_t i = 1; i < n_ranges && !why; i++)
            if (ranges[i].lo < ranges[i - 1].hi)
                why = "segments overlap";
    }
    uint64_t tf = 0, tu = 0;
    for (int pi = 0; pi < 2 && !why; pi++) {
        uint64_t c;
        why = check_tree(a, &a->pools[pi].free_t, pi, true, &c);
        tf += c;
        if (!why)
            why = check_tree(a, &a->pools[pi].unmapped_t, pi, false, &c);
        tu += c;
    }
    if (!why && (tf != n_free || tu != n_unmapped))
        why = "a free block is missing from its pool";
    if (!why)
        why = check_numbering(a);
    free(ranges);
    if (why)
        return vp_error_set(err, VP_ERANGE, "allocator invariant broken: %s",
                            why);
    return VP_OK;
}

/* ------------------------------------------------------------ listing */

/* A head: the first block of a cudaMalloc segment, or the first mapped
 * block of a run of mapped blocks of an expandable segment (torch's
 * snapshot reports each such run as one segment). */
static bool is_head(const vp_allocator *a, uint32_t i)
{
    const blk *x = &a->b[i];
    if (!x->live || !x->mapped)
        return false;
    return x->prev == NIL || !a->b[x->prev].mapped;
}

static int head_cmp(const void *x, const void *y)
{
    const uint64_t *p = x, *q = y; /* (addr, index) pairs */
    return p[0] < q[0] ? -1 : p[0] > q[0];
}

/* Fill *seg and blocks[] from head h; blocks has room for every slot. */
static void describe(const vp_allocator *a, uint32_t h,
                     vp_allocator_segment_info *seg,
                     vp_allocator_block_info *blocks)
{
    memset(seg, 0, sizeof *seg);
    seg->addr = a->b[h].addr;
    seg->stream = a->bc[h].stream;
    seg->large = a->b[h].pool == POOL_LARGE;
    seg->expandable = a->bc[h].es != NIL;
    seg->blocks = blocks;
    for (uint32_t i = h; i != NIL && a->b[i].mapped; i = a->b[i].next) {
        const blk *x = &a->b[i];
        vp_allocator_block_info *b = &blocks[seg->n_blocks++];
        b->addr = x->addr;
        b->size = x->size;
        b->allocated = x->allocated != 0;
        b->requested = x->allocated ? a->bc[i].requested : 0;
        b->handle = x->allocated ? ((uint64_t)x->gen << 32) | ((uint64_t)i + 1)
                                 : 0;
        seg->size += x->size; /* the sum of sizes <= reserved: no overflow */
        if (x->allocated) {
            seg->allocated += x->size;
            seg->requested += a->bc[i].requested;
        }
    }
}

vp_status vp_allocator_segments(const vp_allocator *a,
                                vp_allocator_segment_visit fn, void *ud,
                                vp_error *err)
{
    if (!a || !fn)
        return vp_error_set(err, VP_EARG, "allocator or visitor is NULL");
    size_t n = 0;
    for (uint32_t i = 0; i < a->n_slots; i++)
        n += is_head(a, i);
    uint64_t *heads = malloc((n ? n : 1) * 2 * sizeof *heads);
    vp_allocator_block_info *blocks =
        malloc((a->n_slots ? a->n_slots : 1) * sizeof *blocks);
    if (!heads || !blocks) {
        free(heads);
        free(blocks);
        return vp_error_set(err, VP_ENOMEM, "out of memory listing segments");
    }
    size_t k = 0;
    for (uint32_t i = 0; i < a->n_slots; i++)
        if (is_head(a, i)) {
            heads[2 * k] = a->b[i].addr;
            heads[2 * k + 1] = i;
            k++;
        }
    qsort(heads, n, 2 * sizeof *heads, head_cmp);
    vp_status st = VP_OK;
    for (size_t j = 0; j < n && st == VP_OK; j++) {
        vp_allocator_segment_info seg;
        describe(a, (uint32_t)heads[2 * j + 1], &seg, blocks);
        st = fn(&seg, ud);
    }
    free(heads);
    free(blocks);
    return st;
}

/* ---------------------------------------------------------------- state */

#define STATE_WORDS 4       /* per live block                        */
#define STATE_TAIL_WORDS 11 /* state_of's tail: the counters          */

static int state_cmp(const void *x, const void *y)
{
    const uint64_t *a = x, *b = y;
    for (int i = 0; i < STATE_WORDS; i++)
        if (a[i] != b[i])
            return a[i] < b[i] ? -1 : 1;
    return 0;
}

/* A live block's record, four words: its address; its size with the
 * allocated, pool and mapped bits in the low three (every size is a
 * multiple of 512: round_size, allocation_size and the large segment
 * size, which vp_allocator_new refuses otherwise, give multiples of 512,
 * and a split or merge keeps them; vp_allocator_check checks it); its
 * requested bytes (0 when free); its stream and expandable segment. The
 * eight fields as before, one to one. */
HOT void state_rec(const vp_allocator *a, uint32_t i, uint64_t *rec)
{
    const blk *x = &a->b[i];
    const blkc *xc = &a->bc[i];
    rec[0] = x->addr;
    rec[1] = x->size | (uint64_t)x->allocated << 2 |
             (uint64_t)x->pool << 1 | x->mapped;
    rec[2] = x->allocated ? xc->requested : 0;
    rec[3] = (uint64_t)(uint32_t)xc->stream << 32 | xc->es;
}

/* The live blocks' records in the order of state_cmp without sorting
 * them all: the segments (a chain of blocks from one with no previous
 * neighbour, in address order along next) in the order they were made
 * when they are numbered, else sorted by their first block's address
 * (vp__radix_pairs: most blocks are a segment of their own, and qsort of
 * 7,000 segments was a third of an llama-3-70b step), then walked. The records are then in state_cmp's order when
 * the addresses rise strictly from one to the next, which is checked
 * (false, with w as it was, when they do not or host memory ran out:
 * the caller sorts). */
HOT bool state_by_segment(const vp_allocator *a, vp_words *w, size_t *n,
                          uint64_t *hs)
{
    size_t from = w->n, live = a->n_slots - a->n_dead, k = 0;
    uint64_t *heads = malloc((live ? live : 1) * 4 * sizeof *heads);
    if (!heads || live > (SIZE_MAX - from) / STATE_WORDS ||
        !vp__grow((void **)&w->v, &w->cap, from + live * STATE_WORDS,
                  sizeof *w->v)) {
        free(heads);
        return false;
    }
    const uint64_t *sorted = heads;
    if (numbered(a)) { /* the segments in the order they were made */
        for (uint32_t s = 0; s < a->n_seg; s++)
            if (a->seg_head[s] != NIL && k < live) {
                heads[2 * k + 1] = a->seg_head[s];
                k++;
            }
    } else {
        for (uint32_t i = 0; i < a->n_slots; i++)
            if (a->b[i].live && a->b[i].prev == NIL && k < live) {
                heads[2 * k] = a->b[i].addr;
                heads[2 * k + 1] = i;
                k++;
            }
        sorted = vp__radix_pairs(heads, heads + 2 * live, k);
    }
    uint64_t *o = w->v + from;
    size_t m = 0;
    bool ok = sorted != NULL;
    /* one loop over the segments' blocks, from a segment's last block on
     * to the next segment's first; every address is 2 MiB or more
     * (take_address), so the first is above `last` (one at 0 would only
     * send the state to the sort) */
    uint64_t last = 0;
    size_t j = 0;
    uint32_t i = ok && k > 0 ? (uint32_t)sorted[1] : NIL;
    while (i != NIL) {
        const blk *x = &a->b[i];
        if (m == live || x->addr <= last) {
            ok = false;
            break;
        }
        last = x->addr;
        state_rec(a, i, o);
        if (hs) {
            hs[2 * m] = x->allocated ? (uint64_t)x->gen << 32 | (i + 1) : 0;
            hs[2 * m + 1] = x->addr;
        }
        o += STATE_WORDS;
        m++;
        i = x->next;
        if (i == NIL && ++j < k)
            i = (uint32_t)sorted[2 * j + 1];
    }
    free(heads);
    if (!ok || m != live)
        return false;
    w->n = from + live * STATE_WORDS;
    *n = live;
    return true;
}

/* The live blocks' records, then sorted (state_by_segment's fallback). */
static bool state_sorted(const vp_allocator *a, vp_words *w, size_t *n)
{
    size_t from = w->n;
    for (uint32_t i = 0; i < a->n_slots; i++) {
        if (!a->b[i].live)
            continue;
        uint64_t rec[STATE_WORDS];
        state_rec(a, (uint32_t)i, rec);
        if (!vp__words_add(w, rec, STATE_WORDS))
            return false;
        ++*n;
    }
    qsort(w->v + from, *n, STATE_WORDS * sizeof *w->v, state_cmp);
    return true;
}

static bool state_of(const vp_allocator *a, vp_words *w, bool sorted,
                     uint64_t *hs, size_t *n_hs)
{
    size_t n = 0;
    /* inlined twice: without the handles, the loop as it was */
    bool by_segment = !sorted && (hs ? state_by_segment(a, w, &n, hs)
                                     : state_by_segment(a, w, &n, NULL));
    if (n_hs)
        *n_hs = by_segment ? n : 0;
    if (!by_segment && !state_sorted(a, w, &n))
        return false;
    for (size_t i = 0; i < a->n_xs; i++) {
        const xseg *x = &a->xs[i];
        uint64_t rec[4] = {x->base, x->size, x->page, x->live};
        if (!vp__words_add(w, rec, 4))
            return false;
    }
    const vp_allocator_stats *s = &a->st;
    uint64_t tail[] = {n,
                       a->n_xs,
                       a->next_addr,
                       a->n_xs_live,
                       s->allocated,
                       s->peak_allocated,
                       s->reserved,
                       s->peak_reserved,
                       s->requested,
                       s->segments,
                       s->active_blocks};
    _Static_assert(sizeof tail / sizeof tail[0] == STATE_TAIL_WORDS,
                   "vp__allocator_state_words counts the tail");
    return vp__words_add(w, tail, sizeof tail / sizeof tail[0]);
}

size_t vp__allocator_state_words(const vp_allocator *a)
{
    size_t live = a->n_slots - a->n_dead;
    return live * STATE_WORDS + 4 * a->n_xs + STATE_TAIL_WORDS;
}

bool vp__allocator_state(const vp_allocator *a, vp_words *w)
{
    return state_of(a, w, false, NULL, NULL);
}

bool vp__allocator_state_handles(const vp_allocator *a, vp_words *w,
                                 uint64_t *handles, size_t *n)
{
    return state_of(a, w, false, handles, n);
}

size_t vp__allocator_live_blocks(const vp_allocator *a)
{
    return a->n_slots - a->n_dead;
}

size_t vp__allocator_slot_bound(const vp_allocator *a)
{
    return a->n_slots;
}

bool vp__allocator_state_sorted(const vp_allocator *a, vp_words *w)
{
    return state_of(a, w, true, NULL, NULL);
}
