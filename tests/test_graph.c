/* Tests of graph building (vp_graph_build): shape inference, parameters,
 * FLOPs, segments and checkpoint selection.
 *
 * The models are in tests/data/good/; every expected shape and count is
 * derived by hand in the comments. Regression tests name bugs once found
 * in src/. Run from the repository root. */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vramplan/vramplan.h"

#define GOOD_DIR "tests/data/good/"

/* ---- helpers ------------------------------------------------------------ */

static vp_model *load(const char *path)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_model *m = vp_model_load(path, &err);
    cr_assert_not_null(m, "vp_model_load(%s): %s:%u:%u: %s", path, err.path,
                       err.line, err.col, err.msg);
    return m;
}

static vp_model *parse(const char *text)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_model *m = vp_model_parse_buf(text, strlen(text), "inline.yaml", 0,
                                     &err);
    cr_assert_not_null(m, "%s:%u:%u: %s", err.path, err.line, err.col,
                       err.msg);
    return m;
}

static vp_graph *build(const vp_model *m, uint64_t batch, uint64_t seq)
{
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_graph *g = vp_graph_build(m, batch, seq, &err);
    cr_assert_not_null(g, "vp_graph_build: %s:%u:%u: %s", err.path, err.line,
                       err.col, err.msg);
    return g;
}

/* Model and graph of a file, freed by the caller through `done`. */
typedef struct {
    vp_model *m;
    vp_graph *g;
} mg;

static mg open_graph(const char *path, uint64_t batch, uint64_t seq)
{
    mg r;
    r.m = load(path);
    r.g = build(r.m, batch, seq);
    return r;
}

static void done(mg *r)
{
    vp_graph_free(r->g);
    vp_model_free(r->m);
}

static const vp_op *op_named(const vp_graph *g, const char *name)
{
    for (size_t i = 0; i < vp_graph_op_count(g); i++)
        if (!strcmp(vp_graph_op(g, i)->name, name))
            return vp_graph_op(g, i);
    cr_assert_fail("no op named '%s'", name);
    return NULL;
}

static size_t op_index(const vp_graph *g, const char *name)
{
    return (size_t)(op_named(g, name) - vp_graph_op(g, 0));
}

/* Assert the output shape of op `name`. */
static void expect_shape(const vp_graph *g, const char *name, uint32_t ndim,
                         uint64_t d0, uint64_t d1, uint64_t d2, uint64_t d3)
{
    const vp_op *o = op_named(g, name);
    const uint64_t want[4] = {d0, d1, d2, d3};
    cr_expect_eq(o->ndim, ndim, "%s: %u dims, expected %u", name, o->ndim,
                 ndim);
    uint64_t numel = 1;
    for (uint32_t i = 0; i < ndim && i < 4; i++) {
        cr_expect_eq(o->shape[i], want[i], "%s: dim %u is %llu, expected %llu",
                     name, i, (unsigned long long)o->shape[i],
                     (unsigned long long)want[i]);
        numel *= want[i];
    }
    cr_expect_eq(o->numel, numel, "%s: numel %llu, expected %llu", name,
                 (unsigned long long)o->numel, (unsigned long long)numel);
}

static uint64_t num_params(const vp_graph *g)
{
    uint64_t n = 0;
    vp_error err;
    cr_assert_eq(vp_graph_num_params(g, &n, &err), VP_OK, "%s", err.msg);
    return n;
}

/* ---- shape inference: a conv/pool network ------------------------------- */

/* conv-pool at batch 4, image 32. Output side of a conv or pool:
 * (side + 2*padding - kernel) / stride + 1, rounded down.
 *   input                   [4, 3, 32, 32]
 *   conv1 k3 p1 s1          (32 + 2 - 3)/1 + 1 = 32   -> [4, 16, 32, 32]
 *   bn1, relu1 (in place)   same
 *   pool1 max k2 (s = k)    (32 - 2)/2 + 1 = 16       -> [4, 16, 16, 16]
 *   conv2 k5 s2 p2          (16 + 4 - 5)/2 + 1 = 8    -> [4, 32, 8, 8]
 *   pool2 avg k3 s2 p1      (8 + 2 - 3)/2 + 1 = 4     -> [4, 32, 4, 4]
 *   gconv k3 groups 4       (4 - 3)/1 + 1 = 2         -> [4, 64, 2, 2]
 *   gap (adaptive, out 1)                             -> [4, 64, 1, 1]
 *   flat (from dim 1)       64*1*1                    -> [4, 64]
 *   fc                                                -> [4, 10]
 *   loss                    a scalar                  -> 0 dims */
