/* The caching-allocator model's private interface for the simulator (not
 * installed). */
#ifndef VRAMPLAN_ALLOCATOR_INTERNAL_H
#define VRAMPLAN_ALLOCATOR_INTERNAL_H

#include "util.h"
#include "vramplan/allocator.h"

/* Append to *w everything about the allocator that decides what it does
 * and reports from now on: every live block (address, size, requested
 * bytes, allocated, pool, stream, mapped, expandable segment) in address
 * order, the expandable segments, the next segment address and the
 * counters other than the retry and OOM counts (which only grow). Not the
 * handles (a new one per allocation) nor the shape of the free-block
 * trees (a best-fit search finds the same block whatever their shape).
 * Two allocators that append the same words answer every later request
 * alike. O(n log n) in the blocks; false when memory runs out. */
bool vp__allocator_state(const vp_allocator *a, vp_words *w);

#endif
