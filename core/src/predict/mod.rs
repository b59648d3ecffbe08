//! The napkin-math predictor: pure arithmetic on configurations (no tensors, builds for wasm).
//!
//! - `units`: bytes in the units learners meet (1024-based as accelerate prints them; 10^9 GB).
//! - `rules`: the seed-style bytes-per-parameter rules (weights, gradients, optimizer state).
//! - `seed`: the seed-style formulas (bytes per parameter; activations after Korthikanti et al.).
//! - `accelerate`: the rows `accelerate estimate-memory` prints, from a config alone.
//! - `bert`: parameter counts of BERT configs (accelerate's documented example).
//! - `activations`: what the forward keeps for the backward, replayed op by op with burn's rules.
//! - `settings`: a step's settings as a user chooses them, turned into a scenario in one place.
//! - `inventory`: the named tensors of a training scenario, with kind, bytes and phases.
//! - `weights`: resident weight bytes (float, NF4 codes, NF4 scales).
//! - `preflight`: the predicted peak against the memory available, before a run starts.
//! - `workspace`: the short-lived buffers of the largest ops and burn's graph bookkeeping.
//! - `sharding`: per-GPU and host memory under DDP, FSDP and ZeRO, with CPU offload.
//! - `communication`: the collectives of DDP, FSDP and ZeRO per optimizer step, the bytes a rank
//!   sends and their time on NVLink, PCIe and Ethernet.
//! - `offload`: bytes offload keeps on the host and moves over PCIe / NVLink-C2C each step.
//! - `link`: what a step sends over the host link on a GPU when the weights are resident.
//! - `time`: FLOPs and bytes of a step, device presets, the roofline verdict and step time.
//! - `precision`: bytes per parameter of the mixed-precision recipes (fp32 … FP8, MS-AMP O1–O3).
//! - `recompute`: what checkpointing keeps through the step and what it recomputes per block.
//! - `report`: everything the predictor says about one step, one type for the CLI and the page.
//! - `row_layout`: how a device lays rows out (CUDA pads each row to an aligned pitch).
//! - `timeline`: one optimizer step replayed event by event; the peak and what makes it.
//! - `zero`: DeepSpeed's ZeRO-2 / ZeRO-3 model-state estimates.

pub mod accelerate;
pub mod activations;
pub mod bert;
pub mod communication;
pub mod inventory;
pub mod link;
pub mod offload;
pub mod precision;
pub mod preflight;
pub mod pytorch;
pub mod recompute;
pub mod report;
pub mod row_layout;
pub mod rules;
pub mod seed;
pub mod settings;
pub mod sharding;
pub mod time;
pub mod timeline;
pub mod units;
pub mod weights;
pub mod workspace;
pub mod zero;
