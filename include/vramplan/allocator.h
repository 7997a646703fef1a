/* vramplan: a model of PyTorch's CUDA caching allocator (torch 2.11,
 * c10/cuda/CUDACachingAllocator.cpp, native backend).
 *
 * It reproduces the allocator's rounding, small and large pools, segment
 * sizes, best-fit search, block splitting and merging, empty_cache, the
 * memory-fraction limit with its free-and-retry before OOM, and (as an
 * option) expandable segments. Addresses are simulated: every segment gets a
 * fresh, increasing virtual address, which is enough to break best-fit ties
 * the way the real allocator does within a run.
 * See shared/docs/PYTORCH_MEMORY.md §1 for the rules. */
#ifndef VRAMPLAN_ALLOCATOR_H
#define VRAMPLAN_ALLOCATOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "vramplan/error.h"

typedef struct vp_allocator vp_allocator;

typedef struct vp_allocator_config {
    uint64_t limit;                  /* bytes that reserved may not pass
                                        (memory fraction x device total);
                                        0 = no limit                          */
    uint64_t device_total;           /* device bytes; caps reserved when no
                                        limit is set (0 = unbounded)          */
    bool expandable_segments;        /* expandable_segments:True              */
    uint64_t max_split_size;         /* max_split_size_mb in bytes;
                                        UINT64_MAX = unset (default)          */
    uint64_t max_non_split_rounding; /* default 20 MiB                        */
    uint64_t large_segment_size;     /* default 20 MiB (kLargeBuffer)         */
    uint32_t roundup_power2_divisions[16]; /* all 0 by default (off)          */
} vp_allocator_config;

typedef struct vp_allocator_stats {
    uint64_t allocated;       /* memory_allocated(): sum of allocated block
                                 sizes (rounded, unsplit tails included)     */
    uint64_t peak_allocated;  /* max_memory_allocated()                      */
    uint64_t reserved;        /* memory_reserved(): sum of segment sizes     */
    uint64_t peak_reserved;   /* max_memory_reserved()                       */
    uint64_t requested;       /* sum of the requested (unrounded) sizes      */
    uint64_t segments;        /* live segments (cudaMalloc calls not freed)  */
    uint64_t active_blocks;   /* allocated blocks                            */
    uint64_t num_alloc_retries; /* times cached segments were freed to retry */
    uint64_t num_ooms;        /* allocations that failed                     */
} vp_allocator_stats;

/* Fill *cfg with PyTorch 2.11's defaults. */
void vp_allocator_config_init(vp_allocator_config *cfg);

/* New allocator with an empty cache. cfg NULL means defaults. Returns NULL
 * with *err set (VP_ENOMEM, or VP_EARG for an invalid config such as a
 * max_split_size under 20 MiB). Release with vp_allocator_free. */
vp_allocator *vp_allocator_new(const vp_allocator_config *cfg, vp_error *err);

/* Allocators made so far in this process (one per simulation: searches
 * show it as progress). Safe to read from a signal handler. */
uint64_t vp_allocator_created(void);

/* Release the model and everything in it. NULL is a no-op. */
void vp_allocator_free(vp_allocator *a);

/* Allocate nbytes (0 is allowed and takes no block; handle 0) on a stream
 * (0 = default stream). On success *handle identifies the block (never 0
 * for nbytes > 0). Returns VP_EOOM when PyTorch would raise
 * OutOfMemoryError (after its free-cached-segments-and-retry), or VP_ENOMEM
 * when the host runs out of memory. */
vp_status vp_allocator_malloc(vp_allocator *a, uint64_t nbytes, int stream,
                              uint64_t *handle, vp_error *err);

/* Free a block returned by vp_allocator_malloc (handle 0 is a no-op).
 * VP_EARG for an unknown or already freed handle. */
vp_status vp_allocator_release(vp_allocator *a, uint64_t handle,
                               vp_error *err);

/* torch.cuda.empty_cache(): return every free block that is a whole segment. */
void vp_allocator_empty_cache(vp_allocator *a);

/* Bytes of the block behind a handle (its rounded size, as counted in
 * allocated), 0 for an unknown handle. */