Test(graph_shapes, conv_pool_output_shapes)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 4, 0);
    expect_shape(r.g, "input", 4, 4, 3, 32, 32);
    expect_shape(r.g, "conv1", 4, 4, 16, 32, 32);
    expect_shape(r.g, "bn1", 4, 4, 16, 32, 32);
    expect_shape(r.g, "relu1", 4, 4, 16, 32, 32);
    expect_shape(r.g, "pool1", 4, 4, 16, 16, 16);
    expect_shape(r.g, "conv2", 4, 4, 32, 8, 8);
    expect_shape(r.g, "pool2", 4, 4, 32, 4, 4);
    expect_shape(r.g, "gconv", 4, 4, 64, 2, 2);
    expect_shape(r.g, "gap", 4, 4, 64, 1, 1);
    expect_shape(r.g, "flat", 2, 4, 64, 0, 0);
    expect_shape(r.g, "fc", 2, 4, 10, 0, 0);
    cr_expect_eq(op_named(r.g, "loss")->ndim, 0);
    done(&r);
}

/* The input plus 11 ops. */
Test(graph_shapes, conv_pool_op_count_and_kinds)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 4, 0);
    static const vp_op_kind kinds[] = {
        VP_OP_INPUT,     VP_OP_CONV2D,    VP_OP_BATCHNORM2D,
        VP_OP_RELU,      VP_OP_MAXPOOL2D, VP_OP_CONV2D,
        VP_OP_AVGPOOL2D, VP_OP_CONV2D,    VP_OP_ADAPTIVE_AVGPOOL2D,
        VP_OP_FLATTEN,   VP_OP_LINEAR,    VP_OP_CROSS_ENTROPY};
    cr_assert_eq(vp_graph_op_count(r.g), 12);
    for (size_t i = 0; i < 12; i++)
        cr_expect_eq(vp_graph_op(r.g, i)->kind, kinds[i], "op %zu is %s", i,
                     vp_op_kind_name(vp_graph_op(r.g, i)->kind));
    cr_expect_null(vp_graph_op(r.g, 12));
    done(&r);
}

/* The same network at image 64: conv1 64, pool1 32, conv2 (32+4-5)/2+1 =
 * 16, pool2 (16+2-3)/2+1 = 8, gconv 8-3+1 = 6; the parameters do not
 * change. */
Test(graph_shapes, conv_pool_at_another_image_side)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 1, 64);
    expect_shape(r.g, "conv1", 4, 1, 16, 64, 64);
    expect_shape(r.g, "pool1", 4, 1, 16, 32, 32);
    expect_shape(r.g, "conv2", 4, 1, 32, 16, 16);
    expect_shape(r.g, "pool2", 4, 1, 32, 8, 8);
    expect_shape(r.g, "gconv", 4, 1, 64, 6, 6);
    expect_shape(r.g, "gap", 4, 1, 64, 1, 1);
    cr_expect_eq(num_params(r.g), 18602);
    done(&r);
}

Test(graph_shapes, conv_attributes)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 4, 0);
    const vp_op *c = op_named(r.g, "conv2");
    cr_expect_eq(c->kernel, 5);
    cr_expect_eq(c->stride, 2);
    cr_expect_eq(c->padding, 2);
    cr_expect_eq(c->groups, 1);
    cr_expect_eq(c->in_features, 16);
    cr_expect_eq(c->out_features, 32);
    const vp_op *gc = op_named(r.g, "gconv");
    cr_expect_eq(gc->groups, 4);
    cr_expect_eq(gc->in_features, 32);
    const vp_op *p = op_named(r.g, "pool1");
    cr_expect_eq(p->kernel, 2);
    cr_expect_eq(p->stride, 2, "a pool's stride defaults to its kernel");
    cr_expect(op_named(r.g, "relu1")->inplace);
    done(&r);
}

