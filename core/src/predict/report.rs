//! Everything the predictor says about one training step, as one typed value: `napkin
//! estimate` prints it as text or writes it as JSON (the `inventory` object of `--json`), and
//! the page renders it beside its target device.

use std::collections::BTreeMap;

use serde::Serialize;

use super::communication::{Communication, communication};
use super::inventory::{Entry, Kind, LayerBytes, Scenario, inventory, per_layer, totals_by_kind};
use super::offload::{host_links, host_transfer};
use super::recompute::{ActivationSplit, activation_split};
use super::seed::{SeedEstimate, scenario_seed_estimate};
use super::sharding::{Offload, ShardedMemory, Strategy, sharded_memory};
use super::time::{RooflineTime, StepWork, device_presets, roofline, step_work};
use super::timeline::{Event, StepPeak, step_timeline};
use crate::predict::rules::Precision;

/// Where the step runs beyond one device: how many GPUs, how the model state is split, and
/// what leaves the device.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ReportOptions {
    /// GPUs per node (1: one device).
    pub gpus: u64,
    /// Nodes.
    pub nodes: u64,
    /// How the model state is split over the GPUs (None: no per-GPU figures).
    pub strategy: Option<Strategy>,
    /// What lives in host memory instead of on the device (None: nothing).
    pub offload: Option<Offload>,
}

/// The predictor's answer for one training step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The settings, in the CLI's words.
    pub scenario: ScenarioSummary,
    /// Every named tensor of the step: kind, bytes, when it is alive.
    pub entries: Vec<Entry>,
    /// The entries summed by kind, but for [`Kind::Workspace`]: its largest entry, since the
    /// step's short-lived buffers exist one at a time (their sum over the blocks is no amount
    /// of memory the step ever holds).
    pub inventory_bytes_by_kind: BTreeMap<Kind, u64>,
    /// The saved activations and checkpoint inputs split by how long they live: kept through
    /// the step, one recomputed block, their sum over the blocks. `inventory_bytes_by_kind`
    /// keeps the inventory's sums, recomputed tensors included.
    pub activations: ActivationSplit,
    /// Bytes per block (the last row: outside the blocks) by the kinds a learner compares.
    pub per_layer: Vec<LayerBytes>,
    /// One step, event by event.
    pub timeline: Vec<Event>,
    /// The step's peak and what makes it.
    pub step_peak: StepPeak,
    /// What the seed formulas say (f32; they know neither NF4 nor the engine).
    pub seed_formulas: SeedEstimate,
    /// FLOPs and bytes of the step, and its roofline on every device preset.
    pub time: StepTime,
    /// Per-GPU and per-node memory, when a strategy was given.
    pub sharding: Option<ShardedMemory>,
    /// The collectives between the GPUs per optimizer step, when a strategy was given.
    pub communication: Option<Communication>,
    /// One GPU with offload: device and host bytes, the link traffic of each optimizer step.
    pub offload: Option<OffloadReport>,
}

/// The settings of a report's scenario.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ScenarioSummary {
    /// LoRA rank (0: full fine-tuning).
    pub lora_r: usize,
    /// NF4 base.
    pub nf4: bool,
    /// NF4's scales quantized too.
    pub double_quant: bool,
    /// What the step minimises (`dpo` and `orpo` run pairs).
    pub objective: crate::config::ObjectiveKind,
    /// B (a preference objective: pairs).
    pub micro_batch: usize,
    /// T (a preference objective: a pair row, both sequences).
    pub seq_len: usize,
    /// Block-level gradient checkpointing.
    pub checkpointing: bool,
    /// Parameters the optimizer updates.
    pub trainable_parameters: u64,
}

/// The step's work and its time on each device preset.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepTime {
    /// FLOPs and bytes moved.
    pub work: StepWork,
    /// FLOPs in all.
    pub flops: f64,
    /// The roofline on every preset, and whether the step's peak fits its memory.
    pub devices: Vec<DeviceVerdict>,
}

/// One device preset's verdict.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DeviceVerdict {
    /// The preset's id.
    pub id: String,
    /// Its memory, bytes.
    pub memory_bytes: f64,
    /// The step's peak fits it (one device, no sharding).
    pub fits: bool,
    /// The step's time there.
    pub roofline: RooflineTime,
}

/// One GPU with offload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OffloadReport {
    /// The device's peak with offload.
    pub device_peak_bytes: u64,
    /// The device's peak without it.
    pub device_peak_bytes_without_offload: u64,
    /// Bytes kept in host memory.
    pub host_bytes: u64,
    /// Device → host bytes per optimizer step.
    pub to_host_bytes_per_step: u64,
    /// Host → device bytes per optimizer step.
    pub to_device_bytes_per_step: u64,
    /// The transfers' time on each host link.
    pub links: Vec<LinkTime>,
}

