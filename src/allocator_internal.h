/* The caching-allocator model's private interface for the simulator, which
 * makes one call per allocation event and compares states for the
 * closed-form accumulation. Not installed. */
#ifndef VRAMPLAN_ALLOCATOR_INTERNAL_H
#define VRAMPLAN_ALLOCATOR_INTERNAL_H

#include "util.h"
#include "vramplan/allocator.h"

/* vp_allocator_malloc, also giving the block's size (rounded, with an
 * unsplit tail): vp_allocator_block_size of the new handle. a, handle and
 * block_size are not NULL (the callers' to check: this is the
 * simulator's call per allocation); on an error *handle and *block_size
 * are left as they were. */
vp_status vp__allocator_alloc(vp_allocator *a, uint64_t nbytes, int stream,
                              uint64_t *handle, uint64_t *block_size,
                              vp_error *err);

/* vp_allocator_release, a not NULL (the simulator's call per free). */
vp_status vp__allocator_release(vp_allocator *a, uint64_t handle,
                                vp_error *err);

/* vp__allocator_alloc of nbytes and at once vp_allocator_release of the
 * new handle (a tensor freed as soon as it is made): afterwards the same
 * blocks, slots, handle generations, dead-slot list, index and counters
 * as the two calls leave, with the handle and block size the allocation
 * gave and in *at the allocated bytes right after it. When a free block
 * meets the request (and segments are not expandable) nothing moves in
 * the index; otherwise it makes the two calls. */
vp_status vp__allocator_transient(vp_allocator *a, uint64_t nbytes,
                                  int stream, uint64_t *handle,
                                  uint64_t *block_size, uint64_t *at,
                                  vp_error *err);

/* The statistics as they stand (vp_allocator_stats_get without the
 * copy); valid until the allocator's next call. */
const vp_allocator_stats *vp__allocator_stats(const vp_allocator *a);

/* Append to *w everything about the allocator that decides what it does
 * and reports from now on: every live block (address, size, requested
 * bytes, allocated, pool, stream, mapped, expandable segment) in address
 * order, the expandable segments, the next segment address and the
 * counters other than the retry and OOM counts (which only grow). Not the
 * handles (a new one per allocation, nor the dead-slot list that picks
 * them) nor the size-class index (its classes, bitmaps and cached first
 * blocks follow from the free blocks; its treaps' shape and priorities
 * do not change which block a best-fit search finds).
 * Two allocators that append the same words answer every later request
 * alike. O(n log n) in the blocks; false when memory runs out. The live
 * blocks are written segment by segment (the segments sorted by address
 * with a radix sort), in the order of a sort of all of them. */
bool vp__allocator_state(const vp_allocator *a, vp_words *w);

/* The words vp__allocator_state appends now (room made for them at once:
 * a state written into a buffer that doubles copies what it holds). */
size_t vp__allocator_state_words(const vp_allocator *a);

/* vp__allocator_state, and at `blocks` the live blocks in the order of
 * their records, that is of their addresses, as *n pairs: the block's
 * handle when it is allocated (what vp__allocator_alloc gave for it,
 * vp_allocator_block_addr's address), 0 when free; its address. blocks
 * has room for 2 vp__allocator_live_blocks(a) words; *n is 0 when the
 * records were sorted whole (the order is then not given). */
bool vp__allocator_state_handles(const vp_allocator *a, vp_words *w,
                                 uint64_t *blocks, size_t *n);

/* The live blocks (allocated, free or unmapped) now. */
size_t vp__allocator_live_blocks(const vp_allocator *a);

/* The block slots used so far: a live handle's low 32 bits (its slot
 * plus one) are at most this. */
size_t vp__allocator_slot_bound(const vp_allocator *a);

/* vp__allocator_state with every live block sorted by qsort: the
 * reference the tests compare it with. */
bool vp__allocator_state_sorted(const vp_allocator *a, vp_words *w);

#endif