/* conv1 16*3*3*3 + 16 = 448; bn1 weight, bias 2*16 = 32 (running mean and
 * var, num_batches_tracked are buffers); conv2 32*16*5*5 = 12800 (no bias);
 * gconv 64*(32/4)*3*3 + 64 = 4672; fc 64*10 + 10 = 650.
 * Total 448 + 32 + 12800 + 4672 + 650 = 18602. */
Test(graph_params, conv_pool_trainable_parameters)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 4, 0);
    cr_expect_eq(num_params(r.g), 18602);
    done(&r);
}

/* 12 tensors: conv1 w, b; bn1 w, b, running_mean, running_var,
 * num_batches_tracked; conv2 w; gconv w, b; fc w, b. */
Test(graph_params, conv_pool_parameter_tensors)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 4, 0);
    cr_assert_eq(vp_graph_param_count(r.g), 12);
    static const struct {
        const char *name;
        uint64_t numel;
        bool trainable;
    } want[] = {{"conv1.weight", 432, true},
                {"conv1.bias", 16, true},
                {"bn1.weight", 16, true},
                {"bn1.bias", 16, true},
                {"bn1.running_mean", 16, false},
                {"bn1.running_var", 16, false},
                {"bn1.num_batches_tracked", 1, false},
                {"conv2.weight", 12800, true},
                {"gconv.weight", 4608, true},
                {"gconv.bias", 64, true},
                {"fc.weight", 640, true},
                {"fc.bias", 10, true}};
    for (size_t i = 0; i < 12; i++) {
        const vp_param *p = vp_graph_param(r.g, i);
        cr_expect_str_eq(p->name, want[i].name);
        cr_expect_eq(p->numel, want[i].numel, "%s: %llu", p->name,
                     (unsigned long long)p->numel);
        cr_expect_eq(p->trainable, want[i].trainable, "%s", p->name);
    }
    /* num_batches_tracked is an int64 */
    cr_expect_eq(vp_graph_param(r.g, 6)->elem_bytes_override, 8);
    cr_expect_null(vp_graph_param(r.g, 12));
    done(&r);
}

/* Which ops need a gradient: the input does not; everything after the
 * first op with parameters does. */
Test(graph_params, needs_grad_follows_the_parameters)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 4, 0);
    cr_expect_not(op_named(r.g, "input")->needs_grad);
    cr_expect(op_named(r.g, "conv1")->needs_grad);
    cr_expect(op_named(r.g, "pool1")->needs_grad);
    cr_expect(op_named(r.g, "loss")->needs_grad);
    done(&r);
}

/* ---- FLOPs --------------------------------------------------------------- */

/* A linear: forward 2 * rows * in * out. conv-pool's fc at batch 4: rows 4,
 * in 64, out 10 -> 2*4*64*10 = 5120. Its input needs a gradient, so the
 * backward computes grad_x and grad_W: 2 x 5120 = 10240. */
Test(graph_flops, linear_forward_and_backward)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 4, 0);
    const vp_op *fc = op_named(r.g, "fc");
    cr_expect_eq(fc->flops_fwd, 5120.0, "%g", fc->flops_fwd);
    cr_expect_eq(fc->flops_bwd, 10240.0, "%g", fc->flops_bwd);
    done(&r);
}

/* A linear on the data: the backward only computes grad_W (= forward).
 * mlp-sim's first linear at batch 8: 2 * 8 * 4096 * 4096 = 268435456. */
Test(graph_flops, linear_on_the_input_has_no_input_gradient)
{
    mg r = open_graph(GOOD_DIR "mlp-sim.yaml", 8, 0);
    const vp_op *fc = op_named(r.g, "layers.0.fc");
    cr_expect_eq(fc->flops_fwd, 268435456.0, "%g", fc->flops_fwd);
    cr_expect_eq(fc->flops_bwd, 268435456.0, "%g", fc->flops_bwd);
    /* the second layer's input needs a gradient: twice the forward */
    const vp_op *fc1 = op_named(r.g, "layers.1.fc");
    cr_expect_eq(fc1->flops_bwd, 2 * 268435456.0, "%g", fc1->flops_bwd);
    done(&r);
}

/* In a transformer, rows = batch * seq. tf-small at batch 2, seq 32:
 * q_proj 2 * 64 * 64 * 64 = 524288; lm_head 2 * 64 * 64 * 1000 = 8192000. */
