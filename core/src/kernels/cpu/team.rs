//! A team of compute threads kept awake for a short run of parallel passes (one forward pass of
//! KV-cached generation): between passes they spin on one atomic word instead of going back to
//! rayon's sleep.
//!
//! A decode step of a 1.1B model makes ~90 passes over the threads (the products, attention),
//! each a few hundred µs, with a few µs of one-thread work between them (norms, RoPE, quantizing
//! the next input). rayon's idle workers yield and then sleep on a futex within tens of µs, and
//! each pass then wakes them again: `perf` put ~6 % of that decode's time in the scheduler's
//! yield, sleep and wake-up paths. Inside [`with_team`] the pool's other threads run
//! [`Team::serve`] instead: each waits for the next pass on the team's state word, claims items
//! from it one at a time, and leaves when the team ends. One wake-up per forward pass instead of
//! one per product.
//!
//! The one-thread work between passes leaves the memory bus idle, while the products are bound
//! by it (a 1.1B model's decode streams 667 MB a token). So the leader names the bytes the next
//! pass will read first ([`Lead::warm`]) and an idle helper reads them ahead into the caches,
//! until that pass is published: the pass then finds its first rows in L2/L3.
//!
//! [`for_each_mut`] runs a pass on the calling thread's team, or on rayon when the thread has none,
//! so the same kernels run inside and outside a team.

use std::cell::Cell;
use std::marker::PhantomData;
use std::ops::Range;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use rayon::prelude::*;

/// The state word: the pass's number (24 bits), its item count (20 bits) and the next item not
/// yet claimed (20 bits). One word, so that a claim checks all three in one compare-and-swap: a
/// thread that read an older pass's state can never claim an item of a newer pass.
const ITEM_BITS: u32 = 20;
const MAX_ITEMS: usize = (1 << ITEM_BITS) - 1;
const ITEM_MASK: u64 = MAX_ITEMS as u64;
const PASS_MASK: u64 = (1 << 24) - 1;

fn pack(pass: u64, items: usize, next: usize) -> u64 {
    (pass & PASS_MASK) << (2 * ITEM_BITS) | (items as u64) << ITEM_BITS | next as u64
}

/// `(pass, items, next)`.
fn unpack(word: u64) -> (u64, usize, usize) {
    (
        word >> (2 * ITEM_BITS),
        ((word >> ITEM_BITS) & ITEM_MASK) as usize,
        (word & ITEM_MASK) as usize,
    )
}

/// Spins of a waiting helper before it starts yielding its CPU on each further check (a few
/// hundred µs; a forward pass's gaps between passes are far shorter).
const SPINS_BEFORE_YIELDING: u32 = 1 << 16;

/// Bytes a helper reads ahead before it checks for a pass again (~0.2 µs of streaming).
const WARM_CHUNK: usize = 4096;

/// A cache line: the stride of the reads ahead.
const LINE: usize = 64;

/// One pass's item runner, on the publishing thread's stack while the pass runs.
type Run<'a> = &'a (dyn Fn(usize) + Sync);

/// The shared state of one team (see the module's documentation).
pub struct Team {
    /// `pack(pass, items, next)`.
    state: AtomicU64,
    /// The current pass's `Run`, a pointer to it on the publisher's stack. Read only after a
    /// successful claim: the publisher cannot return (and free it) while a claimed item runs.
    run: AtomicPtr<()>,
    /// Items of the current pass the helpers have finished (run or panicked).
    helpers_finished: AtomicUsize,
    /// Whether an item panicked on a helper (the publisher resumes the panic).
    helper_panicked: AtomicBool,
    /// Set when the team's work is done: the helpers return.
    ended: AtomicBool,
    /// Addresses still to be read ahead (`Lead::warm`); emptied when a pass is published.
    warm: Mutex<Range<usize>>,
    /// The leading thread (the one `rayon::scope` runs the work on), which never serves its
    /// own team.
    leader: OnceLock<std::thread::ThreadId>,
}

/// The calling thread's lead of a team (inside [`with_team`]): bytes that outlive the team
/// (`'w`) can be named for reading ahead.
pub struct Lead<'t, 'w> {
    team: Option<&'t Team>,
    _bytes: PhantomData<&'w [u8]>,
}

impl<'w> Lead<'_, 'w> {
    /// Has an idle helper read `bytes` (from the start) into the caches until the next pass is
    /// published; replaces any earlier request. Nothing outside a team.
    pub fn warm(&self, bytes: &'w [u8]) {
        if let Some(team) = self.team {
            let start = bytes.as_ptr() as usize;
            *team.warm.lock().unwrap_or_else(|e| e.into_inner()) = start..start + bytes.len();
        }
    }
}

