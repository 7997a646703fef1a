/* The simulated steps as a PyTorch memory snapshot (snapshot.h).
 *
 * Trace entries follow c10/cuda/CUDACachingAllocator.cpp (record_trace):
 * an allocation records ALLOC with the requested size after the
 * SEGMENT_ALLOC (or SEGMENT_MAP) that made room for it; a free on the
 * allocating stream records FREE_REQUESTED then FREE_COMPLETED, both with
 * the block's requested size (DeviceCachingAllocator::free, free_block);
 * the segments that the retry before an OOM releases record SEGMENT_FREE
 * (release_block) or SEGMENT_UNMAP (unmap_block). */
#include "vramplan/snapshot.h"

#include <stdlib.h>
#include <string.h>

#include "hashmap.h"
#include "internal.h"
#include "pickle.h"

enum {
    A_ALLOC,
    A_FREE_REQUESTED,
    A_FREE_COMPLETED,
    A_SEGMENT_ALLOC,
    A_SEGMENT_FREE,
    A_SEGMENT_MAP,
    A_SEGMENT_UNMAP,
    A__COUNT
};
static const char *const ACTION_NAMES[A__COUNT] = {
    "alloc",        "free_requested", "free_completed", "segment_alloc",
    "segment_free", "segment_map",    "segment_unmap"};

#define NO_FRAME UINT32_MAX

typedef struct rec {
    uint64_t addr, size;
    uint64_t time;   /* event number */
    uint32_t frame;  /* frames id, NO_FRAME for none */
    uint8_t action;
} rec;

/* What a frame list says: the op, its category, step and phase. */
typedef struct frame {
    uint32_t op;     /* index into ops */
    uint8_t cat, phase;
    uint32_t step;
} frame;

struct vp_snapshot {
    vp_allocator *a;        /* the replay                               */
    vp_allocator_config cfg;
    vp_status st;
    vp_error err;
    rec *r;
    size_t n_r, cap_r;
    frame *fr;
    size_t n_fr, cap_fr;
    vp__map frame_ids;       /* (op, cat, step, phase) -> frame id + 1    */
    char **ops;             /* interned op names                         */
    size_t n_ops, cap_ops;
    uint32_t *op_slot;      /* op name table: op id + 1, 0 empty       */
    size_t cap_slot;
    vp__map live;            /* handle -> requested bytes                 */
    vp__map live_frame;      /* handle -> frame id + 1                    */
    vp__map seg_frame;       /* segment address -> frame id + 1           */
    uint64_t now;           /* number of the event being replayed        */
    uint32_t cur_frame;     /* frames of the event being replayed        */
};

/* ---- recording --------------------------------------------------------- */

static void fail(vp_snapshot *s, vp_status st, const char *msg)
{
    if (s->st == VP_OK)
        s->st = vp_error_set(&s->err, st, "%s", msg);
}

static void add_rec(vp_snapshot *s, int action, uint64_t addr, uint64_t size,
                    uint32_t frame_id)
{
    if (s->st != VP_OK)
        return;
    if (!vp__grow((void **)&s->r, &s->cap_r, s->n_r + 1, sizeof *s->r)) {
        fail(s, VP_ENOMEM, "out of memory recording the snapshot");
        return;
    }
    s->r[s->n_r++] = (rec){addr, size, s->now, frame_id, (uint8_t)action};
}

static void on_segment(bool is_free, uint64_t addr, uint64_t size, void *ud)
{
    vp_snapshot *s = ud;
    add_rec(s, is_free ? A_SEGMENT_FREE : A_SEGMENT_ALLOC, addr, size,
            s->cur_frame);
    if (is_free)
        vp__map_del(&s->seg_frame, addr + 1);
    else if (!vp__map_put(&s->seg_frame, addr + 1, (uint64_t)s->cur_frame + 1))
        fail(s, VP_ENOMEM, "out of memory recording the snapshot");
}

static void on_map(bool is_unmap, uint64_t addr, uint64_t size, void *ud)
{
    vp_snapshot *s = ud;
    add_rec(s, is_unmap ? A_SEGMENT_UNMAP : A_SEGMENT_MAP, addr, size,
            s->cur_frame);
}

static uint64_t str_hash(const char *p)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 1099511628211ull;
    return h;
}