Test(graph_flops, transformer_linears)
{
    mg r = open_graph(GOOD_DIR "tf-small.yaml", 2, 32);
    cr_expect_eq(op_named(r.g, "layers.0.attn.q_proj")->flops_fwd, 524288.0);
    cr_expect_eq(op_named(r.g, "lm_head")->flops_fwd, 8192000.0);
    done(&r);
}

/* A conv: 2 * output elements * in/groups * k * k.
 *   conv1: out 4*16*32*32 = 65536, 2 * 65536 * 3 * 9 = 3538944; its input is
 *          the data, so the backward equals the forward;
 *   gconv: out 4*64*2*2 = 1024, 2 * 1024 * (32/4) * 9 = 147456. */
Test(graph_flops, conv_forward)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 4, 0);
    const vp_op *c1 = op_named(r.g, "conv1");
    cr_expect_eq(c1->flops_fwd, 3538944.0, "%g", c1->flops_fwd);
    cr_expect_eq(c1->flops_bwd, 3538944.0, "%g", c1->flops_bwd);
    cr_expect_eq(op_named(r.g, "gconv")->flops_fwd, 147456.0);
    done(&r);
}

/* Views cost nothing. */
Test(graph_flops, views_are_free)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 4, 0);
    cr_expect_eq(op_named(r.g, "flat")->flops_fwd, 0.0);
    cr_expect_eq(op_named(r.g, "input")->flops_fwd, 0.0);
    done(&r);
}

/* ---- tied embeddings --------------------------------------------------------- */

/* tf-small-tied is tf-small (236288 parameters) with lm_head sharing the
 * token embedding: 236288 - V*H = 236288 - 64000 = 172288. */
Test(graph_tied, tied_embedding_is_counted_once)
{
    mg a = open_graph(GOOD_DIR "tf-small.yaml", 1, 0);
    mg b = open_graph(GOOD_DIR "tf-small-tied.yaml", 1, 0);
    cr_expect_eq(num_params(a.g), 236288);
    cr_expect_eq(num_params(b.g), 172288);
    /* one tensor fewer */
    cr_expect_eq(vp_graph_param_count(a.g), vp_graph_param_count(b.g) + 1);
    done(&a);
    done(&b);
}

Test(graph_tied, lm_head_uses_the_embedding_weight)
{
    mg r = open_graph(GOOD_DIR "tf-small-tied.yaml", 1, 0);
    const vp_op *emb = op_named(r.g, "embed_tokens");
    const vp_op *head = op_named(r.g, "lm_head");
    cr_assert_eq(emb->n_params, 1);
    cr_assert_eq(head->n_params, 1);
    cr_expect_eq(head->params[0], emb->params[0]);
    const vp_param *p = vp_graph_param(r.g, emb->params[0]);
    cr_expect_str_eq(p->name, "embed_tokens.weight");
    cr_expect_eq(p->numel, 64000);
    done(&r);
}

/* An untied head has a weight of its own. */
Test(graph_tied, untied_head_has_its_own_weight)
{
    mg r = open_graph(GOOD_DIR "tf-small.yaml", 1, 0);
    const vp_op *emb = op_named(r.g, "embed_tokens");
    const vp_op *head = op_named(r.g, "lm_head");
    cr_expect_neq(head->params[0], emb->params[0]);
    cr_expect_eq(vp_graph_param(r.g, head->params[0])->numel, 64000);
    done(&r);
}

/* Regression test (once a bug in src/graph_explicit.c, op_keys): docs/MODEL_FORMAT.md documents
 * `tied_to` (name of another embedding or linear) for the embedding op, but
 * the parser does not accept the key ("unknown key 'tied_to' in a
 * embedding op"). With it, the second embedding shares the first one's
 * 100 x 16 table: 1600 parameters, counted once. */