thread_local! {
    /// The team this thread leads, if any (set inside [`with_team`]'s work).
    static LEADING: Cell<*const Team> = const { Cell::new(std::ptr::null()) };
}

/// Runs `work` on the calling thread with the rest of rayon's pool as its team: every
/// [`for_each_mut`] inside it (on this thread) is shared with them without waking anyone.
/// Inside another team, on a pool of one thread, or on a pool with more threads than the
/// process has CPUs, `work` simply runs (and its passes use rayon).
pub fn with_team<'w, R: Send>(work: impl FnOnce(&Lead<'_, 'w>) -> R + Send) -> R {
    let alone = Lead {
        team: None,
        _bytes: PhantomData,
    };
    if LEADING.with(|t| !t.get().is_null()) {
        return work(&alone);
    }
    // Spinning helpers must each have a CPU of their own. With more pool threads than CPUs
    // they took the leader's turns: a pool of 4 on 2 CPUs decoded SmolLM2 at half speed with
    // 3 helpers, and ~20 % slower with 1 (the one woken each token often landed on the
    // leader's CPU); such a pool keeps rayon's sleeping threads.
    let threads = rayon::current_num_threads();
    let helpers = threads.saturating_sub(1);
    if helpers == 0 || threads > crate::device::process_cpu_count() {
        return work(&alone);
    }
    let team = Team {
        state: AtomicU64::new(pack(0, 0, 0)),
        run: AtomicPtr::new(std::ptr::null_mut()),
        helpers_finished: AtomicUsize::new(0),
        helper_panicked: AtomicBool::new(false),
        ended: AtomicBool::new(false),
        warm: Mutex::new(0..0),
        leader: OnceLock::new(),
    };
    rayon::scope(|scope| {
        let _ = team.leader.set(std::thread::current().id());
        for _ in 0..helpers {
            scope.spawn(|_| team.serve());
        }
        // Ends the team and clears the lead even if `work` panics (else the helpers would spin
        // on and the scope never finish).
        struct EndOnDrop<'t>(&'t Team);
        impl Drop for EndOnDrop<'_> {
            fn drop(&mut self) {
                LEADING.with(|t| t.set(std::ptr::null()));
                self.0.ended.store(true, Ordering::Release);
            }
        }
        LEADING.with(|t| t.set(&team));
        let _end = EndOnDrop(&team);
        work(&Lead {
            team: Some(&team),
            _bytes: PhantomData,
        })
    })
}

/// Calls `f` on every item, shared over the calling thread's team if it leads one, else over
/// rayon's threads. Each item is passed to exactly one call.
pub fn for_each_mut<T: Send>(items: &mut [T], f: impl Fn(&mut T) + Sync) {
    let team = LEADING.with(Cell::get);
    if team.is_null() || items.len() <= 1 {
        items.par_iter_mut().for_each(&f);
        return;
    }
    // SAFETY: `LEADING` points at the team of an enclosing `with_team` on this thread, which
    // outlives this call (it is cleared before the team is dropped).
    let team = unsafe { &*team };
    // A pass inside an item (a kernel that splits its own work) runs on rayon, not as a second
    // pass of the same team over the first; the lead comes back when the passes end.
    struct Resume(*const Team);
    impl Drop for Resume {
        fn drop(&mut self) {
            LEADING.with(|t| t.set(self.0));
        }
    }
    LEADING.with(|t| t.set(std::ptr::null()));
    let _resume = Resume(team);
    for batch in items.chunks_mut(MAX_ITEMS) {
        let base = ItemsPtr(batch.as_mut_ptr());
        // SAFETY: the team passes each index below `batch.len()` to exactly one call, so each
        // `&mut` is unique, and every call has returned before `run_pass` does.
        team.run_pass(batch.len(), &|i| f(unsafe { &mut *base.at(i) }));
    }
}

/// The items of one pass, shared with the helpers (each index is claimed once).
struct ItemsPtr<T>(*mut T);

impl<T> ItemsPtr<T> {
    fn at(&self, i: usize) -> *mut T {
        // SAFETY (for the caller): `i` is below the batch's length.
        unsafe { self.0.add(i) }
    }
}

// SAFETY: the items are `Send` and each is handed to one thread only (see `for_each_mut`).
unsafe impl<T: Send> Sync for ItemsPtr<T> {}

