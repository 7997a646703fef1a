/* vramplan: the simulated steps as a PyTorch memory snapshot.
 *
 * torch.cuda.memory._dump_snapshot(FILE) pickles the caching allocator's
 * state: its segments with their blocks, and the trace of what it did
 * (alloc, free_requested, free_completed, segment_alloc, segment_free,
 * segment_map, segment_unmap), per device. vramplan writes the same
 * structure for a simulated run, so PyTorch's own viewer (memory_viz,
 * python -m torch.cuda._memory_viz trace_plot) opens it beside a real
 * snapshot. The schema follows torch/cuda/memory.py (_snapshot) and
 * torch/csrc/cuda/memory_snapshot.cpp (_memory_snapshot_pickled):
 *
 *   {'segments': [{'device', 'address', 'total_size', 'allocated_size',
 *                  'active_size', 'requested_size', 'stream',
 *                  'segment_type', 'segment_pool_id', 'is_expandable',
 *                  'frames', 'blocks': [{'address', 'size',
 *                  'requested_size', 'state', 'frames'}]}],
 *    'device_traces': [[{'action', 'addr', 'size', 'stream', 'time_us',
 *                        'frames', 'category'}]],
 *    'allocator_settings': {...}}
 *
 * What the simulator knows stands where torch has a stack: each entry's
 * frames are [{'filename': CATEGORY, 'line': STEP, 'name': OP},
 * {'filename': 'vramplan', 'line': STEP, 'name': PHASE}], and its
 * 'category' (the key memory_viz colours the timeline by, as in
 * torch.cuda._memory_viz._profile_to_snapshot) is the category's name;
 * segment entries have the category 'unknown'. 'time_us' is the event's
 * number: the simulator has no clock. */
#ifndef VRAMPLAN_SNAPSHOT_H
#define VRAMPLAN_SNAPSHOT_H

#include <stdio.h>

#include "vramplan/allocator.h"
#include "vramplan/error.h"
#include "vramplan/sim.h"

typedef struct vp_snapshot vp_snapshot;

/* A recorder for the events of one vp_simulate run whose allocator is
 * configured by cfg (setup->alloc; NULL: defaults). It replays the events
 * through its own copy of the allocator model, which gives the segment
 * events and the final segments. Returns NULL with *err set (VP_ENOMEM, or
 * VP_EARG for an invalid configuration). Release with vp_snapshot_free. */
vp_snapshot *vp_snapshot_new(const vp_allocator_config *cfg, vp_error *err);

/* NULL is a no-op. */
void vp_snapshot_free(vp_snapshot *s);

/* The vp_sim_event_fn to pass to vp_simulate, with the recorder as ud.
 * Errors (out of memory; a replay that does not give the simulator's
 * addresses) stop the recording and are reported by vp_snapshot_write. */
void vp_snapshot_event(const vp_sim_event *ev, void *ud);

/* Entries recorded in the trace so far. */
size_t vp_snapshot_entries(const vp_snapshot *s);

/* Write the snapshot to f as a pickle (protocol 2), the state being the
 * one after the last event. Returns VP_OK; the recording's error
 * (VP_ENOMEM, VP_ERANGE); VP_EIO when a write fails. */
vp_status vp_snapshot_write(const vp_snapshot *s, FILE *f, vp_error *err);

#endif
