/* The caching-allocator model's fast paths for the simulator, which
 * makes one call per allocation event. Not installed. */
#ifndef VRAMPLAN_ALLOCATOR_INTERNAL_H
#define VRAMPLAN_ALLOCATOR_INTERNAL_H

#include "vramplan/allocator.h"

/* vp_allocator_malloc, also giving the block's size (rounded, with an
 * unsplit tail): vp_allocator_block_size of the new handle. */
vp_status vp__allocator_alloc(vp_allocator *a, uint64_t nbytes, int stream,
                              uint64_t *handle, uint64_t *block_size,
                              vp_error *err);

/* The statistics as they stand (vp_allocator_stats_get without the
 * copy); valid until the allocator's next call. */
const vp_allocator_stats *vp__allocator_stats(const vp_allocator *a);

#endif
