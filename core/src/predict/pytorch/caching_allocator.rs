//! PyTorch's CUDA caching allocator, replayed: what `torch.cuda.memory_reserved()` holds
//! after a sequence of allocations and frees, beside what `memory_allocated()` counts.
//!
//! The rules are the documented defaults of `c10/cuda/CUDACachingAllocator.cpp` (no
//! `PYTORCH_CUDA_ALLOC_CONF`, no expandable segments, one stream):
//! - every request is rounded up to a multiple of 512 bytes;
//! - requests of at most 1 MiB come from the *small* pool, whose segments are 2 MiB; larger
//!   ones from the *large* pool, whose segment is 20 MiB for a request under 10 MiB and the
//!   request rounded up to 2 MiB otherwise;
//! - a request takes the smallest free block of its pool that fits (ties: the lowest
//!   address), or `cudaMalloc`s a new segment when none does;
//! - the block is split when the rest is at least 512 bytes (small pool) or more than 1 MiB
//!   (large pool); otherwise the whole block is handed out (and counted as allocated);
//! - a freed block merges with free neighbours of its segment; segments go back to the driver
//!   only on `empty_cache()` (or under memory pressure, which this replay does not model), and
//!   only when wholly free.
//!
//! Addresses are the replay's own: segments are laid out one after the other, which is what a
//! fresh process's `cudaMalloc` tends to return.

use std::collections::{BTreeMap, BTreeSet};

/// Every block is a multiple of this.
pub const MIN_BLOCK: u64 = 512;
/// The largest request served by the small pool.
pub const SMALL_SIZE: u64 = 1 << 20;
/// The small pool's segment.
pub const SMALL_SEGMENT: u64 = 2 << 20;
/// Requests below this (and above `SMALL_SIZE`) get a `LARGE_SEGMENT` of their own.
pub const MIN_LARGE_ALLOC: u64 = 10 << 20;
/// The large pool's shared segment for requests of 1–10 MiB.
pub const LARGE_SEGMENT: u64 = 20 << 20;
/// Larger requests are rounded up to a multiple of this.
pub const ROUND_LARGE: u64 = 2 << 20;

/// A request rounded as the allocator rounds it.
pub fn round_size(bytes: u64) -> u64 {
    bytes.max(1).next_multiple_of(MIN_BLOCK)
}

