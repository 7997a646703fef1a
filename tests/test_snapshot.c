/* Tests of the memory snapshot writer (src/snapshot.c, src/pickle.c).
 * The pickle bytes are checked against what Python's pickler writes with
 * protocol 2 for the same values (pickletools.dis); the structure of a
 * whole snapshot is read back by Python in tests/python/test_snapshot.py.
 * Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/pickle.h"
#include "vramplan/vramplan.h"
#include "vramplan/snapshot.h"

/* The bytes a writer produced. */
typedef struct buf {
    char *data;
    size_t len;
    FILE *f;
} buf;

static void open_buf(buf *b)
{
    memset(b, 0, sizeof *b);
    b->f = open_memstream(&b->data, &b->len);
    cr_assert_not_null(b->f);
}

static void close_buf(buf *b)
{
    cr_assert_eq(fclose(b->f), 0);
}

static bool contains(const buf *b, const char *s)
{
    size_t n = strlen(s);
    for (size_t i = 0; i + n <= b->len; i++)
        if (memcmp(b->data + i, s, n) == 0)
            return true;
    return false;
}

static void expect_bytes(const buf *b, const char *want, size_t n)
{
    cr_assert_eq(b->len, n, "length %zu, want %zu", b->len, n);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq((unsigned char)b->data[i], (unsigned char)want[i],
                     "byte %zu: %02x, want %02x", i,
                     (unsigned char)b->data[i], (unsigned char)want[i]);
}

Test(pickle, integers_take_the_shortest_opcode)
{
    buf b;
    vp__pk w;
    open_buf(&b);
    vp__pk_begin(&w, b.f);
    vp__pk_list(&w);
    int64_t v[] = {7, 300, -5, 70000, (int64_t)1 << 40};
    for (int i = 0; i < 5; i++) {
        vp__pk_int(&w, v[i]);
        vp__pk_item(&w);
    }
    vp__pk_close(&w);
    cr_assert(vp__pk_end(&w));
    close_buf(&b);
    /* \x80\x02 ] ( K\x07 M,\x01 J\xfb\xff\xff\xff J\x70\x11\x01\x00
     * \x8a\x08 (2^40 little-endian) e . */
    static const char want[] =
        "\x80\x02]("
        "K\x07"
        "M\x2c\x01"
        "J\xfb\xff\xff\xff"
        "J\x70\x11\x01\x00"
        "\x8a\x08\x00\x00\x00\x00\x00\x01\x00\x00"
        "e.";
    expect_bytes(&b, want, sizeof want - 1);
    free(b.data);
}

Test(pickle, unsigned_above_int64_takes_nine_bytes)
{
    buf b;
    vp__pk w;
    open_buf(&b);
    vp__pk_begin(&w, b.f);
    vp__pk_uint(&w, UINT64_MAX);
    cr_assert(vp__pk_end(&w));
    close_buf(&b);
    /* pickle.dumps(2**64 - 1, 2): LONG1 of 9 bytes, the last one 0 */
    static const char want[] =
        "\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.";
    expect_bytes(&b, want, sizeof want - 1);
    free(b.data);
}

Test(pickle, dict_of_strings_bools_and_tuple)
{
    buf b;
    vp__pk w;
    open_buf(&b);
    vp__pk_begin(&w, b.f);
    vp__pk_dict(&w);
    vp__pk_key(&w, "ok");
    vp__pk_bool(&w, true);
    vp__pk_item(&w);
    vp__pk_key(&w, "id");
    vp__pk_int(&w, 0);
    vp__pk_int(&w, 1);
    vp__pk_tuple2(&w);
    vp__pk_item(&w);
    vp__pk_close(&w);
    cr_assert(vp__pk_end(&w));
    close_buf(&b);
    static const char want[] = "\x80\x02}("
                               "X\x02\x00\x00\x00ok\x88"
                               "X\x02\x00\x00\x00id" "K\x00K\x01\x86"
                               "u.";
    expect_bytes(&b, want, sizeof want - 1);
    free(b.data);
}

Test(pickle, invalid_utf8_becomes_question_marks)
{
    buf b;
    vp__pk w;
    open_buf(&b);
    vp__pk_begin(&w, b.f);
    vp__pk_str(&w, "a\xff\xc3\xa9\xed\xa0\x80z"); /* é kept, surrogate not */
    cr_assert(vp__pk_end(&w));
    close_buf(&b);
    static const char want[] = "\x80\x02X\x08\x00\x00\x00"
                               "a?\xc3\xa9???z.";
    /* one '?' per bad byte: the length written first stays right */
    expect_bytes(&b, want, sizeof want - 1);
    free(b.data);
}