Test(graph_tied, graph_embedding_tied_to)
{
    vp_error err;
    static const char text[] =
        "seq: 8\n"
        "graph:\n"
        "  input: [batch, seq]\n"
        "  input_kind: index\n"
        "  ops:\n"
        "    - {name: emb, op: embedding, vocab: 100, dim: 16}\n"
        "    - {name: emb2, op: embedding, vocab: 100, dim: 16, "
        "tied_to: emb, input: $input}\n"
        "    - {name: sum, op: add, inputs: [emb, emb2]}\n"
        "    - {op: mse_loss}\n";
    vp_model *m = vp_model_parse_buf(text, sizeof text - 1, "tied.yaml", 0,
                                     &err);
    cr_assert_not_null(m, "%s:%u:%u: %s", err.path, err.line, err.col,
                       err.msg);
    vp_graph *g = build(m, 1, 0);
    cr_expect_eq(num_params(g), 1600);
    vp_graph_free(g);
    vp_model_free(m);
}

/* ---- segments ------------------------------------------------------------------ */

/* tf-small: ops 0-3 are input_ids, embed_tokens, embed_positions and their
 * add; each layer has 12 ops (see test_model_parse.c): layers.0 is 4..15,
 * layers.1 16..27; final_norm, lm_head and loss follow. */
Test(graph_segments, transformer_layers)
{
    mg r = open_graph(GOOD_DIR "tf-small.yaml", 1, 0);
    cr_assert_eq(vp_graph_segment_count(r.g), 2);
    const vp_segment *s0 = vp_graph_segment(r.g, 0);
    const vp_segment *s1 = vp_graph_segment(r.g, 1);
    cr_expect_str_eq(s0->name, "layers.0");
    cr_expect_eq(s0->first_op, 4);
    cr_expect_eq(s0->last_op, 15);
    cr_expect_str_eq(s1->name, "layers.1");
    cr_expect_eq(s1->first_op, 16);
    cr_expect_eq(s1->last_op, 27);
    cr_expect_null(vp_graph_segment(r.g, 2));
    cr_expect_str_eq(vp_graph_op(r.g, 4)->name, "layers.0.input_norm");
    cr_expect_str_eq(vp_graph_op(r.g, 27)->name, "layers.1.mlp.residual");
    done(&r);
}

Test(graph_segments, ops_know_their_segment)
{
    mg r = open_graph(GOOD_DIR "tf-small.yaml", 1, 0);
    cr_expect_eq(vp_graph_op(r.g, 3)->segment, -1);
    cr_expect_eq(vp_graph_op(r.g, 4)->segment, 0);
    cr_expect_eq(vp_graph_op(r.g, 15)->segment, 0);
    cr_expect_eq(vp_graph_op(r.g, 16)->segment, 1);
    cr_expect_eq(vp_graph_op(r.g, 28)->segment, -1);
    done(&r);
}

/* Without `checkpoint:`, the units are the instances of top-level blocks
 * invoked with `repeat`: blocks.0 .. blocks.2 (5 ops each, from op 1), not
 * `wide` (invoked once). */
Test(graph_segments, repeated_blocks_by_default)
{
    mg r = open_graph(GOOD_DIR "graph-blocks.yaml", 1, 0);
    cr_assert_eq(vp_graph_segment_count(r.g), 3);
    for (uint32_t i = 0; i < 3; i++) {
        const vp_segment *s = vp_graph_segment(r.g, i);
        char name[16];
        snprintf(name, sizeof name, "blocks.%u", i);
        cr_expect_str_eq(s->name, name);
        cr_expect_eq(s->first_op, 1 + 5 * i);
        cr_expect_eq(s->last_op, 5 + 5 * i);
    }
    cr_expect_eq(op_named(r.g, "wide.up")->segment, -1);
    done(&r);
}

/* graph-ckpt: `checkpoint: ["net.*.fc", head]` makes the three fc ops and
 * the head the units: net.0.fc is op 1, net.1.fc op 3, net.2.fc op 5,
 * head op 7. */
Test(graph_segments, patterns_of_the_checkpoint_key)
{
    mg r = open_graph(GOOD_DIR "graph-ckpt.yaml", 1, 0);
    static const char *const names[] = {"net.0.fc", "net.1.fc", "net.2.fc",
                                        "head"};
    static const uint32_t first[] = {1, 3, 5, 7};
    cr_assert_eq(vp_graph_segment_count(r.g), 4);
    for (size_t i = 0; i < 4; i++) {
        const vp_segment *s = vp_graph_segment(r.g, i);
        cr_expect_str_eq(s->name, names[i]);
        cr_expect_eq(s->first_op, first[i]);
        cr_expect_eq(s->last_op, first[i]);
    }
    done(&r);
}