impl Team {
    /// Publishes a pass of `items` items, runs items on this thread until none is left
    /// unclaimed, then waits for the helpers' items.
    fn run_pass(&self, items: usize, run: Run<'_>) {
        debug_assert!(items <= MAX_ITEMS);
        let (previous, _, _) = unpack(self.state.load(Ordering::Relaxed));
        let pass = (previous + 1) & PASS_MASK;
        self.helpers_finished.store(0, Ordering::Relaxed);
        self.helper_panicked.store(false, Ordering::Relaxed);
        self.run
            .store(&run as *const Run<'_> as *mut (), Ordering::Relaxed);
        *self.warm.lock().unwrap_or_else(|e| e.into_inner()) = 0..0;
        // Release: a helper whose claim reads this word also sees `run` and the reset count.
        self.state.store(pack(pass, items, 0), Ordering::Release);

        // Closes the pass and waits for the helpers' items even if one of ours panics: `run`
        // lives on this stack frame.
        struct Close<'t> {
            team: &'t Team,
            pass: u64,
            claimed_here: usize,
        }
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                let claimed = self.team.close(self.pass);
                let by_helpers = claimed - self.claimed_here;
                while self.team.helpers_finished.load(Ordering::Acquire) < by_helpers {
                    std::hint::spin_loop();
                }
            }
        }
        let mut close = Close {
            team: self,
            pass,
            claimed_here: 0,
        };
        while let Some(i) = self.claim(pass) {
            close.claimed_here += 1;
            run(i);
        }
        drop(close);
        if self.helper_panicked.swap(false, Ordering::AcqRel) {
            panic!("a team thread panicked in a parallel pass");
        }
    }

    /// The next unclaimed item of pass `pass`, claimed; `None` when the pass has none left or
    /// is no longer the current one.
    fn claim(&self, pass: u64) -> Option<usize> {
        let mut word = self.state.load(Ordering::Acquire);
        loop {
            let (current, items, next) = unpack(word);
            if current != pass || next >= items {
                return None;
            }
            match self.state.compare_exchange_weak(
                word,
                word + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some(next),
                Err(now) => word = now,
            }
        }
    }

    /// Stops further claims of pass `pass`; the number of its items that were claimed.
    fn close(&self, pass: u64) -> usize {
        let mut word = self.state.load(Ordering::Acquire);
        loop {
            let (current, items, next) = unpack(word);
            debug_assert_eq!(current, pass, "only the publisher closes its pass");
            if next >= items {
                return items;
            }
            match self.state.compare_exchange_weak(
                word,
                pack(current, items, items),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return next,
                Err(now) => word = now,
            }
        }
    }

    /// The next chunk of the read-ahead request, taken from it.
    fn next_warm_chunk(&self) -> Option<Range<usize>> {
        let mut warm = self.warm.lock().unwrap_or_else(|e| e.into_inner());
        if warm.is_empty() {
            return None;
        }
        let chunk = warm.start..(warm.start + WARM_CHUNK).min(warm.end);
        warm.start = chunk.end;
        Some(chunk)
    }

    /// A helper's loop: claim and run the current pass's items; between passes spin (then
    /// yield) until the next one or the team's end.
    fn serve(&self) {
        // The leader itself may pick up a helper's job while it waits in rayon (a `join` inside
        // its work): it must not serve its own team.
        if self.leader.get() == Some(&std::thread::current().id()) {
            return;
        }
        let mut idle_spins = 0u32;
        while !self.ended.load(Ordering::Acquire) {
            let (pass, _, _) = unpack(self.state.load(Ordering::Acquire));
            if let Some(i) = self.claim(pass) {
                // SAFETY: the claim's acquire saw the publisher's release of `run`, and the
                // publisher waits for this item before its frame (holding `run`) is left.
                let run = unsafe { *(self.run.load(Ordering::Acquire) as *const Run<'_>) };
                if catch_unwind(AssertUnwindSafe(|| run(i))).is_err() {
                    self.helper_panicked.store(true, Ordering::Release);
                }
                self.helpers_finished.fetch_add(1, Ordering::Release);
                idle_spins = 0;
            } else if let Some(chunk) = self.next_warm_chunk() {
                read_ahead(chunk);
                idle_spins = 0;
            } else if idle_spins < SPINS_BEFORE_YIELDING {
                idle_spins += 1;
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

/// Reads one byte of each cache line of `addresses` (bytes a `Lead<'w>` named, alive for the
/// team's whole life, of which the helper's loop is part).
fn read_ahead(addresses: Range<usize>) {
    let mut seen = 0u8;
    for address in addresses.step_by(LINE) {
        // SAFETY: inside a range `Lead::warm` was given, borrowed for longer than the team.
        seen ^= unsafe { std::ptr::read_volatile(address as *const u8) };
    }
    std::hint::black_box(seen);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of its own, so that a test's team does not depend on the global pool's size.
    fn pool_of_two() -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("a pool of two threads")
    }

    #[test]
    fn every_item_is_visited_once_inside_and_outside_a_team() {
        let mut items: Vec<u64> = (0..10_000).collect();
        let expected: Vec<u64> = items.iter().map(|v| v * 3 + 1).collect();
        for_each_mut(&mut items, |v| *v = *v * 3 + 1);
        assert_eq!(items, expected);

        let mut items: Vec<u64> = (0..10_000).collect();
        with_team(|_| {
            for pass in 0..200u64 {
                for_each_mut(&mut items, |v| *v += pass);
            }
        });
        let sum_of_passes: u64 = (0..200).sum();
        let expected: Vec<u64> = (0..10_000).map(|v| v + sum_of_passes).collect();
        assert_eq!(items, expected);
    }

    #[test]
    fn a_pass_runs_on_more_than_one_thread_when_the_pool_has_them() {
        let pool = pool_of_two();
        let threads = pool.install(|| {
            with_team(|_| {
                let mut seen: Vec<Option<std::thread::ThreadId>> = vec![None; 64];
                // Items long enough that the helper, once awake, takes some.
                for _ in 0..50 {
                    for_each_mut(&mut seen, |s| {
                        let start = std::time::Instant::now();
                        while start.elapsed() < std::time::Duration::from_micros(50) {}
                        *s = Some(std::thread::current().id());
                    });
                    if seen.iter().any(|s| *s != seen[0]) {
                        break;
                    }
                }
                let mut ids: Vec<_> = seen.into_iter().flatten().collect();
                ids.sort_by_key(|id| format!("{id:?}"));
                ids.dedup();
                ids.len()
            })
        });
        let expected = 2.min(crate::device::process_cpu_count());
        assert_eq!(threads, expected, "every thread of the team took items");
    }

    #[test]
    fn an_idle_helper_reads_the_named_bytes_ahead_and_a_pass_ends_the_request() {
        if crate::device::process_cpu_count() < 2 {
            return; // no helper: `warm` does nothing
        }
        let pool = pool_of_two();
        let bytes = vec![7u8; 4 << 20];
        pool.install(|| {
            with_team(|lead| {
                let team = lead.team.expect("a pool of two threads leads a team");
                let left = || team.warm.lock().map(|w| w.len()).unwrap_or(0);
                lead.warm(&bytes);
                let start = std::time::Instant::now();
                while left() > 0 && start.elapsed() < std::time::Duration::from_secs(10) {
                    std::hint::spin_loop();
                }
                assert_eq!(left(), 0, "the helper read every byte ahead");

                lead.warm(&bytes);
                let mut items = [0u8; 4];
                for_each_mut(&mut items, |v| *v += 1);
                assert_eq!(left(), 0, "a pass ends the request");
                assert_eq!(items, [1; 4]);
            })
        });
    }

    #[test]
    fn a_pass_inside_an_item_runs_apart_from_the_teams_pass() {
        let pool = pool_of_two();
        let sums = pool.install(|| {
            with_team(|_| {
                let mut outer: Vec<(u64, u64)> = (0..64).map(|i| (i, 0)).collect();
                for_each_mut(&mut outer, |(i, sum)| {
                    let mut inner: Vec<u64> = (0..100).map(|j| *i * 1000 + j).collect();
                    for_each_mut(&mut inner, |v| *v *= 2);
                    *sum = inner.iter().sum();
                });
                outer
            })
        });
        for (i, sum) in sums {
            assert_eq!(
                sum,
                (0..100).map(|j| 2 * (i * 1000 + j)).sum::<u64>(),
                "item {i}"
            );
        }
    }

    #[test]
    fn a_panicking_item_reaches_the_leader_and_the_team_ends() {
        let pool = pool_of_two();
        let outcome = pool.install(|| {
            catch_unwind(AssertUnwindSafe(|| {
                with_team(|_| {
                    let mut items: Vec<usize> = (0..256).collect();
                    for_each_mut(&mut items, |v| assert!(*v != 200, "item 200"));
                })
            }))
        });
        assert!(outcome.is_err(), "the panic came back to the caller");
        // The pool is usable again: no helper still spins in the ended team.
        let sum: usize = pool.install(|| (0..1000usize).into_par_iter().sum());
        assert_eq!(sum, 499_500);
    }
}
