//! Training on more than one process: the collective operations a data-parallel step needs,
//! behind one interface, with real engines behind it, and every call counted where it happens.
//!
//! - `launch.rs`: which rank this process is, from the launcher's environment (torchrun's
//!   `RANK`/`WORLD_SIZE`, Open MPI's `OMPI_COMM_WORLD_*`, Slurm's `SLURM_*`).
//! - `open_mpi.rs`: Open MPI's library (`libmpi.so.40`), opened at run time under `mpirun`.
//! - [`Counted`]: the byte-counting layer every caller goes through, so the bytes each
//!   collective carried can be put beside `predict::communication`'s.
//!
//! A collective is called by every rank, in the same order, with buffers of the same length.

pub mod launch;
#[cfg(unix)]
pub mod open_mpi;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::predict::communication::Collective as Operation;
use launch::{Launch, Launcher};

/// How values from every rank are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ReduceOp {
    /// Their sum.
    Sum,
    /// The smallest.
    Min,
    /// The largest.
    Max,
}

/// A collective engine: every rank calls each method in the same order.
pub trait Collective {
    /// The engine's name, for messages (`Open MPI 4.1`).
    fn engine(&self) -> String;
    /// This process's rank, `0..world`.
    fn rank(&self) -> usize;
    /// Ranks in all.
    fn world(&self) -> usize;
    /// Combines `values` of every rank element by element, in place on every rank.
    fn all_reduce_f32(&mut self, values: &mut [f32], op: ReduceOp) -> Result<()>;
    /// [`Self::all_reduce_f32`] on f64 values.
    fn all_reduce_f64(&mut self, values: &mut [f64], op: ReduceOp) -> Result<()>;
    /// [`Self::all_reduce_f32`] on u64 values.
    fn all_reduce_u64(&mut self, values: &mut [u64], op: ReduceOp) -> Result<()>;
    /// Marks the run as complete on this rank: the engine then shuts down normally when
    /// dropped (dropped without it, it ends every rank).
    fn finish(&mut self);
    /// Ends every rank's process with `code` (after an error on this rank), so that no rank
    /// waits for a collective this one will never call.
    fn abort(&mut self, code: i32);
}

/// One process alone: every collective is the identity.
#[derive(Debug, Default)]
pub struct Alone;

impl Collective for Alone {
    fn engine(&self) -> String {
        "none (one process)".into()
    }
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn all_reduce_f32(&mut self, _: &mut [f32], _: ReduceOp) -> Result<()> {
        Ok(())
    }
    fn all_reduce_f64(&mut self, _: &mut [f64], _: ReduceOp) -> Result<()> {
        Ok(())
    }
    fn all_reduce_u64(&mut self, _: &mut [u64], _: ReduceOp) -> Result<()> {
        Ok(())
    }
    fn finish(&mut self) {}
    fn abort(&mut self, code: i32) {
        std::process::exit(code);
    }
}

/// The calls of one kind a [`Counted`] engine carried.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CountedCalls {
    /// What they carried (`gradients`).
    pub what: &'static str,
    /// The operation.
    pub op: Operation,
    /// Calls made.
    pub calls: u64,
    /// Bytes of the buffers handed to the engine, all calls (each call's whole tensor, as
    /// `predict::communication` counts a payload).
    pub payload_bytes: u64,
}

/// An engine with every call counted at the call.
pub struct Counted {
    engine: Box<dyn Collective>,
    counts: Vec<CountedCalls>,
}

impl std::fmt::Debug for Counted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Counted")
            .field("engine", &self.engine.engine())
            .field("rank", &self.engine.rank())
            .field("world", &self.engine.world())
            .field("counts", &self.counts)
            .finish()
    }
}

impl Counted {
    /// Counts `engine`'s calls.
    pub fn new(engine: Box<dyn Collective>) -> Self {
        Self {
            engine,
            counts: Vec::new(),
        }
    }

