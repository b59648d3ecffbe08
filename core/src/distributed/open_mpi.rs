//! Open MPI as a collective engine: its shared library (`libmpi.so.40`, Debian's `libopenmpi3`
//! from `openmpi-bin`) opened at run time, so that building napkin needs no MPI headers and a
//! process not started by `mpirun` never loads it.
//!
//! Open MPI's handles are the addresses of its predefined objects (`MPI_COMM_WORLD` is
//! `&ompi_mpi_comm_world`, `MPI_FLOAT` `&ompi_mpi_float`, `MPI_SUM` `&ompi_mpi_op_sum`), read
//! with `dlsym`; MPICH's are integers, so another MPI's library is refused by name. The library
//! is opened with `RTLD_GLOBAL`, as Open MPI's own plugins need its symbols. MPI's default error
//! handler ends the whole job on a failed call; napkin's own errors end it with `MPI_Abort`: an
//! engine dropped before [`Collective::finish`] aborts every rank, so no rank waits forever in
//! a collective the failed one will never call.

use std::ffi::{c_int, c_void};

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use super::{Collective, ReduceOp};
use crate::error::{Error, Result};

/// The library's name (Open MPI 3.x to 5.x keep the `.40` ABI).
const LIBRARY: &str = "libmpi.so.40";

/// `MPI_THREAD_SERIALIZED`: one thread calls MPI at a time (the trainer's), others exist.
const THREAD_SERIALIZED: c_int = 2;

/// `MPI_IN_PLACE`.
const IN_PLACE: *const c_void = std::ptr::without_provenance(1);

/// Elements per `MPI_Allreduce` call (its count is a C int).
const MAX_COUNT: usize = 1 << 30;

type Handle = *mut c_void;
type InitThread = unsafe extern "C" fn(*mut c_int, *mut c_void, c_int, *mut c_int) -> c_int;
type CommInt = unsafe extern "C" fn(Handle, *mut c_int) -> c_int;
type AllReduce =
    unsafe extern "C" fn(*const c_void, *mut c_void, c_int, Handle, Handle, Handle) -> c_int;
type Abort = unsafe extern "C" fn(Handle, c_int) -> c_int;
type Finalize = unsafe extern "C" fn() -> c_int;
type GetLibraryVersion = unsafe extern "C" fn(*mut u8, *mut c_int) -> c_int;

/// Open MPI's `MPI_COMM_WORLD`, initialised by this process.
pub struct OpenMpi {
    /// Kept open for the functions below.
    _library: Library,
    world: Handle,
    types: [Handle; 3], // f32, f64, u64
    ops: [Handle; 3],   // sum, min, max
    all_reduce: AllReduce,
    abort: Abort,
    finalize: Finalize,
    rank: usize,
    size: usize,
    version: String,
    /// Set by [`Collective::finish`]: dropped without it (an error on this rank), the engine
    /// aborts the job rather than wait in `MPI_Finalize` for ranks still in a collective.
    finished: bool,
}

fn error(message: String) -> Error {
    Error::Collective {
        engine: "Open MPI".into(),
        message,
    }
}