uint64_t vp_allocator_block_size(const vp_allocator *a, uint64_t handle);

/* Segment events: called right after the model cudaMallocs a new segment
 * (is_free false) and right after it cudaFrees one (is_free true), with
 * the segment's simulated address (unique among live segments; the same
 * on its free) and its size in bytes. Expandable segments (which map and
 * unmap pages instead) are not reported. fn NULL removes the hook. */
typedef void (*vp_allocator_segment_fn)(bool is_free, uint64_t addr,
                                        uint64_t size, void *ud);
void vp_allocator_set_segment_hook(vp_allocator *a,
                                   vp_allocator_segment_fn fn, void *ud);

/* Page events of expandable segments: called right after the model maps
 * pages into an expandable segment (is_free false) or unmaps them (is_free
 * true), with the range's simulated address and size in bytes, as torch's
 * segment_map and segment_unmap trace entries. fn NULL removes the hook. */
void vp_allocator_set_map_hook(vp_allocator *a, vp_allocator_segment_fn fn,
                               void *ud);

/* Simulated device address of the block behind a handle: a live allocated
 * block, or the block released most recently (so that a free can be
 * reported where it was right after vp_allocator_release). 0 for any other
 * handle. */
uint64_t vp_allocator_block_addr(const vp_allocator *a, uint64_t handle);

/* One block of a segment, as torch.cuda.memory._snapshot() lists it. */
typedef struct vp_allocator_block_info {
    uint64_t addr;      /* simulated address                              */
    uint64_t size;      /* bytes (rounded)                                */
    uint64_t requested; /* bytes asked for; 0 for a free block            */
    uint64_t handle;    /* the allocation's handle; 0 for a free block    */
    bool allocated;     /* state active_allocated, else inactive          */
} vp_allocator_block_info;

/* A segment: a cudaMalloc'd segment, or one contiguous mapped range of an
 * expandable segment (as torch reports them). */
typedef struct vp_allocator_segment_info {
    uint64_t addr;      /* simulated address                              */
    uint64_t size;      /* bytes (total_size)                             */
    uint64_t allocated; /* bytes of its allocated blocks (allocated_size) */
    uint64_t requested; /* bytes requested by them (requested_size)       */
    int stream;
    bool large;         /* large pool (segment_type 'large')              */
    bool expandable;
    size_t n_blocks;
    const vp_allocator_block_info *blocks; /* address order; borrowed,
                                              valid during the callback */
} vp_allocator_segment_info;

typedef vp_status (*vp_allocator_segment_visit)(
    const vp_allocator_segment_info *seg, void *ud);

/* Call fn for every segment in address order (the segments of
 * torch.cuda.memory._snapshot()). O(n log n) in the blocks. Stops at the
 * first status fn returns other than VP_OK and returns it; VP_ENOMEM if the
 * listing cannot be built, VP_EARG for NULL arguments. */
vp_status vp_allocator_segments(const vp_allocator *a,
                                vp_allocator_segment_visit fn, void *ud,
                                vp_error *err);

/* Current counters. */
void vp_allocator_stats_get(const vp_allocator *a, vp_allocator_stats *out);

/* torch.cuda.reset_peak_memory_stats(): peaks := current values. */
void vp_allocator_reset_peaks(vp_allocator *a);

/* The allocator's rounding of a request (round_size), and the size of the
 * segment a miss of that rounded size would cudaMalloc (get_allocation_size),
 * for the default configuration. Exposed for tests and for analytic use. */
uint64_t vp_allocator_round_size(const vp_allocator_config *cfg, uint64_t n);
uint64_t vp_allocator_segment_size(const vp_allocator_config *cfg,
                                   uint64_t rounded);

/* Check the model's internal invariants (for tests and debugging): the
 * blocks of every segment tile it in address order, no two free neighbours
 * are left unmerged, segments do not overlap, every free block sits in its
 * pool exactly once, and the counters (allocated, reserved, segments,
 * active_blocks) equal the sums over the blocks. O(n log n). Returns VP_OK,
 * VP_ERANGE with *err naming the first broken invariant, or VP_ENOMEM. */
vp_status vp_allocator_check(const vp_allocator *a, vp_error *err);

#endif