Test(pickle, long_lists_are_appended_in_batches_of_1000)
{
    buf b;
    vp__pk w;
    open_buf(&b);
    vp__pk_begin(&w, b.f);
    vp__pk_list(&w);
    for (int i = 0; i < 2500; i++) {
        vp__pk_none(&w);
        vp__pk_item(&w);
    }
    vp__pk_close(&w);
    cr_assert(vp__pk_end(&w));
    close_buf(&b);
    size_t appends = 0, marks = 0;
    for (size_t i = 0; i < b.len; i++) {
        appends += b.data[i] == 'e';
        marks += b.data[i] == '(';
    }
    cr_assert_eq(appends, 3); /* 1000, 1000, 500 */
    cr_assert_eq(marks, 3);
    free(b.data);
}

Test(pickle, memo_put_and_get)
{
    buf b;
    vp__pk w;
    uint32_t slot = VP_PK_NO_MEMO;
    open_buf(&b);
    vp__pk_begin(&w, b.f);
    vp__pk_list(&w);
    vp__pk_str_memo(&w, "k", &slot);
    vp__pk_item(&w);
    vp__pk_str_memo(&w, "k", &slot);
    vp__pk_item(&w);
    vp__pk_close(&w);
    cr_assert(vp__pk_end(&w));
    close_buf(&b);
    static const char want[] = "\x80\x02]("
                               "X\x01\x00\x00\x00kq\x00"
                               "h\x00"
                               "e.";
    expect_bytes(&b, want, sizeof want - 1);
    free(b.data);
}

Test(pickle, write_error_is_reported)
{
    FILE *f = fopen("/dev/full", "w");
    cr_assert_not_null(f);
    setvbuf(f, NULL, _IONBF, 0);
    vp__pk w;
    vp__pk_begin(&w, f);
    vp__pk_str(&w, "lost");
    cr_assert_not(vp__pk_end(&w));
    fclose(f);
}

/* ---- the snapshot recorder ------------------------------------------- */

typedef struct counts {
    vp_snapshot *s;
    size_t allocs, frees;
} counts;

static void count_and_record(const vp_sim_event *ev, void *ud)
{
    counts *c = ud;
    if (ev->tensor != 0) {
        if (ev->is_free)
            c->frees++;
        else
            c->allocs++;
    }
    vp_snapshot_event(ev, c->s);
}

/* Simulate models/mlp10.yaml with a snapshot recorder. */
static vp_snapshot *record_mlp(vp_setup *s, counts *c)
{
    vp_error err;
    vp_model *m = vp_model_load("models/mlp10.yaml", &err);
    cr_assert_not_null(m, "%s", err.msg);
    vp_graph *g = vp_graph_build(m, s->batch, s->seq, &err);
    cr_assert_not_null(g, "%s", err.msg);
    memset(c, 0, sizeof *c);
    c->s = vp_snapshot_new(&s->alloc, &err);
    cr_assert_not_null(c->s, "%s", err.msg);
    vp_estimate e;
    cr_assert_eq(vp_simulate(g, s, &e, count_and_record, c, &err), VP_OK,
                 "%s", err.msg);
    vp_graph_free(g);
    vp_model_free(m);
    return c->s;
}

Test(snapshot, trace_has_an_entry_per_allocation_and_two_per_free)
{
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 64;
    counts c;
    vp_snapshot *snap = record_mlp(&s, &c);
    size_t n = vp_snapshot_entries(snap);
    /* the rest are segment_alloc entries: at least one, at most one per
     * allocation */
    cr_assert_gt(n, c.allocs + 2 * c.frees);
    cr_assert_leq(n, 2 * c.allocs + 2 * c.frees);
    buf b;
    open_buf(&b);
    vp_error err;
    cr_assert_eq(vp_snapshot_write(snap, b.f, &err), VP_OK, "%s", err.msg);
    close_buf(&b);
    cr_assert_gt(b.len, 100);
    cr_assert_eq((unsigned char)b.data[0], 0x80);
    cr_assert_eq(b.data[b.len - 1], '.');
    free(b.data);
    vp_snapshot_free(snap);
}