/// Offload's transfers on one host link.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LinkTime {
    /// The link's id (`pcie4`).
    pub id: &'static str,
    /// What it is.
    pub name: &'static str,
    /// Seconds per optimizer step when nothing overlaps them.
    pub seconds_per_step: f64,
}

/// The predictor's report of `s`, on one device or as `options` spreads it.
pub fn report(s: &Scenario, options: &ReportOptions) -> Report {
    let entries = inventory(s);
    let timeline = step_timeline(s);
    let work = step_work(s);
    let tokens = (s.micro_batch * s.seq_len * s.accumulation.max(1)) as f64;
    let peak = timeline.peak.bytes;
    let devices = device_presets()
        .into_iter()
        .map(|d| DeviceVerdict {
            roofline: roofline(&work, tokens, &d, s.half_compute),
            memory_bytes: d.memory,
            fits: peak as f64 <= d.memory,
            id: d.id,
        })
        .collect();
    let offload = options.offload.unwrap_or_default();
    let sharding = options.strategy.map(|strategy| {
        sharded_memory(
            s,
            strategy,
            options.gpus.max(1),
            options.nodes.max(1),
            offload,
        )
    });
    let communication = options
        .strategy
        .map(|strategy| communication(s, strategy, options.gpus.max(1), options.nodes.max(1)));
    let offload = options
        .offload
        .map(|offload| offload_report(s, &entries, offload, peak));
    Report {
        scenario: ScenarioSummary {
            lora_r: s.lora.as_ref().map_or(0, |l| l.r),
            nf4: s.nf4.is_some(),
            double_quant: s.nf4.is_some_and(|n| n.double_quant),
            objective: s.objective,
            micro_batch: s.micro_batch,
            seq_len: s.seq_len,
            checkpointing: s.checkpointing,
            trainable_parameters: s.trainable_parameters(),
        },
        inventory_bytes_by_kind: by_kind_at_once(&entries),
        activations: activation_split(&entries),
        per_layer: per_layer(&entries, s.config.num_hidden_layers),
        seed_formulas: scenario_seed_estimate(s, Precision::Fp32),
        time: StepTime {
            flops: work.flops(),
            work,
            devices,
        },
        step_peak: timeline.peak,
        timeline: timeline.events,
        entries,
        sharding,
        communication,
        offload,
    }
}

/// One GPU with `offload`: the device's peak, the host's bytes and the link traffic.
fn offload_report(s: &Scenario, entries: &[Entry], offload: Offload, peak: u64) -> OffloadReport {
    let one_gpu = sharded_memory(s, Strategy::NoShard, 1, 1, offload);
    let transfer = host_transfer(s, entries, offload);
    OffloadReport {
        device_peak_bytes: one_gpu.gpu_peak,
        device_peak_bytes_without_offload: peak,
        host_bytes: transfer.host_bytes,
        to_host_bytes_per_step: transfer.to_host,
        to_device_bytes_per_step: transfer.to_device,
        links: host_links()
            .iter()
            .map(|l| LinkTime {
                id: l.id,
                name: l.name,
                seconds_per_step: transfer.seconds(l),
            })
            .collect(),
    }
}

/// [`totals_by_kind`] with the workspaces as the largest one (what is alive at once).
fn by_kind_at_once(entries: &[Entry]) -> BTreeMap<Kind, u64> {
    let mut totals = totals_by_kind(entries);
    let largest = entries
        .iter()
        .filter(|e| e.kind == Kind::Workspace)
        .map(|e| e.bytes)
        .max();
    if let Some(largest) = largest {
        totals.insert(Kind::Workspace, largest);
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{LlamaConfig, LoraConfig, Nf4Config};

    /// The workspace kind is the largest short-lived buffer — what the step's peak can hold of
    /// them — not their sum over the blocks (Llama-2-7B QLoRA: 188 MB, where the sum is 8.6 GB
    /// and more than the whole step's peak).
    #[test]
    fn the_workspace_kind_is_what_exists_at_once() {
        let s = Scenario {
            lora: Some(LoraConfig::default()),
            nf4: Some(Nf4Config::default()),
            ..Scenario::new(LlamaConfig::llama2_7b(), 1, 256)
        };
        let r = report(&s, &ReportOptions::default());
        let workspaces: Vec<u64> = r
            .entries
            .iter()
            .filter(|e| e.kind == Kind::Workspace)
            .map(|e| e.bytes)
            .collect();
        let shown = r.inventory_bytes_by_kind[&Kind::Workspace];
        assert_eq!(Some(shown), workspaces.iter().copied().max());
        assert!(workspaces.iter().sum::<u64>() > r.step_peak.bytes);
        assert!(shown < r.step_peak.bytes);
    }
}