    /// The engine this launch asks for: one process alone, or Open MPI under `mpirun` (or
    /// `srun` with Open MPI's PMIx). torchrun's rendezvous needs NCCL, which napkin does not
    /// have yet: refused, naming the launcher that works.
    pub fn for_launch(launch: &Launch) -> Result<Self> {
        if launch.world == 1 {
            return Ok(Self::new(Box::new(Alone)));
        }
        match launch.launcher {
            Launcher::Torchrun => Err(Error::Collective {
                engine: "NCCL".into(),
                message: format!(
                    "torchrun started {} ranks, but its rendezvous (MASTER_ADDR) needs the NCCL \
                     engine, which napkin does not have yet; on CPU ranks launch with \
                     `mpirun -np {} napkin train …` (Open MPI)",
                    launch.world, launch.world
                ),
            }),
            #[cfg(unix)]
            Launcher::OpenMpi | Launcher::Slurm => {
                let engine = open_mpi::OpenMpi::init()?;
                if engine.rank() != launch.rank || engine.world() != launch.world {
                    return Err(Error::Collective {
                        engine: engine.engine(),
                        message: format!(
                            "the launcher says rank {} of {}, MPI says rank {} of {}",
                            launch.rank,
                            launch.world,
                            engine.rank(),
                            engine.world()
                        ),
                    });
                }
                Ok(Self::new(Box::new(engine)))
            }
            #[allow(unreachable_patterns)]
            _ => Err(Error::Collective {
                engine: "MPI".into(),
                message: "Open MPI runs on Unix systems only".into(),
            }),
        }
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.engine.rank()
    }

    /// Ranks in all.
    pub fn world(&self) -> usize {
        self.engine.world()
    }

    /// The engine's name.
    pub fn engine(&self) -> String {
        self.engine.engine()
    }

    /// Every call so far, by what it carried.
    pub fn counts(&self) -> &[CountedCalls] {
        &self.counts
    }

    fn count(&mut self, what: &'static str, bytes: usize) {
        let op = Operation::AllReduce;
        match self
            .counts
            .iter_mut()
            .find(|c| c.what == what && c.op == op)
        {
            Some(c) => {
                c.calls += 1;
                c.payload_bytes += bytes as u64;
            }
            None => self.counts.push(CountedCalls {
                what,
                op,
                calls: 1,
                payload_bytes: bytes as u64,
            }),
        }
    }

    /// Sums `values` over the ranks, counted as `what`.
    pub fn sum_f32(&mut self, what: &'static str, values: &mut [f32]) -> Result<()> {
        self.count(what, size_of_val(values));
        self.engine.all_reduce_f32(values, ReduceOp::Sum)
    }

    /// Sums `values` over the ranks, counted as `what`.
    pub fn sum_f64(&mut self, what: &'static str, values: &mut [f64]) -> Result<()> {
        self.count(what, size_of_val(values));
        self.engine.all_reduce_f64(values, ReduceOp::Sum)
    }

    /// The smallest and largest of `value` over the ranks, counted as `what`.
    pub fn min_max_u64(&mut self, what: &'static str, value: u64) -> Result<(u64, u64)> {
        let mut low = [value];
        let mut high = [value];
        self.count(what, 8);
        self.engine.all_reduce_u64(&mut low, ReduceOp::Min)?;
        self.count(what, 8);
        self.engine.all_reduce_u64(&mut high, ReduceOp::Max)?;
        Ok((low[0], high[0]))
    }

    /// This rank's run is complete (see [`Collective::finish`]).
    pub fn finish(&mut self) {
        self.engine.finish()
    }

    /// Ends every rank (see [`Collective::abort`]).
    pub fn abort(&mut self, code: i32) {
        self.engine.abort(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_is_counted_where_it_happens() {
        let mut c = Counted::new(Box::new(Alone));
        let mut grads = vec![1.0f32; 10];
        c.sum_f32("gradients", &mut grads).unwrap();
        c.sum_f32("gradients", &mut grads).unwrap();
        c.sum_f64("loss and label tokens", &mut [1.0, 2.0, 3.0])
            .unwrap();
        assert_eq!(c.min_max_u64("adapter hash", 7).unwrap(), (7, 7));
        let counts = c.counts();
        assert_eq!((counts[0].calls, counts[0].payload_bytes), (2, 80));
        assert_eq!((counts[1].calls, counts[1].payload_bytes), (1, 24));
        assert_eq!((counts[2].calls, counts[2].payload_bytes), (2, 16));
    }
}