static bool ops_grow(vp_snapshot *s)
{
    size_t cap = s->cap_slot ? s->cap_slot * 2 : 256;
    uint32_t *slot = calloc(cap, sizeof *slot);
    if (!slot)
        return false;
    for (size_t i = 0; i < s->n_ops; i++) {
        size_t j = str_hash(s->ops[i]) & (cap - 1);
        while (slot[j])
            j = (j + 1) & (cap - 1);
        slot[j] = (uint32_t)i + 1;
    }
    free(s->op_slot);
    s->op_slot = slot;
    s->cap_slot = cap;
    return true;
}

/* The id of an op name, interned (an open-addressing table of ids + 1).
 * UINT32_MAX when out of memory. */
static uint32_t op_id(vp_snapshot *s, const char *name)
{
    if ((s->n_ops + 1) * 2 > s->cap_slot && !ops_grow(s))
        return UINT32_MAX;
    size_t j = str_hash(name) & (s->cap_slot - 1);
    for (; s->op_slot[j]; j = (j + 1) & (s->cap_slot - 1))
        if (strcmp(s->ops[s->op_slot[j] - 1], name) == 0)
            return s->op_slot[j] - 1;
    char *copy = malloc(strlen(name) + 1);
    if (!copy || s->n_ops >= UINT32_MAX - 1 ||
        !vp__grow((void **)&s->ops, &s->cap_ops, s->n_ops + 1,
                  sizeof *s->ops)) {
        free(copy);
        return UINT32_MAX;
    }
    strcpy(copy, name);
    s->ops[s->n_ops] = copy;
    s->op_slot[j] = (uint32_t)s->n_ops + 1;
    return (uint32_t)s->n_ops++;
}

/* The frames id of an event. */
static uint32_t frame_of(vp_snapshot *s, const vp_sim_event *ev)
{
    uint32_t op = op_id(s, ev->op ? ev->op : "");
    if (op == UINT32_MAX)
        return NO_FRAME;
    /* op < UINT32_MAX, so the key + 1 is never 0 */
    uint64_t key = (((uint64_t)op << 32) | ((uint64_t)ev->category << 24) |
                    ((uint64_t)(ev->step & 0xffff) << 8) |
                    (uint64_t)ev->phase) + 1;
    uint64_t v = vp__map_get(&s->frame_ids, key);
    if (v)
        return (uint32_t)(v - 1);
    if (!vp__grow((void **)&s->fr, &s->cap_fr, s->n_fr + 1, sizeof *s->fr) ||
        !vp__map_put(&s->frame_ids, key, s->n_fr + 1))
        return NO_FRAME;
    s->fr[s->n_fr] = (frame){op, (uint8_t)ev->category, (uint8_t)ev->phase,
                             ev->step};
    return (uint32_t)s->n_fr++;
}

static void replay_alloc(vp_snapshot *s, const vp_sim_event *ev,
                         uint32_t fid)
{
    uint64_t h = 0;
    vp_error e;
    s->cur_frame = fid;
    if (vp_allocator_malloc(s->a, ev->bytes, 0, &h, &e) != VP_OK) {
        fail(s, VP_ERANGE, "the allocator replay refused an allocation "
                           "the simulator made");
        return;
    }
    if (h != ev->tensor || vp_allocator_block_addr(s->a, h) != ev->addr) {
        fail(s, VP_ERANGE, "the allocator replay placed a block elsewhere "
                           "than the simulator");
        return;
    }
    add_rec(s, A_ALLOC, ev->addr, ev->bytes, fid);
    if (!vp__map_put(&s->live, h, ev->bytes + 1) ||
        !vp__map_put(&s->live_frame, h, (uint64_t)fid + 1))
        fail(s, VP_ENOMEM, "out of memory recording the snapshot");
}

static void replay_free(vp_snapshot *s, const vp_sim_event *ev)
{
    uint64_t req = vp__map_get(&s->live, ev->tensor);
    uint64_t fid = vp__map_get(&s->live_frame, ev->tensor);
    vp_error e;
    if (!req || vp_allocator_release(s->a, ev->tensor, &e) != VP_OK) {
        fail(s, VP_ERANGE, "the allocator replay was asked to free a block "
                           "it does not hold");
        return;
    }
    uint32_t f = fid ? (uint32_t)(fid - 1) : NO_FRAME;
    add_rec(s, A_FREE_REQUESTED, ev->addr, req - 1, f);
    add_rec(s, A_FREE_COMPLETED, ev->addr, req - 1, f);
    vp__map_del(&s->live, ev->tensor);
    vp__map_del(&s->live_frame, ev->tensor);
}