/* A model with no repeated block and no `checkpoint:` has no units. */
Test(graph_segments, no_units)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 1, 0);
    cr_expect_eq(vp_graph_segment_count(r.g), 0);
    done(&r);
}

/* Units may not overlap: net.0 (the block instance) contains net.0.fc. */
Test(graph_segments, overlapping_units_are_an_error)
{
    static const char text[] = "seq: 8\n"
                               "graph:\n"
                               "  input: [batch, seq]\n"
                               "  blocks: {b: {ops: [{name: fc, op: linear, out: 8}]}}\n"
                               "  ops:\n"
                               "    - {name: net, block: b, repeat: 2}\n"
                               "    - {op: cross_entropy}\n"
                               "  checkpoint: [\"net.*\", \"net.*.fc\"]\n";
    vp_error err;
    vp_model *m = vp_model_parse_buf(text, sizeof text - 1, "o.yaml", 0, &err);
    cr_assert_not_null(m, "%s", err.msg);
    cr_expect_null(vp_graph_build(m, 1, 0, &err));
    vp_model_free(m);
    cr_expect_eq(err.code, VP_ESCHEMA);
    cr_expect_str_eq(err.msg, "checkpoint unit 'net.0' overlaps 'net.0.fc'");
    cr_expect_eq(err.line, 6);
}

/* ---- vp_graph_checkpoint_select --------------------------------------------- */

/* Select with spec on the graph and compare with want (n entries). */
static void expect_select(const vp_graph *g, const char *spec,
                          const bool *want, size_t n)
{
    cr_assert_eq(vp_graph_segment_count(g), n);
    bool out[16];
    memset(out, 0x7f, sizeof out);
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_status st = vp_graph_checkpoint_select(g, spec, out, &err);
    cr_assert_eq(st, VP_OK, "'%s': %s", spec ? spec : "(null)", err.msg);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(out[i], want[i], "'%s': segment %zu is %d",
                     spec ? spec : "(null)", i, out[i]);
}

static vp_error expect_select_fails(const vp_graph *g, const char *spec)
{
    bool out[16];
    vp_error err;
    memset(&err, 0, sizeof err);
    vp_status st = vp_graph_checkpoint_select(g, spec, out, &err);
    cr_expect_eq(st, VP_EARG, "'%s' gives %s", spec, vp_err_name(st));
    cr_expect_eq(err.code, VP_EARG);
    return err;
}

Test(graph_checkpoint, all_selects_the_default_units)
{
    mg r = open_graph(GOOD_DIR "graph-blocks.yaml", 1, 0);
    expect_select(r.g, "all", (const bool[]){true, true, true}, 3);
    bool dflt[3] = {false, false, false};
    vp_graph_default_checkpoint(r.g, dflt);
    cr_expect(dflt[0] && dflt[1] && dflt[2]);
    done(&r);
}

Test(graph_checkpoint, none_empty_and_null_select_nothing)
{
    mg r = open_graph(GOOD_DIR "graph-blocks.yaml", 1, 0);
    const bool no[3] = {false, false, false};
    expect_select(r.g, "none", no, 3);
    expect_select(r.g, "", no, 3);
    expect_select(r.g, NULL, no, 3);
    done(&r);
}

Test(graph_checkpoint, one_name)
{
    mg r = open_graph(GOOD_DIR "graph-blocks.yaml", 1, 0);
    expect_select(r.g, "blocks.1", (const bool[]){false, true, false}, 3);
    done(&r);
}

Test(graph_checkpoint, list_of_names)
{
    mg r = open_graph(GOOD_DIR "tf-small.yaml", 1, 0);
    expect_select(r.g, "layers.0,layers.1", (const bool[]){true, true}, 2);
    expect_select(r.g, "layers.1", (const bool[]){false, true}, 2);
    done(&r);
}

Test(graph_checkpoint, pattern)
{
    mg r = open_graph(GOOD_DIR "graph-blocks.yaml", 1, 0);
    expect_select(r.g, "blocks.*", (const bool[]){true, true, true}, 3);
    expect_select(r.g, "b*.2", (const bool[]){false, false, true}, 3);
    done(&r);
}

