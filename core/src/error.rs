//! The one error type of napkin-core, grouped by where the problem was found.
//!
//! Every message names the file, tensor or setting at fault and what was expected, so a
//! learner can act on it without reading our source.

use std::path::PathBuf;

/// Everything that can go wrong inside napkin-core.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    // ---- files -----------------------------------------------------------------------------
    /// A file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file or folder involved.
        path: PathBuf,
        /// What the operating system said (shown in the message, so not a `source`).
        error: std::io::Error,
    },

    /// A JSON file did not parse.
    #[error("{path}: not valid JSON: {error}")]
    Json {
        /// The file that failed to parse.
        path: PathBuf,
        /// The parser's message (with line and column).
        error: serde_json::Error,
    },

    // ---- configuration ---------------------------------------------------------------------
    /// A model configuration is missing a key or holds a value napkin cannot use.
    #[error("{source_name}: {message}")]
    Config {
        /// Where the configuration came from (a file path or a preset name).
        source_name: String,
        /// What is wrong and what was expected.
        message: String,
    },

    /// A preset name that napkin does not know.
    #[error("unknown preset `{name}`; known presets: {known}")]
    UnknownPreset {
        /// The name asked for.
        name: String,
        /// The names napkin knows, comma separated.
        known: String,
    },

    // ---- checkpoints -----------------------------------------------------------------------
    /// A checkpoint file is malformed (bad header, truncated data, bad offsets).
    #[error("{path}: malformed checkpoint: {message}")]
    Checkpoint {
        /// The file at fault.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },

    /// A tensor the model needs is not in the checkpoint.
    #[error("{path}: missing tensor `{name}` (expected shape {expected:?})")]
    MissingTensor {
        /// The checkpoint (file or folder).
        path: PathBuf,
        /// The tensor name as the checkpoint format spells it.
        name: String,
        /// The shape the model expects.
        expected: Vec<usize>,
    },

    /// A tensor has a different shape than the configuration implies.
    #[error("{path}: tensor `{name}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        /// The checkpoint (file or folder).
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// The shape stored in the file.
        found: Vec<usize>,
        /// The shape the model expects.
        expected: Vec<usize>,
    },

    /// The checkpoint holds tensors the model does not know: usually a different architecture.
    #[error("{path}: unexpected tensor(s) not used by a Llama of this config: {names}")]
    UnexpectedTensors {
        /// The checkpoint (file or folder).
        path: PathBuf,
        /// The unexpected names, comma separated (at most a few).
        names: String,
    },

    /// A tensor is stored in a dtype napkin cannot load.
    #[error("{path}: tensor `{name}` has dtype {dtype}, expected one of F32, F16, BF16")]
    UnsupportedDtype {
        /// The checkpoint file.
        path: PathBuf,
        /// The tensor name.
        name: String,
        /// The dtype found.
        dtype: String,
    },

    // ---- training data ---------------------------------------------------------------------
    /// A line of a data file that is not a usable example.
    #[error("{path}:{line}: {message}")]
    Data {
        /// The data file.
        path: PathBuf,
        /// 1-based line number (0: the file as a whole).
        line: usize,
        /// What is wrong and what was expected.
        message: String,
    },

    // ---- running ---------------------------------------------------------------------------
    /// Input that does not fit the model (token ids out of range, empty input, too long).
    #[error("invalid input: {0}")]
    Input(String),

    /// The predicted peak memory of a run is more than the memory available to it.
    #[error(
        "napkin predicts a peak of {predicted_mib:.0} MiB for this training step (at `{at}`), but only {available_mib:.0} MiB available; try --checkpointing, --nf4 with --lora-r, a smaller --seq-len or --micro-batch, or --force to run anyway"
    )]
    NotEnoughMemory {
        /// Predicted peak, MiB.
        predicted_mib: f64,
        /// Available, MiB.
        available_mib: f64,
        /// Where the peak happens.
        at: String,
    },

    /// A device that is not compiled into this build or cannot be opened.
    #[error("device `{name}`: {message}")]
    Device {
        /// The device asked for.
        name: String,
        /// Why it cannot be used.
        message: String,
    },

    /// A collective engine (MPI, NCCL) that cannot be loaded, or a collective call that
    /// failed.
    #[error("collective engine {engine}: {message}")]
    Collective {
        /// The engine (`Open MPI`).
        engine: String,
        /// What went wrong.
        message: String,
    },

    /// A GPU had no memory for an allocation in the middle of the work (the pre-flight check
    /// holds the predicted peak against the driver's budget; this is what happens past it).
    #[error(
        "device `{device}` ran out of memory during {during}{}: {cause}; try --checkpointing, --nf4 with --lora-r, a smaller --seq-len or --micro-batch",
        requested_bytes.map(|b| format!(" asking for {b} bytes ({:.1} MiB)", b as f64 / 1_048_576.0)).unwrap_or_default()
    )]
    OutOfDeviceMemory {
        /// The device (`wgpu`, `cuda`).
        device: String,
        /// What napkin was doing (e.g. "training step 3").
        during: String,
        /// The allocation that failed, in bytes, where the backend names it.
        requested_bytes: Option<u64>,
        /// The backend's own words.
        cause: String,
    },

    // ---- napkin itself ---------------------------------------------------------------------
    /// An invariant of napkin's own code did not hold: a bug, not a problem with the input.
    #[error("internal error (a bug in napkin; please report it): {0}")]
    Internal(String),
}

/// The result type of napkin-core.
pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            error,
        }
    }

    /// A configuration error from a named source.
    pub fn config(source_name: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            source_name: source_name.into(),
            message: message.into(),
        }
    }

    /// A malformed-checkpoint error.
    pub fn checkpoint(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Error::Checkpoint {
            path: path.into(),
            message: message.into(),
        }
    }
}