Test(snapshot, expandable_segments_record_maps)
{
    vp_setup s;
    vp_setup_init(&s);
    s.batch = 64;
    s.alloc.expandable_segments = true;
    counts c;
    vp_snapshot *snap = record_mlp(&s, &c);
    cr_assert_gt(vp_snapshot_entries(snap), c.allocs + 2 * c.frees);
    buf b;
    open_buf(&b);
    vp_error err;
    cr_assert_eq(vp_snapshot_write(snap, b.f, &err), VP_OK, "%s", err.msg);
    close_buf(&b);
    cr_assert(contains(&b, "segment_map"));
    cr_assert(contains(&b, "expandable_segments:True"));
    free(b.data);
    vp_snapshot_free(snap);
}

static vp_sim_event event(bool is_free, uint64_t bytes, uint64_t handle,
                          uint64_t addr)
{
    vp_sim_event ev;
    memset(&ev, 0, sizeof ev);
    ev.seq = 1;
    ev.is_free = is_free;
    ev.bytes = bytes;
    ev.category = VP_CAT_ACT;
    ev.phase = VP_PHASE_FORWARD;
    ev.step = 1;
    ev.op = "fc";
    ev.tensor = handle;
    ev.addr = addr;
    return ev;
}

static vp_status write_status(vp_snapshot *snap)
{
    buf b;
    vp_error err;
    open_buf(&b);
    vp_status st = vp_snapshot_write(snap, b.f, &err);
    close_buf(&b);
    free(b.data);
    return st;
}

/* An allocation event as the simulator would give it: the handle and
 * address that a reference allocator (the same model) gives. */
static vp_sim_event real_alloc(vp_allocator *ref, uint64_t bytes)
{
    vp_error err;
    uint64_t h;
    cr_assert_eq(vp_allocator_malloc(ref, bytes, 0, &h, &err), VP_OK);
    return event(false, bytes, h, vp_allocator_block_addr(ref, h));
}

Test(snapshot, replay_at_another_address_is_an_error)
{
    vp_error err;
    vp_snapshot *snap = vp_snapshot_new(NULL, &err);
    vp_allocator *ref = vp_allocator_new(NULL, &err);
    cr_assert(snap && ref);
    vp_sim_event ok = real_alloc(ref, 1000);
    vp_snapshot_event(&ok, snap);
    cr_assert_eq(write_status(snap), VP_OK);
    vp_sim_event bad = real_alloc(ref, 1000);
    bad.addr += 512;
    vp_snapshot_event(&bad, snap);
    cr_assert_eq(write_status(snap), VP_ERANGE);
    vp_allocator_free(ref);
    vp_snapshot_free(snap);
}

Test(snapshot, free_of_an_unknown_block_is_an_error)
{
    vp_error err;
    vp_snapshot *snap = vp_snapshot_new(NULL, &err);
    cr_assert_not_null(snap);
    vp_sim_event ev = event(true, 1024, 77, 2 << 20);
    vp_snapshot_event(&ev, snap);
    cr_assert_eq(write_status(snap), VP_ERANGE);
    vp_snapshot_free(snap);
}

Test(snapshot, zero_byte_tensors_leave_no_entry)
{
    vp_error err;
    vp_snapshot *snap = vp_snapshot_new(NULL, &err);
    cr_assert_not_null(snap);
    vp_sim_event ev = event(false, 0, 0, 0);
    vp_snapshot_event(&ev, snap);
    cr_assert_eq(vp_snapshot_entries(snap), 0);
    vp_snapshot_free(snap);
}

Test(snapshot, write_to_a_full_disk_fails)
{
    vp_error err;
    vp_snapshot *snap = vp_snapshot_new(NULL, &err);
    vp_allocator *ref = vp_allocator_new(NULL, &err);
    cr_assert(snap && ref);
    vp_sim_event ok = real_alloc(ref, 1000);
    vp_snapshot_event(&ok, snap);
    FILE *f = fopen("/dev/full", "w");
    cr_assert_not_null(f);
    setvbuf(f, NULL, _IONBF, 0);
    cr_assert_eq(vp_snapshot_write(snap, f, &err), VP_EIO);
    fclose(f);
    vp_allocator_free(ref);
    vp_snapshot_free(snap);
}