impl OpenMpi {
    /// Opens the library and calls `MPI_Init_thread` (once per process).
    pub fn init() -> Result<Self> {
        // SAFETY: loading Open MPI runs its constructors, which expect nothing of us.
        let library = unsafe { Library::open(Some(LIBRARY), RTLD_NOW | RTLD_GLOBAL) }.map_err(|e| {
            error(format!(
                "cannot load {LIBRARY} ({e}): install Open MPI (Debian: `apt install openmpi-bin`)"
            ))
        })?;
        // SAFETY: each symbol is read with the type Open MPI's mpi.h declares for it.
        unsafe {
            let function = |name: &str| -> Result<*mut c_void> {
                library
                    .get::<*mut c_void>(name.as_bytes())
                    .map(|s| *s)
                    .map_err(|e| error(format!("{LIBRARY} has no `{name}` ({e}): not Open MPI?")))
            };
            let object = function;
            let init: InitThread = std::mem::transmute(function("MPI_Init_thread")?);
            let rank_of: CommInt = std::mem::transmute(function("MPI_Comm_rank")?);
            let size_of: CommInt = std::mem::transmute(function("MPI_Comm_size")?);
            let version_of: GetLibraryVersion =
                std::mem::transmute(function("MPI_Get_library_version")?);
            let world = object("ompi_mpi_comm_world")?;
            let types = [
                object("ompi_mpi_float")?,
                object("ompi_mpi_double")?,
                object("ompi_mpi_uint64_t")?,
            ];
            let ops = [
                object("ompi_mpi_op_sum")?,
                object("ompi_mpi_op_min")?,
                object("ompi_mpi_op_max")?,
            ];
            let all_reduce: AllReduce = std::mem::transmute(function("MPI_Allreduce")?);
            let abort: Abort = std::mem::transmute(function("MPI_Abort")?);
            let finalize: Finalize = std::mem::transmute(function("MPI_Finalize")?);
            let mut provided: c_int = 0;
            let code = init(
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                THREAD_SERIALIZED,
                &mut provided,
            );
            if code != 0 {
                return Err(error(format!("MPI_Init_thread returned {code}")));
            }
            let (mut rank, mut size) = (0, 0);
            rank_of(world, &mut rank);
            size_of(world, &mut size);
            // MPI_MAX_LIBRARY_VERSION_STRING is 256 in Open MPI.
            let mut text = vec![0u8; 256];
            let mut length: c_int = 0;
            version_of(text.as_mut_ptr(), &mut length);
            text.truncate(length.clamp(0, 256) as usize);
            let version = String::from_utf8_lossy(&text)
                .split(',')
                .next()
                .unwrap_or("Open MPI")
                .trim()
                .to_string();
            Ok(OpenMpi {
                _library: library,
                world,
                types,
                ops,
                all_reduce,
                abort,
                finalize,
                rank: rank.max(0) as usize,
                size: size.max(1) as usize,
                version,
                finished: false,
            })
        }
    }

    fn reduce<T>(&mut self, values: &mut [T], kind: usize, op: ReduceOp) -> Result<()> {
        let op = self.ops[match op {
            ReduceOp::Sum => 0,
            ReduceOp::Min => 1,
            ReduceOp::Max => 2,
        }];
        for chunk in values.chunks_mut(MAX_COUNT) {
            // SAFETY: the buffer holds `len` values of the datatype named, as on every rank.
            let code = unsafe {
                (self.all_reduce)(
                    IN_PLACE,
                    chunk.as_mut_ptr().cast(),
                    chunk.len() as c_int,
                    self.types[kind],
                    op,
                    self.world,
                )
            };
            if code != 0 {
                return Err(error(format!(
                    "MPI_Allreduce of {} values returned {code}",
                    chunk.len()
                )));
            }
        }
        Ok(())
    }
}

impl Collective for OpenMpi {
    fn engine(&self) -> String {
        self.version.clone()
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn world(&self) -> usize {
        self.size
    }
    fn all_reduce_f32(&mut self, values: &mut [f32], op: ReduceOp) -> Result<()> {
        self.reduce(values, 0, op)
    }
    fn all_reduce_f64(&mut self, values: &mut [f64], op: ReduceOp) -> Result<()> {
        self.reduce(values, 1, op)
    }
    fn all_reduce_u64(&mut self, values: &mut [u64], op: ReduceOp) -> Result<()> {
        self.reduce(values, 2, op)
    }
    fn finish(&mut self) {
        self.finished = true;
    }
    fn abort(&mut self, code: i32) {
        // SAFETY: MPI_Abort takes the communicator and a code; it does not return.
        unsafe {
            (self.abort)(self.world, code);
        }
        std::process::exit(code);
    }
}

impl Drop for OpenMpi {
    fn drop(&mut self) {
        if !self.finished {
            eprintln!(
                "rank {} of {}: stopping before the run's end; ending every rank",
                self.rank, self.size
            );
            self.abort(1);
        }
        // SAFETY: every rank drops its engine once, after its last collective.
        unsafe {
            (self.finalize)();
        }
    }
}
