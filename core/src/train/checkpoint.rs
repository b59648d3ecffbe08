//! Training checkpoints that survive a hard stop.
//!
//! A checkpoint is a folder `checkpoint-NNNNNN` (the optimizer step) holding the trained
//! weights (the peft adapter, or the full model), `optimizer.safetensors` and
//! `trainer_state.json` (step, data position, and a checksum of every other file). It is
//! written in full under a temporary name, each file fsynced, and only then renamed into
//! place, so a folder with the final name is always complete. On resume the newest folder whose
//! checksums match is used; a damaged one is reported and skipped.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde::{Deserialize, Serialize};

use super::config::TrainConfig;
use super::eval::EvalState;
use super::optimizer::{StateData, StateTensor};
use crate::data::LoaderState;
use crate::error::{Error, Result};

/// The state file's name.
pub const STATE_FILE: &str = "trainer_state.json";
/// The optimizer state's file name.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The folder holding the weights of the step with the lowest held-out loss.
pub const BEST_DIR: &str = "best";

/// What `trainer_state.json` holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainerState {
    /// Optimizer steps completed.
    pub step: u64,
    /// Where the data loader stands.
    pub loader: LoaderState,
    /// The run's settings.
    pub config: TrainConfig,
    /// The f16 loss scale and the good steps since it last changed (1 and 0 otherwise).
    #[serde(default = "one")]
    pub loss_scale: f64,
    /// Steps without overflow since the loss scale last changed.
    #[serde(default)]
    pub good_steps: u64,
    /// The best held-out loss so far and the evaluations since (early stopping).
    #[serde(default)]
    pub eval: EvalState,
    /// FNV-1a 64 checksum of every other file in the folder, by name.
    pub checksums: BTreeMap<String, String>,
}

fn one() -> f64 {
    1.0
}