/// The `cudaMalloc` made for a (rounded) request that no cached block fits.
pub fn segment_size(rounded: u64) -> u64 {
    if rounded <= SMALL_SIZE {
        SMALL_SEGMENT
    } else if rounded < MIN_LARGE_ALLOC {
        LARGE_SEGMENT
    } else {
        rounded.next_multiple_of(ROUND_LARGE)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pool {
    Small,
    Large,
}

impl Pool {
    fn of(rounded: u64) -> Pool {
        if rounded <= SMALL_SIZE {
            Pool::Small
        } else {
            Pool::Large
        }
    }

    /// Whether a block with `rest` bytes left over is split.
    fn splits(self, rest: u64) -> bool {
        match self {
            Pool::Small => rest >= MIN_BLOCK,
            Pool::Large => rest > SMALL_SIZE,
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Block {
    size: u64,
    segment: u64,
    pool: Pool,
    allocated: bool,
}

/// The allocator's state: segments, blocks and the counters PyTorch reports.
#[derive(Debug, Default)]
pub struct CachingAllocator {
    /// Every block by address (a segment's blocks are contiguous).
    blocks: BTreeMap<u64, Block>,
    /// Free blocks by (pool, size, address): the best-fit search order.
    free: BTreeSet<(Pool, u64, u64)>,
    /// Segments by base address: their size.
    segments: BTreeMap<u64, u64>,
    next_address: u64,
    reserved: u64,
    allocated: u64,
    max_allocated: u64,
    max_reserved: u64,
    segment_mallocs: usize,
}

impl CachingAllocator {
    /// An allocator that holds nothing.
    pub fn new() -> CachingAllocator {
        CachingAllocator::default()
    }

    /// Allocates `bytes`; returns the block's address (its handle for `free`).
    pub fn malloc(&mut self, bytes: u64) -> u64 {
        let size = round_size(bytes);
        let pool = Pool::of(size);
        let fit = self
            .free
            .range((pool, size, 0)..)
            .next()
            .copied()
            .filter(|&(p, _, _)| p == pool);
        let address = match fit {
            Some(key) => {
                self.free.remove(&key);
                key.2
            }
            None => self.new_segment(pool, segment_size(size)),
        };
        let block = self.blocks[&address];
        let rest = block.size - size;
        let taken = if pool.splits(rest) {
            let remainder = Block {
                size: rest,
                allocated: false,
                ..block
            };
            self.blocks.insert(address + size, remainder);
            self.free.insert((pool, rest, address + size));
            size
        } else {
            block.size
        };
        self.blocks.insert(
            address,
            Block {
                size: taken,
                allocated: true,
                ..block
            },
        );
        self.allocated += taken;
        self.max_allocated = self.max_allocated.max(self.allocated);
        address
    }

    /// Frees the block at `address` (an address `malloc` returned and not yet freed).
    ///
    /// # Panics
    /// If `address` is not an allocated block: a replay that frees what it never allocated is
    /// a bug in the replay.
    pub fn free(&mut self, address: u64) {
        let block = *self
            .blocks
            .get(&address)
            .filter(|b| b.allocated)
            .expect("free of a block that is not allocated");
        self.allocated -= block.size;
        let (mut start, mut size) = (address, block.size);
        // Merge with a free block just before, in the same segment.
        if let Some((&before, &prev)) = self.blocks.range(..address).next_back()
            && !prev.allocated
            && prev.segment == block.segment
            && before + prev.size == address
        {
            self.free.remove(&(prev.pool, prev.size, before));
            self.blocks.remove(&address);
            start = before;
            size += prev.size;
        }
        // And with one just after.
        let after = address + block.size;
        if let Some(&next) = self.blocks.get(&after)
            && !next.allocated
            && next.segment == block.segment
        {
            self.free.remove(&(next.pool, next.size, after));
            self.blocks.remove(&after);
            size += next.size;
        }
        self.blocks.insert(
            start,
            Block {
                size,
                allocated: false,
                ..block
            },
        );
        self.free.insert((block.pool, size, start));
    }

    /// `torch.cuda.empty_cache()`: every wholly free segment goes back to the driver.
    pub fn empty_cache(&mut self) {
        let whole: Vec<(u64, u64)> = self
            .segments
            .iter()
            .filter(|&(base, &size)| {
                self.blocks
                    .get(base)
                    .is_some_and(|b| !b.allocated && b.size == size)
            })
            .map(|(&base, &size)| (base, size))
            .collect();
        for (base, size) in whole {
            let block = self.blocks.remove(&base).expect("listed above");
            self.free.remove(&(block.pool, size, base));
            self.segments.remove(&base);
            self.reserved -= size;
        }
    }

    /// `memory_reserved()`: the bytes of every segment held.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// `memory_allocated()`: the bytes of every block handed out (rounded, and whole where a
    /// block was not split).
    pub fn allocated(&self) -> u64 {
        self.allocated
    }

    /// `torch.cuda.reset_peak_memory_stats()`: the maxima start again from what is held now.
    pub fn reset_peak_stats(&mut self) {
        self.max_allocated = self.allocated;
        self.max_reserved = self.reserved;
    }

    /// `max_memory_allocated()` since the allocator was made or its peaks were last reset.
    pub fn max_allocated(&self) -> u64 {
        self.max_allocated
    }

    /// `max_memory_reserved()` since the allocator was made or its peaks were last reset.
    pub fn max_reserved(&self) -> u64 {
        self.max_reserved
    }

    /// How many `cudaMalloc`s the replay made.
    pub fn segment_mallocs(&self) -> usize {
        self.segment_mallocs
    }

    fn new_segment(&mut self, pool: Pool, size: u64) -> u64 {
        let base = self.next_address;
        // A gap keeps two segments from ever looking adjacent.
        self.next_address += size + ROUND_LARGE;
        self.segments.insert(base, size);
        self.blocks.insert(
            base,
            Block {
                size,
                segment: base,
                pool,
                allocated: false,
            },
        );
        self.reserved += size;
        self.max_reserved = self.max_reserved.max(self.reserved);
        self.segment_mallocs += 1;
        base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn requests_round_to_512_and_pick_their_segment() {
        assert_eq!(round_size(1), 512);
        assert_eq!(round_size(513), 1024);
        assert_eq!(segment_size(round_size(MIB)), SMALL_SEGMENT);
        assert_eq!(segment_size(round_size(MIB + 1)), LARGE_SEGMENT);
        assert_eq!(segment_size(10 * MIB - 512), LARGE_SEGMENT);
        assert_eq!(segment_size(10 * MIB), 10 * MIB);
        assert_eq!(segment_size(11 * MIB + 512), 12 * MIB);
    }

    #[test]
    fn small_requests_share_a_2_mib_segment() {
        let mut a = CachingAllocator::new();
        let blocks: Vec<u64> = (0..4).map(|_| a.malloc(1000)).collect();
        assert_eq!(a.reserved(), SMALL_SEGMENT);
        assert_eq!(a.allocated(), 4 * 1024);
        // Freed, they merge back into one block: the segment returns on empty_cache.
        for b in blocks {
            a.free(b);
        }
        a.empty_cache();
        assert_eq!(a.reserved(), 0);
    }

    #[test]
    fn mid_sized_requests_share_a_20_mib_segment_until_it_is_full() {
        let mut a = CachingAllocator::new();
        for _ in 0..3 {
            a.malloc(6 * MIB);
        }
        // 18 MiB of the first segment used; its last 2 MiB cannot take a fourth.
        assert_eq!(a.reserved(), LARGE_SEGMENT);
        a.malloc(6 * MIB);
        assert_eq!(a.reserved(), 2 * LARGE_SEGMENT);
        assert_eq!(a.segment_mallocs(), 2);
    }

    #[test]
    fn a_large_block_is_not_split_for_a_rest_of_1_mib_or_less() {
        let mut a = CachingAllocator::new();
        let big = a.malloc(12 * MIB);
        a.free(big);
        // 11.5 MiB fits the cached 12 MiB block; the 0.5 MiB rest stays with it.
        a.malloc(11 * MIB + MIB / 2);
        assert_eq!(a.allocated(), 12 * MIB);
        assert_eq!(a.reserved(), 12 * MIB);
    }

    #[test]
    fn best_fit_takes_the_smallest_free_block_that_fits() {
        let mut a = CachingAllocator::new();
        let x = a.malloc(40 * MIB);
        let y = a.malloc(12 * MIB);
        a.free(x);
        a.free(y);
        // 12 MiB fits both; the 12 MiB segment is the smaller.
        let z = a.malloc(12 * MIB);
        assert_eq!(z, y);
        assert_eq!(a.reserved(), 52 * MIB);
    }

    #[test]
    fn fragmentation_makes_reserved_exceed_the_peak() {
        let mut a = CachingAllocator::new();
        // Two 12 MiB blocks, the first freed: a 14 MiB request fits neither.
        let first = a.malloc(12 * MIB);
        a.malloc(12 * MIB);
        a.free(first);
        a.malloc(14 * MIB);
        assert_eq!(a.max_allocated(), 26 * MIB);
        assert_eq!(a.reserved(), 38 * MIB);
    }

    #[test]
    fn resetting_the_peaks_starts_them_from_what_is_held() {
        let mut a = CachingAllocator::new();
        let big = a.malloc(40 * MIB);
        let held = a.malloc(12 * MIB);
        a.free(big);
        a.reset_peak_stats();
        assert_eq!(a.max_allocated(), 12 * MIB);
        assert_eq!(a.max_reserved(), 52 * MIB);
        a.malloc(20 * MIB);
        assert_eq!(a.max_allocated(), 32 * MIB);
        a.free(held);
        assert_eq!(a.max_allocated(), 32 * MIB);
    }
}