void vp_snapshot_event(const vp_sim_event *ev, void *ud)
{
    vp_snapshot *s = ud;
    if (!s || !ev || s->st != VP_OK || ev->tensor == 0)
        return; /* a zero-byte tensor takes no block (and no trace) */
    s->now = ev->seq;
    if (ev->is_free) {
        replay_free(s, ev);
        return;
    }
    uint32_t fid = frame_of(s, ev);
    if (fid == NO_FRAME) {
        fail(s, VP_ENOMEM, "out of memory recording the snapshot");
        return;
    }
    replay_alloc(s, ev, fid);
}

vp_snapshot *vp_snapshot_new(const vp_allocator_config *cfg, vp_error *err)
{
    vp_snapshot *s = calloc(1, sizeof *s);
    if (!s) {
        vp_error_set(err, VP_ENOMEM, "out of memory");
        return NULL;
    }
    if (cfg)
        s->cfg = *cfg;
    else
        vp_allocator_config_init(&s->cfg);
    s->a = vp_allocator_new(&s->cfg, err);
    if (!s->a) {
        free(s);
        return NULL;
    }
    vp_allocator_set_segment_hook(s->a, on_segment, s);
    vp_allocator_set_map_hook(s->a, on_map, s);
    s->cur_frame = NO_FRAME;
    return s;
}

void vp_snapshot_free(vp_snapshot *s)
{
    if (!s)
        return;
    vp_allocator_free(s->a);
    for (size_t i = 0; i < s->n_ops; i++)
        free(s->ops[i]);
    free(s->ops);
    free(s->r);
    free(s->fr);
    vp__map_free(&s->frame_ids);
    free(s->op_slot);
    vp__map_free(&s->live);
    vp__map_free(&s->live_frame);
    vp__map_free(&s->seg_frame);
    free(s);
}

size_t vp_snapshot_entries(const vp_snapshot *s)
{
    return s ? s->n_r : 0;
}

/* ---- writing ----------------------------------------------------------- */

/* Memo slots of the strings and frame lists written more than once. */
enum {
    K_ACTION, K_ADDR, K_SIZE, K_STREAM, K_TIME, K_FRAMES, K_CATEGORY,
    K_FILENAME, K_LINE, K_NAME, K_ADDRESS, K_REQUESTED, K_STATE,
    K_ACTIVE, K_INACTIVE, K_UNKNOWN, K_VRAMPLAN, K__COUNT
};
static const char *const KEYS[K__COUNT] = {
    "action",   "addr",     "size",    "stream",  "time_us",  "frames",
    "category", "filename", "line",    "name",    "address",  "requested_size",
    "state",    "active_allocated",    "inactive", "unknown", "vramplan"};

typedef struct writer {
    vp__pk w;
    const vp_snapshot *s;
    uint32_t key[K__COUNT];
    uint32_t *frames;             /* memo slot per frame id            */
    uint32_t cat[VP_CAT__COUNT];  /* memo slot per category name       */
    uint32_t phase[VP_PHASE__COUNT];
    uint32_t action[A__COUNT];
    uint32_t empty;               /* the empty frame list              */
} writer;

static void key(writer *x, int k)
{
    vp__pk_str_memo(&x->w, KEYS[k], &x->key[k]);
}

static void kv_u64(writer *x, int k, uint64_t v)
{
    key(x, k);
    vp__pk_uint(&x->w, v);
    vp__pk_item(&x->w);
}

static void one_frame(writer *x, const char *file, uint32_t *file_slot,
                      uint32_t line, const char *name, uint32_t *name_slot)
{
    vp__pk_dict(&x->w);
    key(x, K_FILENAME);
    vp__pk_str_memo(&x->w, file, file_slot);
    vp__pk_item(&x->w);
    key(x, K_LINE);
    vp__pk_uint(&x->w, line);
    vp__pk_item(&x->w);
    key(x, K_NAME);
    if (name_slot)
        vp__pk_str_memo(&x->w, name, name_slot);
    else
        vp__pk_str(&x->w, name);
    vp__pk_item(&x->w);
    vp__pk_close(&x->w);
    vp__pk_item(&x->w);
}