/// FNV-1a, 64 bits, as hex: enough to notice a torn or corrupted file.
pub fn checksum(bytes: &[u8]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

/// The folder name of the checkpoint after `step` optimizer steps.
pub fn checkpoint_name(step: u64) -> String {
    format!("checkpoint-{step:06}")
}

/// Serializes optimizer state tensors.
pub fn optimizer_bytes(state: &[StateTensor]) -> Result<Vec<u8>> {
    let encoded: Vec<(String, Dtype, Vec<u8>, usize)> = state
        .iter()
        .map(|t| match &t.data {
            StateData::F32(v) => (
                t.name.clone(),
                Dtype::F32,
                v.iter().flat_map(|x| x.to_le_bytes()).collect(),
                v.len(),
            ),
            StateData::U8(v) => (t.name.clone(), Dtype::U8, v.clone(), v.len()),
        })
        .collect();
    let views = encoded
        .iter()
        .map(|(name, dtype, bytes, n)| {
            TensorView::new(*dtype, vec![*n], bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::Internal(format!("optimizer state `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize(views, None)
        .map_err(|e| Error::Internal(format!("serializing optimizer state: {e}")))
}

/// Reads optimizer state tensors.
pub fn read_optimizer(path: &Path) -> Result<Vec<StateTensor>> {
    let bytes = fs::read(path).map_err(|e| Error::io(path, e))?;
    let file =
        SafeTensors::deserialize(&bytes).map_err(|e| Error::checkpoint(path, e.to_string()))?;
    let mut out = Vec::new();
    for (name, view) in file.tensors() {
        let data = match view.dtype() {
            Dtype::F32 => StateData::F32(
                view.data()
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
            ),
            Dtype::U8 => StateData::U8(view.data().to_vec()),
            other => {
                return Err(Error::checkpoint(
                    path,
                    format!("optimizer state `{name}` has dtype {other:?}, expected F32 or U8"),
                ));
            }
        };
        out.push(StateTensor { name, data });
    }
    Ok(out)
}

/// Writes a checkpoint folder crash-safely: `files` (name → bytes) plus the state file with
/// their checksums. Returns the folder.
pub fn write_checkpoint(
    out: &Path,
    state: TrainerState,
    files: &[(String, Vec<u8>)],
) -> Result<PathBuf> {
    let name = checkpoint_name(state.step);
    write_folder(out, &name, state, files)
}

/// Writes `out/name` crash-safely (see [`write_checkpoint`]); an older folder of that name is
/// replaced only once the new one is complete.
pub fn write_folder(
    out: &Path,
    name: &str,
    mut state: TrainerState,
    files: &[(String, Vec<u8>)],
) -> Result<PathBuf> {
    let final_dir = out.join(name);
    let tmp_dir = out.join(format!(".{name}.tmp"));
    let _ = fs::remove_dir_all(&tmp_dir);
    fs::create_dir_all(&tmp_dir).map_err(|e| Error::io(&tmp_dir, e))?;
    let write = |name: &str, bytes: &[u8]| -> Result<()> {
        use std::io::Write;
        let path = tmp_dir.join(name);
        let mut file = fs::File::create(&path).map_err(|e| Error::io(&path, e))?;
        file.write_all(bytes).map_err(|e| Error::io(&path, e))?;
        file.sync_all().map_err(|e| Error::io(&path, e))
    };
    state.checksums.clear();
    for (name, bytes) in files {
        write(name, bytes)?;
        state.checksums.insert(name.clone(), checksum(bytes));
    }
    let json = serde_json::to_vec_pretty(&state)
        .map_err(|e| Error::Internal(format!("serializing the trainer state: {e}")))?;
    write(STATE_FILE, &json)?;
    if final_dir.exists() {
        fs::remove_dir_all(&final_dir).map_err(|e| Error::io(&final_dir, e))?;
    }
    fs::rename(&tmp_dir, &final_dir).map_err(|e| Error::io(&final_dir, e))?;
    if let Ok(d) = fs::File::open(out) {
        let _ = d.sync_all();
    }
    Ok(final_dir)
}

/// Reads and verifies a checkpoint folder's state: every listed file must match its checksum.
pub fn read_checkpoint(dir: &Path) -> Result<TrainerState> {
    let path = dir.join(STATE_FILE);
    let text = fs::read(&path).map_err(|e| Error::io(&path, e))?;
    let state: TrainerState =
        serde_json::from_slice(&text).map_err(|e| Error::checkpoint(&path, e.to_string()))?;
    for (name, want) in &state.checksums {
        let file = dir.join(name);
        let bytes = fs::read(&file).map_err(|e| Error::io(&file, e))?;
        let got = checksum(&bytes);
        if &got != want {
            return Err(Error::checkpoint(
                &file,
                format!(
                    "checksum {got} does not match {want} recorded at save: the file is damaged"
                ),
            ));
        }
    }
    Ok(state)
}

/// The checkpoint folders under `out`, newest first.
pub fn list_checkpoints(out: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = fs::read_dir(out)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let step = name.strip_prefix("checkpoint-")?.parse().ok()?;
            p.is_dir().then_some((step, p))
        })
        .collect();
    found.sort_by_key(|entry| std::cmp::Reverse(entry.0));
    found
}

/// The newest intact checkpoint under `out`, with the damaged ones skipped on the way (and
/// why).
pub fn newest_intact(out: &Path) -> (Option<(PathBuf, TrainerState)>, Vec<Error>) {
    let mut skipped = Vec::new();
    for (_, dir) in list_checkpoints(out) {
        match read_checkpoint(&dir) {
            Ok(state) => return (Some((dir, state)), skipped),
            Err(e) => skipped.push(e),
        }
    }
    (None, skipped)
}

/// Removes all but the newest `keep` checkpoints.
pub fn prune(out: &Path, keep: usize) -> Result<()> {
    for (_, dir) in list_checkpoints(out).into_iter().skip(keep.max(1)) {
        fs::remove_dir_all(&dir).map_err(|e| Error::io(&dir, e))?;
    }
    Ok(())
}