Test(graph_checkpoint, pattern_and_name_mixed)
{
    mg r = open_graph(GOOD_DIR "graph-ckpt.yaml", 1, 0);
    expect_select(r.g, "net.*.fc,head",
                  (const bool[]){true, true, true, true}, 4);
    expect_select(r.g, "net.0.*,head",
                  (const bool[]){true, false, false, true}, 4);
    done(&r);
}

/* '*' does not match across a dot: "*" alone is not "blocks.0". */
Test(graph_checkpoint, star_stays_within_one_part)
{
    mg r = open_graph(GOOD_DIR "graph-blocks.yaml", 1, 0);
    vp_error e = expect_select_fails(r.g, "*");
    cr_expect(strstr(e.msg, "'*' matches no checkpoint unit") != NULL, "%s",
              e.msg);
    expect_select(r.g, "*.*", (const bool[]){true, true, true}, 3);
    done(&r);
}

Test(graph_checkpoint, no_match_lists_the_units)
{
    mg r = open_graph(GOOD_DIR "graph-blocks.yaml", 1, 0);
    vp_error e = expect_select_fails(r.g, "nosuch");
    cr_expect_str_eq(e.msg, "'nosuch' matches no checkpoint unit (units are "
                            "blocks.0, blocks.1, blocks.2)");
    done(&r);
}

/* A name without its index matches nothing (no prefix matching). */
Test(graph_checkpoint, prefix_is_not_a_match)
{
    mg r = open_graph(GOOD_DIR "graph-blocks.yaml", 1, 0);
    expect_select_fails(r.g, "blocks");
    done(&r);
}

/* One bad entry fails the whole list. */
Test(graph_checkpoint, one_unknown_name_in_a_list)
{
    mg r = open_graph(GOOD_DIR "tf-small.yaml", 1, 0);
    vp_error e = expect_select_fails(r.g, "layers.0,layers.7");
    cr_expect(strstr(e.msg, "'layers.7' matches no checkpoint unit") != NULL,
              "%s", e.msg);
    done(&r);
}

/* More than four units: the message lists four, then "...". */
Test(graph_checkpoint, no_match_with_many_units)
{
    vp_model *m = parse("seq: 8\n"
                        "transformer: {type: decoder, hidden: 8, layers: 6, "
                        "heads: 2, ffn: 8, vocab: 8, positions: rotary}\n");
    vp_graph *g = build(m, 1, 0);
    vp_error e = expect_select_fails(g, "x");
    cr_expect_str_eq(e.msg, "'x' matches no checkpoint unit (units are "
                            "layers.0, layers.1, layers.2, layers.3, ...)");
    vp_graph_free(g);
    vp_model_free(m);
}

Test(graph_checkpoint, no_match_in_a_model_without_units)
{
    mg r = open_graph(GOOD_DIR "conv-pool.yaml", 1, 0);
    vp_error e = expect_select_fails(r.g, "conv1");
    cr_expect_str_eq(e.msg, "'conv1' matches no checkpoint unit: this model "
                            "has none");
    done(&r);
}

Test(graph_checkpoint, empty_entry_in_a_list)
{
    mg r = open_graph(GOOD_DIR "tf-small.yaml", 1, 0);
    vp_error e = expect_select_fails(r.g, "layers.0,,layers.1");
    cr_expect(strstr(e.msg, "bad checkpoint list") != NULL, "%s", e.msg);
    e = expect_select_fails(r.g, ",layers.0");
    cr_expect(strstr(e.msg, "bad checkpoint list") != NULL, "%s", e.msg);
    done(&r);
}

/* A long name with no dot and a pattern of many stars. */
static const char LONG_NAME_MODEL[] =
    "seq: 4\n"
    "graph:\n"
    "  input: [batch, seq]\n"
    "  blocks: {b: {ops: [{op: relu}]}}\n"
    "  ops:\n"
    "    - {name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa, block: b, "
    "repeat: 1}\n"
    "    - {op: cross_entropy}\n";

/* Regression test (once a bug in src/util.c, vp__glob_match): the matcher backtracks recursively on
 * every '*', so its time is exponential in the number of stars: a pattern
 * of 20 stars and a character that never matches, against a 40-character
 * name, does not finish (8 stars already take seconds). A model file's
 * `checkpoint:` patterns and the --checkpoint option reach it: a denial of
 * service from an untrusted model. Matching '*' greedily with one
 * backtrack point (the classic iterative glob) is linear. */