/* The frame list of frame id f (memoized after its first use). */
static void frames(writer *x, uint32_t f)
{
    if (f == NO_FRAME) {
        if (x->empty != VP_PK_NO_MEMO) {
            vp__pk_memo_get(&x->w, x->empty);
            return;
        }
        vp__pk_list(&x->w);
        vp__pk_close(&x->w);
        x->empty = vp__pk_memo_put(&x->w);
        return;
    }
    if (x->frames[f] != VP_PK_NO_MEMO) {
        vp__pk_memo_get(&x->w, x->frames[f]);
        return;
    }
    const frame *fr = &x->s->fr[f];
    const char *op = x->s->ops[fr->op];
    vp__pk_list(&x->w);
    one_frame(x, vp_category_name((vp_category)fr->cat), &x->cat[fr->cat],
              fr->step, *op ? op : "(model)", NULL);
    one_frame(x, "vramplan", &x->key[K_VRAMPLAN], fr->step,
              vp_phase_name((vp_phase)fr->phase), &x->phase[fr->phase]);
    vp__pk_close(&x->w);
    x->frames[f] = vp__pk_memo_put(&x->w);
}

static void category(writer *x, uint32_t f)
{
    key(x, K_CATEGORY);
    if (f == NO_FRAME)
        key(x, K_UNKNOWN);
    else
        vp__pk_str_memo(&x->w,
                        vp_category_name((vp_category)x->s->fr[f].cat),
                        &x->cat[x->s->fr[f].cat]);
    vp__pk_item(&x->w);
}

static void trace_entry(writer *x, const rec *r)
{
    vp__pk_dict(&x->w);
    key(x, K_ACTION);
    vp__pk_str_memo(&x->w, ACTION_NAMES[r->action], &x->action[r->action]);
    vp__pk_item(&x->w);
    kv_u64(x, K_ADDR, r->addr);
    kv_u64(x, K_SIZE, r->size);
    kv_u64(x, K_STREAM, 0);
    kv_u64(x, K_TIME, r->time);
    key(x, K_FRAMES);
    frames(x, r->frame);
    vp__pk_item(&x->w);
    /* segments hold blocks of every category: 'unknown', which
     * memory_viz also needs among the categories when any is given */
    bool seg = r->action >= A_SEGMENT_ALLOC;
    category(x, seg ? NO_FRAME : r->frame);
    vp__pk_close(&x->w);
    vp__pk_item(&x->w);
}

static vp_status segment_entry(const vp_allocator_segment_info *g, void *ud)
{
    writer *x = ud;
    vp__pk *w = &x->w;
    uint64_t sf = vp__map_get(&x->s->seg_frame, g->addr + 1);
    vp__pk_dict(w);
    vp__pk_key(w, "device");
    vp__pk_int(w, 0);
    vp__pk_item(w);
    kv_u64(x, K_ADDRESS, g->addr);
    vp__pk_key(w, "total_size");
    vp__pk_uint(w, g->size);
    vp__pk_item(w);
    vp__pk_key(w, "allocated_size");
    vp__pk_uint(w, g->allocated);
    vp__pk_item(w);
    vp__pk_key(w, "active_size");
    vp__pk_uint(w, g->allocated);
    vp__pk_item(w);
    kv_u64(x, K_REQUESTED, g->requested);
    kv_u64(x, K_STREAM, (uint64_t)g->stream);
    vp__pk_key(w, "segment_type");
    vp__pk_str(w, g->large ? "large" : "small");
    vp__pk_item(w);
    vp__pk_key(w, "segment_pool_id");
    vp__pk_int(w, 0);
    vp__pk_int(w, 0);
    vp__pk_tuple2(w);
    vp__pk_item(w);
    vp__pk_key(w, "is_expandable");
    vp__pk_bool(w, g->expandable);
    vp__pk_item(w);
    key(x, K_FRAMES);
    frames(x, sf ? (uint32_t)(sf - 1) : NO_FRAME);
    vp__pk_item(w);
    vp__pk_key(w, "blocks");
    vp__pk_list(w);
    for (size_t i = 0; i < g->n_blocks; i++) {
        const vp_allocator_block_info *b = &g->blocks[i];
        uint64_t bf = b->allocated ? vp__map_get(&x->s->live_frame, b->handle)
                                   : 0;
        vp__pk_dict(w);
        kv_u64(x, K_ADDRESS, b->addr);
        kv_u64(x, K_SIZE, b->size);
        kv_u64(x, K_REQUESTED, b->requested);
        key(x, K_STATE);
        key(x, b->allocated ? K_ACTIVE : K_INACTIVE);
        vp__pk_item(w);
        key(x, K_FRAMES);
        frames(x, bf ? (uint32_t)(bf - 1) : NO_FRAME);
        vp__pk_item(w);
        vp__pk_close(w);
        vp__pk_item(w);
    }
    vp__pk_close(w);
    vp__pk_item(w);
    vp__pk_close(w);
    vp__pk_item(w);
    return VP_OK;
}

/* allocator_settings as torch 2.11 reports them (memory_snapshot.cpp). */
static void settings(writer *x)
{
    vp__pk *w = &x->w;
    const vp_allocator_config *c = &x->s->cfg;
    vp__pk_key(w, "allocator_settings");
    vp__pk_dict(w);
    vp__pk_key(w, "PYTORCH_CUDA_ALLOC_CONF");
    vp__pk_str(w, c->expandable_segments ? "expandable_segments:True" : "");
    vp__pk_item(w);
    vp__pk_key(w, "max_split_size");
    /* SIZE_MAX (unset) reads as -1 once cast to int64 */
    vp__pk_int(w, c->max_split_size == UINT64_MAX ? -1
                  : c->max_split_size > INT64_MAX ? INT64_MAX
                                                  : (int64_t)c->max_split_size);
    vp__pk_item(w);
    vp__pk_key(w, "garbage_collection_threshold");
    vp__pk_float(w, 0.0);
    vp__pk_item(w);
    vp__pk_key(w, "expandable_segments");
    vp__pk_bool(w, c->expandable_segments);
    vp__pk_item(w);
    vp__pk_key(w, "pinned_num_register_threads");
    vp__pk_int(w, 1);
    vp__pk_item(w);
    vp__pk_key(w, "release_lock_on_cudamalloc");
    vp__pk_bool(w, false);
    vp__pk_item(w);
    vp__pk_key(w, "pinned_use_cuda_host_register");
    vp__pk_bool(w, false);
    vp__pk_item(w);
    vp__pk_key(w, "roundup_power2_divisions");
    vp__pk_dict(w);
    for (int i = 0; i < 16; i++) {
        char k[16];
        snprintf(k, sizeof k, "%lu", 1ul << i);
        vp__pk_key(w, k);
        vp__pk_int(w, c->roundup_power2_divisions[i]);
        vp__pk_item(w);
    }
    vp__pk_close(w);
    vp__pk_item(w);
    vp__pk_close(w);
    vp__pk_item(w);
}

vp_status vp_snapshot_write(const vp_snapshot *s, FILE *f, vp_error *err)
{
    if (!s || !f)
        return vp_error_set(err, VP_EARG, "no snapshot or file");
    if (s->st != VP_OK) {
        if (err)
            *err = s->err;
        return s->st;
    }
    writer *x = calloc(1, sizeof *x);
    uint32_t *slots = malloc((s->n_fr ? s->n_fr : 1) * sizeof *slots);
    if (!x || !slots) {
        free(x);
        free(slots);
        return vp_error_set(err, VP_ENOMEM, "out of memory");
    }
    x->s = s;
    x->frames = slots;
    memset(slots, 0xff, (s->n_fr ? s->n_fr : 1) * sizeof *slots);
    memset(x->key, 0xff, sizeof x->key);
    memset(x->cat, 0xff, sizeof x->cat);
    memset(x->phase, 0xff, sizeof x->phase);
    memset(x->action, 0xff, sizeof x->action);
    x->empty = VP_PK_NO_MEMO;

    vp__pk_begin(&x->w, f);
    vp__pk_dict(&x->w);
    vp__pk_key(&x->w, "segments");
    vp__pk_list(&x->w);
    vp_status st = vp_allocator_segments(s->a, segment_entry, x, err);
    vp__pk_close(&x->w);
    vp__pk_item(&x->w);
    vp__pk_key(&x->w, "device_traces");
    vp__pk_list(&x->w);
    vp__pk_list(&x->w);
    for (size_t i = 0; i < s->n_r && st == VP_OK; i++)
        trace_entry(x, &s->r[i]);
    vp__pk_close(&x->w);
    vp__pk_item(&x->w);
    vp__pk_close(&x->w);
    vp__pk_item(&x->w);
    settings(x);
    vp__pk_close(&x->w);
    bool ok = vp__pk_end(&x->w);
    free(slots);
    free(x);
    if (st != VP_OK)
        return st;
    if (!ok)
        return vp_error_set(err, VP_EIO, "cannot write the snapshot");
    return VP_OK;
}