Test(graph_checkpoint, many_stars_finish_quickly,
     .timeout = 5)
{
    vp_model *m = parse(LONG_NAME_MODEL);
    vp_graph *g = build(m, 1, 0);
    cr_assert_eq(vp_graph_segment_count(g), 1);
    vp_error e = expect_select_fails(g, "********************z.0");
    cr_expect(strstr(e.msg, "matches no checkpoint unit") != NULL);
    vp_graph_free(g);
    vp_model_free(m);
}

/* The same through the model file's `checkpoint:` key (see above). */
Test(graph_checkpoint, many_stars_in_the_model_file,
     .timeout = 5)
{
    char text[1024];
    snprintf(text, sizeof text, "%s  checkpoint: [\"********************z\"]\n",
             LONG_NAME_MODEL);
    vp_model *m = parse(text);
    vp_model_free(m);
}

/* A few stars are fine. */
Test(graph_checkpoint, pattern_with_a_few_stars)
{
    vp_model *m = parse(LONG_NAME_MODEL);
    vp_graph *g = build(m, 1, 0);
    expect_select(g, "a*a*a.*", (const bool[]){true}, 1);
    expect_select_fails(g, "a*b*.0");
    vp_graph_free(g);
    vp_model_free(m);
}

/* ---- names and misc. ------------------------------------------------------------- */

Test(graph_misc, model_name_batch_and_seq)
{
    mg r = open_graph(GOOD_DIR "graph-blocks.yaml", 3, 16);
    cr_expect_str_eq(vp_graph_model_name(r.g), "graph-blocks");
    cr_expect_eq(vp_graph_batch(r.g), 3);
    cr_expect_eq(vp_graph_seq(r.g), 16);
    /* seq 0 means the model's default */
    mg d = open_graph(GOOD_DIR "graph-blocks.yaml", 1, 0);
    cr_expect_eq(vp_graph_seq(d.g), 32);
    done(&r);
    done(&d);
}

/* The input of graph-blocks is [batch, seq, hidden]: batch and seq reach
 * every shape. */
Test(graph_misc, batch_and_seq_reach_the_shapes)
{
    mg r = open_graph(GOOD_DIR "graph-blocks.yaml", 3, 16);
    expect_shape(r.g, "input", 3, 3, 16, 64, 0);
    expect_shape(r.g, "blocks.0.up", 3, 3, 16, 128, 0);
    expect_shape(r.g, "wide.up", 3, 3, 16, 256, 0);
    expect_shape(r.g, "pool", 2, 3, 64, 0, 0);
    expect_shape(r.g, "head", 2, 3, 10, 0, 0);
    done(&r);
}

Test(graph_misc, kind_names)
{
    cr_expect_str_eq(vp_op_kind_name(VP_OP_LINEAR), "linear");
    cr_expect_str_eq(vp_op_kind_name(VP_OP_ADAPTIVE_AVGPOOL2D),
                     "adaptive_avgpool2d");
    cr_expect_str_eq(vp_attn_impl_name(VP_ATTN_FLASH), "flash");
}

/* Transformer attention: shapes and heads. tf-small at batch 2, seq 32:
 * q_proj [2, 32, 64]; the core [2, 32, 4 heads x 16]. */
Test(graph_misc, transformer_attention_core)
{
    mg r = open_graph(GOOD_DIR "tf-small.yaml", 2, 32);
    const vp_op *a = op_named(r.g, "layers.1.attn.core");
    cr_expect_eq(a->kind, VP_OP_ATTENTION);
    cr_expect_eq(a->heads, 4);
    cr_expect_eq(a->kv_heads, 4);
    cr_expect_eq(a->head_dim, 16);
    cr_expect_eq(a->q_len, 32);
    cr_expect(a->causal);
    expect_shape(r.g, "layers.1.attn.core", 3, 2, 32, 64, 0);
    expect_shape(r.g, "lm_head", 3, 2, 32, 1000, 0);
    cr_expect_eq(op_index(r.g, "loss"), 30);
    done(&r);
}
