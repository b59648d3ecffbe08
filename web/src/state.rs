//! The sandbox's state as plain data, the actions a learner can take, a reducer, and the view
//! model the charts draw — all computed by napkin-core's predictor, none of it copied. The
//! components (`app/`) only render a `View` and dispatch `Action`s; this file compiles and is
//! tested natively.

use napkin_core::config::{
    AttentionKind, LlamaConfig, LoraConfig, LoraTarget, Nf4Config, ObjectiveKind, OptimizerKind,
};
use napkin_core::exercises::SandboxSettings;
use napkin_core::predict::inventory::Scenario;
use napkin_core::predict::precision::{PrecisionRow, precision_table};
use napkin_core::predict::pytorch::device_process::{
    self, DeviceProcess, HOPPER_CUBLAS_WORKSPACE, Workspaces,
};
use napkin_core::predict::pytorch::{
    Attention, Checkpointing, Method, ModuleMode, PyTorchSetup, PyTorchStep, Quant4bit, Stack,
    TorchDevice, TorchDtype, TrlDpo,
};
use napkin_core::predict::report::{Report, ReportOptions, report};
use napkin_core::predict::settings::StepSettings;
use napkin_core::predict::sharding::{Offload, Strategy};
use napkin_core::predict::time::{DevicePreset, RooflineTime, device_preset, roofline};
use serde::{Deserialize, Serialize};

/// Largest LoRA rank the controls offer.
pub const MAX_RANK: usize = 256;

/// NF4 block sizes the controls offer (bitsandbytes' choices; 64 is QLoRA's).
pub const NF4_BLOCK_SIZES: [usize; 4] = [32, 64, 128, 256];

/// How the step computes and stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    /// Everything f32.
    #[default]
    F32,
    /// bf16 autocast of the linear layers with f32 master weights; with LoRA the frozen base
    /// is stored in bf16 (`napkin train --dtype bf16`).
    Bf16Autocast,
}

/// Everything the controls set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SandboxState {
    /// Model preset name (`napkin_core::config::LlamaConfig::presets`), or the name of a
    /// dropped-in `config.json` held in `custom`.
    pub preset: String,
    /// A model from a dropped-in Hugging Face `config.json`: its name and config.
    pub custom: Option<(String, LlamaConfig)>,
    /// LoRA on/off and its rank.
    pub lora: bool,
    /// LoRA rank.
    pub rank: usize,
    /// LoRA α (the adapter output is scaled by α/r; no effect on memory).
    pub alpha: f64,
    /// DoRA: a trainable magnitude per output row of each adapter.
    #[serde(default)]
    pub dora: bool,
    /// The adapted linear layers.
    pub lora_targets: Vec<LoraTarget>,
    /// NF4 block size (weights per absmax scale).
    pub nf4_block: usize,
    /// f32 or bf16 autocast.
    pub precision: Precision,
    /// NF4 base.
    pub nf4: bool,
    /// NF4 double quantization.
    pub double_quant: bool,
    /// Gradient checkpointing.
    pub checkpointing: bool,
    /// Eager or memory-efficient (tiled) attention.
    pub attention: AttentionKind,
    /// Micro-batches per optimizer step.
    pub accumulation: usize,
    /// What the step minimises: supervised, or DPO / ORPO on preference pairs.
    #[serde(default)]
    pub objective: ObjectiveKind,
    /// B (with a preference objective: pairs).
    pub micro_batch: usize,
    /// T (with a preference objective: each sequence of a pair).
    pub seq_len: usize,
    /// The optimizer.
    pub optimizer: OptimizerKind,
    /// GPUs (1: no data parallelism).
    pub gpus: u64,
    /// How state is spread over the GPUs.
    pub strategy: Strategy,
    /// Offload the optimizer state to the CPU.
    pub offload_optimizer: bool,
    /// The target device preset id.
    pub device: String,
    /// Show the same step as a Hugging Face run on CUDA would allocate (the PyTorch profile).
    pub compare_pytorch: bool,
}

impl Default for SandboxState {
    fn default() -> Self {
        SandboxState {
            preset: "smollm2-135m".into(),
            custom: None,
            lora: true,
            rank: 16,
            alpha: 32.0,
            dora: false,
            lora_targets: LoraTarget::ALL.to_vec(),
            nf4_block: 64,
            precision: Precision::F32,
            nf4: false,
            double_quant: false,
            checkpointing: false,
            attention: AttentionKind::Eager,
            accumulation: 1,
            objective: ObjectiveKind::Sft,
            micro_batch: 1,
            seq_len: 256,
            optimizer: OptimizerKind::AdamW,
            gpus: 1,
            strategy: Strategy::Ddp,
            offload_optimizer: false,
            device: "t4".into(),
            compare_pytorch: false,
        }
    }
}

/// What a learner can do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Pick a model preset (unknown names are ignored).
    SelectPreset(String),
    /// LoRA on or off.
    SetLora(bool),
    /// LoRA rank (clamped to 1..=MAX_RANK).
    SetRank(usize),
    /// LoRA α (finite and positive; others ignored).
    SetAlpha(f64),
    /// DoRA on the adapters (turns LoRA on).
    SetDora(bool),
    /// Adapt one linear layer or not (at least one stays adapted).
    SetLoraTarget(LoraTarget, bool),
    /// NF4 block size (one of [`NF4_BLOCK_SIZES`]; others ignored).
    SetNf4Block(usize),
    /// f32 or bf16 autocast.
    SetPrecision(Precision),
    /// A dropped-in `config.json`: its file name and config; becomes the selected model.
    UseConfig(String, Box<LlamaConfig>),
    /// NF4 on or off (off also turns double quantization off).
    SetNf4(bool),
    /// Double quantization (turns NF4 on).
    SetDoubleQuant(bool),
    /// Gradient checkpointing.
    SetCheckpointing(bool),
    /// Eager or memory-efficient attention.
    SetAttention(AttentionKind),
    /// Accumulation steps (at least 1).
    SetAccumulation(usize),
    /// The objective (DPO turns LoRA on: its reference is the base with the adapters off).
    SetObjective(ObjectiveKind),
    /// Micro-batch (at least 1).
    SetMicroBatch(usize),
    /// Sequence length (2 … the model's maximum).
    SetSeqLen(usize),
    /// Optimizer.
    SetOptimizer(OptimizerKind),
    /// GPUs (at least 1).
    SetGpus(u64),
    /// Sharding strategy.
    SetStrategy(Strategy),
    /// Offload the optimizer state.
    SetOffloadOptimizer(bool),
    /// Show the PyTorch profile beside napkin's prediction.
    SetComparePyTorch(bool),
    /// Target device preset (unknown ids are ignored).
    SelectDevice(String),
    /// An exercise's scenario, after a correct answer.
    LoadExercise(SandboxSettings),
}

/// The next state.
pub fn reduce(state: &SandboxState, action: Action) -> SandboxState {
    let mut s = state.clone();
    match action {
        Action::SelectPreset(name) => {
            let custom = s.custom.as_ref().filter(|(n, _)| *n == name);
            if let Some(config) = custom
                .map(|(_, c)| c.clone())
                .or_else(|| LlamaConfig::preset(&name).ok())
            {
                s.preset = if custom.is_some() {
                    name
                } else {
                    name.to_ascii_lowercase()
                };
                s.seq_len = s.seq_len.min(config.max_position_embeddings);
            }
        }
        Action::UseConfig(name, config) => {
            s.custom = Some((name.clone(), *config));
            return reduce(&s, Action::SelectPreset(name));
        }
        Action::SetLoraTarget(target, on) => {
            let mut targets: Vec<LoraTarget> = LoraTarget::ALL
                .into_iter()
                .filter(|t| {
                    if *t == target {
                        on
                    } else {
                        s.lora_targets.contains(t)
                    }
                })
                .collect();
            if targets.is_empty() {
                targets.push(target);
            }
            s.lora_targets = targets;
        }
        Action::SetNf4Block(b) => {
            if NF4_BLOCK_SIZES.contains(&b) {
                s.nf4_block = b;
            }
        }
        Action::SetPrecision(p) => s.precision = p,
        Action::SetAlpha(a) => {
            if a.is_finite() && a > 0.0 {
                s.alpha = a;
            }
        }
        Action::SetLora(on) => {
            s.lora = on;
            // Without adapters DPO's reference would be a second copy of every weight, which
            // napkin does not keep (the trainer refuses it): back to supervised.
            if !on && s.objective.has_reference() {
                s.objective = ObjectiveKind::Sft;
            }
        }
        Action::SetDora(on) => {
            s.dora = on;
            s.lora |= on;
        }
        Action::SetObjective(objective) => {
            s.objective = objective;
            s.lora |= objective.has_reference();
        }
        Action::SetRank(r) => s.rank = r.clamp(1, MAX_RANK),
        Action::SetNf4(on) => {
            s.nf4 = on;
            s.double_quant &= on;
        }
        Action::SetDoubleQuant(on) => {
            s.double_quant = on;
            s.nf4 |= on;
        }
        Action::SetCheckpointing(on) => s.checkpointing = on,
        Action::SetAttention(kind) => s.attention = kind,
        Action::SetAccumulation(k) => s.accumulation = k.max(1),
        Action::SetMicroBatch(b) => s.micro_batch = b.max(1),
        Action::SetSeqLen(t) => {
            let max = s.config().max_position_embeddings;
            s.seq_len = t.clamp(2, max.max(2));
        }
        Action::SetOptimizer(o) => s.optimizer = o,
        Action::SetGpus(n) => s.gpus = n.max(1),
        Action::SetStrategy(st) => s.strategy = st,
        Action::SetOffloadOptimizer(on) => s.offload_optimizer = on,
        Action::SetComparePyTorch(on) => s.compare_pytorch = on,
        Action::SelectDevice(id) => {
            if device_preset(&id).is_some() {
                s.device = id;
            }
        }
        Action::LoadExercise(x) => {
            let mut next = SandboxState::default();
            for action in [
                Action::SelectPreset(x.preset),
                Action::SetLora(x.lora_r > 0),
                Action::SetRank(x.lora_r.max(1)),
                Action::SetNf4(x.nf4),
                Action::SetDoubleQuant(x.double_quant),
                Action::SetCheckpointing(x.checkpointing),
                Action::SetAttention(x.attention),
                Action::SetMicroBatch(x.micro_batch),
                Action::SetSeqLen(x.seq_len),
                Action::SetAccumulation(x.accumulation),
                Action::SetObjective(x.objective),
                Action::SetGpus(x.gpus),
            ] {
                next = reduce(&next, action);
            }
            if let Some(device) = x.device {
                next = reduce(&next, Action::SelectDevice(device));
            }
            s = next;
        }
    }
    s
}

/// What the page draws for a state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct View {
    /// The predictor's report of the step: the one `napkin estimate` prints.
    pub report: Report,
    /// The target device.
    pub device: DevicePreset,
    /// The step on the target device.
    pub time: RooflineTime,
    /// Whether the peak fits the target device's memory (per GPU when sharded).
    pub fits: bool,
    /// Model state of full fine-tuning under each mixed-precision recipe (per GPU).
    pub precision_table: Vec<PrecisionRow>,
    /// The same step as transformers + peft + bitsandbytes on CUDA spend it, when asked for.
    pub pytorch: Option<PyTorchStep>,
    /// A fresh CUDA process that loads the model and runs that step, through PyTorch's caching
    /// allocator (asked for with the PyTorch profile).
    pub pytorch_process: Option<DeviceProcess>,
}

impl SandboxState {
    /// The selected model: the dropped-in config or a preset (SmolLM2-135M if neither).
    pub fn config(&self) -> LlamaConfig {
        match &self.custom {
            Some((name, config)) if *name == self.preset => config.clone(),
            _ => LlamaConfig::preset(&self.preset).unwrap_or_else(|_| LlamaConfig::smollm2_135m()),
        }
    }

    /// The step's settings as the controls hold them.
    pub fn settings(&self) -> StepSettings {
        StepSettings {
            micro_batch: self.micro_batch,
            seq_len: self.seq_len,
            objective: self.objective,
            lora_r: if self.lora { self.rank } else { 0 },
            lora_alpha: Some(self.alpha),
            dora: self.lora && self.dora,
            lora_targets: self.lora_targets.clone(),
            nf4: self.nf4.then_some(Nf4Config {
                block_size: self.nf4_block,
                double_quant: self.double_quant,
            }),
            optimizer: self.optimizer,
            checkpointing: self.checkpointing,
            accumulation: self.accumulation,
            attention: self.attention,
            // bf16 autocast also stores a LoRA run's frozen float base in bf16
            // (`Scenario::half_base`).
            half_compute: self.precision == Precision::Bf16Autocast,
            ..StepSettings::default()
        }
    }

    /// The predictor's scenario. The controls accept only what `StepSettings::check` does
    /// (whole numbers from 1, an even NF4 block), so the settings are built unchecked.
    pub fn scenario(&self) -> Scenario {
        self.settings().build(self.config())
    }

    /// The step as a Hugging Face user would run it on CUDA with `model.train()`: peft LoRA on
    /// the same targets (no dropout, peft's default), QLoRA through
    /// `prepare_model_for_kbit_training` (f32 hidden states, bf16 4-bit compute), bf16 when
    /// the sandbox autocasts, sdpa for the efficient attention, HF's reentrant checkpointing;
    /// for DPO, TRL's `DPOTrainer` with its defaults.
    pub fn pytorch_setup(&self) -> PyTorchSetup {
        let lora = self.scenario().lora;
        let method = match (self.lora, self.nf4) {
            (_, true) => Method::QLora {
                quant: Quant4bit::Nf4,
                double_quant: self.double_quant,
                block_size: self.nf4_block as u64,
            },
            (true, false) => Method::Lora,
            (false, false) => Method::Full,
        };
        let dtype = match (self.nf4, self.precision) {
            (false, Precision::Bf16Autocast) => TorchDtype::Bf16,
            _ => TorchDtype::F32,
        };
        let dpo = (self.objective == ObjectiveKind::Dpo).then_some(TrlDpo {
            precompute_ref: false,
            prompt_tokens: 0,
        });
        PyTorchSetup {
            // TRL's DPO micro-batch of B pairs is 2B rows of T tokens.
            batch: if dpo.is_some() {
                2 * self.micro_batch
            } else {
                self.micro_batch
            },
            seq: self.seq_len,
            method,
            lora: lora.map(|l| LoraConfig { dropout: 0.0, ..l }),
            dtype,
            compute_dtype: TorchDtype::Bf16,
            mode: ModuleMode::Train,
            checkpointing: self.checkpointing.then_some(Checkpointing::Reentrant),
            input_require_grads: PyTorchSetup::input_hooked(
                self.lora,
                self.nf4,
                self.checkpointing.then_some(Checkpointing::Reentrant),
            ),
            attention: match self.attention {
                AttentionKind::Eager => Attention::Eager,
                AttentionKind::Efficient => Attention::Sdpa,
            },
            device: TorchDevice::Cuda,
            stack: Stack::MEASURED,
            dpo,
        }
    }

    /// Whether the PyTorch profile is drawn: on request, for a supervised step (transformers'
    /// step) or DPO (always over adapters here: TRL's `DPOTrainer`, every position scored, the
    /// reference forward in the step); not for ORPO, which it does not replay.
    pub fn pytorch_shown(&self) -> bool {
        self.compare_pytorch && self.objective != ObjectiveKind::Orpo
    }

    /// Everything the charts need.
    pub fn view(&self) -> View {
        let scenario = self.scenario();
        let device = device_preset(&self.device)
            .unwrap_or_else(|| napkin_core::predict::time::device_presets().remove(0));
        let offload = Offload {
            parameters: false,
            optimizer: self.offload_optimizer,
        };
        // One GPU with offload: nothing to shard, but the state leaves the device.
        let strategy = (self.gpus > 1 || self.offload_optimizer).then_some(if self.gpus > 1 {
            self.strategy
        } else {
            Strategy::NoShard
        });
        let report = report(
            &scenario,
            &ReportOptions {
                gpus: self.gpus,
                nodes: 1,
                strategy,
                offload: self.offload_optimizer.then_some(offload),
            },
        );
        let tokens = scenario.tokens() as f64 * scenario.accumulation as f64;
        let half = self.precision == Precision::Bf16Autocast;
        let time = roofline(&report.time.work, tokens, &device, half);
        let per_gpu = report
            .sharding
            .as_ref()
            .map_or(report.step_peak.bytes, |m| m.gpu_peak);
        View {
            precision_table: precision_table(scenario.config.num_parameters(), self.gpus),
            fits: per_gpu as f64 <= device.memory,
            time,
            device,
            pytorch: self.pytorch_shown().then(|| {
                napkin_core::predict::pytorch::predict(&scenario.config, &self.pytorch_setup())
            }),
            pytorch_process: self.pytorch_shown().then(|| {
                device_process::replay(
                    &scenario.config,
                    &self.pytorch_setup(),
                    HOPPER_CUBLAS_WORKSPACE,
                    Workspaces::AtFirstProduct,
                )
            }),
            report,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The controls bound every value, so the settings `scenario` builds unchecked always pass
    /// the checks the CLI and the trainer apply: try the extremes each control sends.
    #[test]
    fn every_state_the_controls_reach_passes_the_settings_checks() {
        let extremes = [
            Action::SetRank(0),
            Action::SetRank(usize::MAX),
            Action::SetMicroBatch(0),
            Action::SetAccumulation(0),
            Action::SetSeqLen(0),
            Action::SetSeqLen(usize::MAX),
            Action::SetNf4Block(3),
            Action::SetNf4(true),
            Action::SetLora(true),
            Action::SetLora(false),
            Action::SetObjective(ObjectiveKind::Dpo),
            Action::SetLora(false),
            Action::SetObjective(ObjectiveKind::Orpo),
            Action::SetLora(false),
            Action::SetDora(true),
            Action::SetLora(false),
        ];
        let mut s = SandboxState::default();
        for action in extremes {
            s = reduce(&s, action);
            let settings = s.settings();
            assert!(settings.check().is_ok(), "{settings:?}");
        }
    }

    /// DPO needs the adapters (its reference is the base with them off): choosing it turns
    /// LoRA on, and turning LoRA off goes back to supervised; ORPO keeps either. A preference
    /// step runs pair rows of twice the sequence, DPO's with a reference forward of its own.
    /// The PyTorch profile replays TRL's DPO step (two rows of T per pair), not ORPO.
    #[test]
    fn the_objective_control_keeps_dpo_on_adapters() {
        let s = reduce(&SandboxState::default(), Action::SetLora(false));
        let dpo = reduce(&s, Action::SetObjective(ObjectiveKind::Dpo));
        assert!(dpo.lora);
        assert_eq!(dpo.scenario().seq_len, 2 * dpo.seq_len);
        let off = reduce(&dpo, Action::SetLora(false));
        assert_eq!((off.objective, off.lora), (ObjectiveKind::Sft, false));
        let orpo = reduce(&s, Action::SetObjective(ObjectiveKind::Orpo));
        assert!(!orpo.lora && orpo.settings().check().is_ok());
        let compare = reduce(&dpo, Action::SetComparePyTorch(true));
        assert!(compare.view().pytorch.is_some());
        let torch = compare.pytorch_setup();
        assert_eq!((torch.batch, torch.seq), (2 * dpo.micro_batch, dpo.seq_len));
        assert!(torch.dpo.is_some_and(|d| !d.precompute_ref));
        let orpo_compare = reduce(&orpo, Action::SetComparePyTorch(true));
        assert!(orpo_compare.view().pytorch.is_none());
        let labels: Vec<String> = dpo
            .view()
            .report
            .timeline
            .into_iter()
            .map(|e| e.label)
            .collect();
        assert!(labels.iter().any(|l| l == "reference.logits"), "{labels:?}");
    }

    /// DoRA adds each adapted linear's magnitude (trained: its gradient and AdamW state too)
    /// and kept squares, and its kept `[n, out]` sums; turning it on turns LoRA on.
    #[test]
    fn dora_adds_magnitudes_and_their_activations() {
        use napkin_core::predict::inventory::Kind;
        let lora = SandboxState::default();
        let dora = reduce(
            &reduce(&lora, Action::SetLora(false)),
            Action::SetDora(true),
        );
        assert!(dora.lora && dora.scenario().lora.is_some_and(|l| l.use_dora));
        let (a, b) = (lora.view().report, dora.view().report);
        let kind = |r: &Report, k: Kind| r.inventory_bytes_by_kind.get(&k).copied().unwrap_or(0);
        let c = lora.config();
        let outs: u64 = c
            .block_linears()
            .iter()
            .map(|&(_, out, _)| out as u64)
            .sum::<u64>()
            * c.num_hidden_layers as u64;
        // Magnitude and squares: 8 bytes an output row, beside the adapters.
        assert_eq!(
            kind(&b, Kind::Adapters) - kind(&a, Kind::Adapters),
            8 * outs
        );
        assert!(kind(&b, Kind::SavedActivations) > kind(&a, Kind::SavedActivations));
    }

    /// The PyTorch comparison appears only when asked for; QLoRA with checkpointing is far
    /// below plain LoRA there too, and the 4-bit weights are a quarter of f32's or less.
    #[test]
    fn the_pytorch_profile_is_shown_on_request() {
        let s = SandboxState::default();
        assert!(s.view().pytorch.is_none());
        let s = reduce(&s, Action::SetComparePyTorch(true));
        let lora = s.view().pytorch.expect("asked for");
        let s = reduce(
            &reduce(&s, Action::SetNf4(true)),
            Action::SetCheckpointing(true),
        );
        let view = s.view();
        let qlora = view.pytorch.expect("asked for");
        assert!(qlora.peak_allocated() < lora.peak_allocated());
        assert!(qlora.alive_after_forward * 2 < lora.alive_after_forward);
        // The whole process holds at least the step's peak.
        let process = view.pytorch_process.expect("asked for");
        assert!(process.max_allocated >= qlora.peak_allocated());
    }

    fn total_weights(v: &View) -> u64 {
        v.report.per_layer.iter().map(|l| l.weights + l.quant).sum()
    }

    #[test]
    fn nf4_lowers_the_weights_and_checkpointing_the_peak() {
        let s = SandboxState::default();
        let plain = s.view();
        let nf4 = reduce(&s, Action::SetNf4(true)).view();
        assert!(total_weights(&nf4) * 2 < total_weights(&plain));
        let ckpt = reduce(&s, Action::SetCheckpointing(true)).view();
        // SmolLM2, T = 256: the step's own bytes fall from ~690 to ~160 MiB above the state.
        assert!(ckpt.report.step_peak.bytes + (400 << 20) < plain.report.step_peak.bytes);
        // Turning NF4 off also turns double quantization off; DQ turns NF4 on.
        let dq = reduce(&s, Action::SetDoubleQuant(true));
        assert!(dq.nf4);
        assert!(!reduce(&dq, Action::SetNf4(false)).double_quant);
    }

    /// Checkpointing moves a block's saved activations from kept to recomputed: each block
    /// then keeps its input (T·d f32) and recomputes exactly what it kept without
    /// checkpointing (the inventory is the same; how long the tensors live differs).
    #[test]
    fn checkpointing_shows_the_recomputed_activations_apart_from_the_kept() {
        let s = SandboxState::default();
        let plain = s.view();
        let ckpt = reduce(&s, Action::SetCheckpointing(true)).view();
        let blocks = plain.report.per_layer.len() - 1;
        for (p, c) in plain
            .report
            .per_layer
            .iter()
            .zip(&ckpt.report.per_layer)
            .take(blocks)
        {
            assert_eq!(p.recomputed, 0, "{}", p.layer);
            assert_eq!(c.activations, 256 * 576 * 4, "{}", c.layer);
            assert_eq!(c.recomputed, p.activations, "{}", c.layer);
        }
        assert!(plain.report.activations.recomputed_block.is_none());
        let block = ckpt.report.activations.recomputed_block.expect("a block");
        assert_eq!(block.layer, 29);
    }

    /// At T = 2048 the eager attention's kept probabilities dominate SmolLM2's activations;
    /// the efficient attention removes them (3 score-sized copies per block, 30 blocks).
    #[test]
    fn efficient_attention_removes_the_t_squared_activations() {
        let s = reduce(&SandboxState::default(), Action::SetSeqLen(2048));
        let activations = |v: &View| {
            v.report
                .per_layer
                .iter()
                .map(|l| l.activations)
                .sum::<u64>()
        };
        let eager = s.view();
        let efficient = reduce(&s, Action::SetAttention(AttentionKind::Efficient)).view();
        let t = 2048u64;
        let probabilities = 30 * 3 * 9 * t * t * 4;
        // Less the efficient op's own output and log-sum-exps (about 1 % here).
        let removed = activations(&eager) - activations(&efficient);
        assert!(
            removed > probabilities * 98 / 100 && removed < probabilities,
            "{removed} vs {probabilities}"
        );
        let peak_drop = eager.report.step_peak.bytes - efficient.report.step_peak.bytes;
        assert!(
            peak_drop > probabilities * 95 / 100,
            "{peak_drop} vs {probabilities}"
        );
    }

    /// Optimizer offload on one GPU takes the AdamW state off the device and costs two copies
    /// of the trainable parameters over the host link per step.
    #[test]
    fn optimizer_offload_moves_the_state_to_the_host() {
        let s = reduce(&SandboxState::default(), Action::SetLora(false));
        let plain = s.view();
        let offloaded = reduce(&s, Action::SetOffloadOptimizer(true)).view();
        let state: u64 = plain
            .report
            .per_layer
            .iter()
            .map(|l| l.optimizer_state)
            .sum();
        let on_device = offloaded
            .report
            .sharding
            .as_ref()
            .expect("offload on one GPU")
            .gpu_peak;
        assert_eq!(plain.report.step_peak.bytes - on_device, state);
        let transfer = offloaded.report.offload.expect("the offload traffic");
        let p = 4 * s.scenario().trainable_parameters();
        assert_eq!(
            (
                transfer.to_host_bytes_per_step,
                transfer.to_device_bytes_per_step
            ),
            (p, p)
        );
        assert_eq!(transfer.links.len(), 5);
        assert!(plain.report.offload.is_none());
    }

    #[test]
    fn controls_are_clamped_and_unknown_names_ignored() {
        let s = SandboxState::default();
        assert_eq!(reduce(&s, Action::SetRank(0)).rank, 1);
        assert_eq!(reduce(&s, Action::SetRank(100_000)).rank, MAX_RANK);
        assert_eq!(reduce(&s, Action::SetSeqLen(1)).seq_len, 2);
        assert_eq!(reduce(&s, Action::SetSeqLen(1 << 30)).seq_len, 8192);
        assert_eq!(reduce(&s, Action::SelectPreset("gpt-9".into())), s);
        assert_eq!(reduce(&s, Action::SelectDevice("abacus".into())), s);
        assert_eq!(reduce(&s, Action::SetAccumulation(0)).accumulation, 1);
    }

    /// Full fine-tuning of Llama-2-7B does not fit a T4; QLoRA with checkpointing does.
    #[test]
    fn the_fit_verdict_follows_the_tricks() {
        let mut s = reduce(
            &SandboxState::default(),
            Action::SelectPreset("llama-2-7b".into()),
        );
        s = reduce(&s, Action::SetLora(false));
        assert!(!s.view().fits);
        for a in [
            Action::SetLora(true),
            Action::SetDoubleQuant(true),
            Action::SetCheckpointing(true),
        ] {
            s = reduce(&s, a);
        }
        let v = s.view();
        assert!(v.fits, "peak {}", v.report.step_peak.bytes);
    }

    /// An exercise's scenario lands in the controls.
    #[test]
    fn an_exercise_presets_the_sandbox() {
        let inst = napkin_core::exercises::instance("will-it-fit", 3).unwrap();
        let settings = inst.sandbox.clone().unwrap();
        let s = reduce(
            &SandboxState::default(),
            Action::LoadExercise(settings.clone()),
        );
        assert_eq!(s.preset, settings.preset);
        assert_eq!(s.lora, settings.lora_r > 0);
        assert_eq!(s.nf4, settings.nf4);
        assert_eq!(s.seq_len, settings.seq_len);
        assert_eq!(Some(s.device.clone()), settings.device);
        // The verdict the exercise expects is the one the sandbox shows.
        let expected_fits = inst.expected.value == 0.0;
        assert_eq!(s.view().fits, expected_fits);
    }

    /// A dropped-in config becomes the model; picking a preset and coming back works.
    #[test]
    fn a_dropped_config_is_selectable() {
        let mut c = LlamaConfig::smollm2_135m();
        c.num_hidden_layers = 2;
        let s = reduce(
            &SandboxState::default(),
            Action::UseConfig("My-Model/config.json".into(), Box::new(c.clone())),
        );
        assert_eq!(s.preset, "My-Model/config.json");
        assert_eq!(s.view().report.per_layer.len(), 3);
        let s = reduce(&s, Action::SelectPreset("tiny-smol".into()));
        assert_eq!(s.config(), LlamaConfig::tiny_smol());
        let s = reduce(&s, Action::SelectPreset("My-Model/config.json".into()));
        assert_eq!(s.config(), c);
        assert_eq!(reduce(&s, Action::SetAlpha(f64::NAN)).alpha, s.alpha);
    }

    /// Fewer LoRA targets, bigger NF4 blocks and a bf16 base each lower what they should.
    #[test]
    fn targets_block_size_and_precision_reach_the_prediction() {
        let adapters = |v: &View| v.report.per_layer.iter().map(|l| l.adapters).sum::<u64>();
        let quant = |v: &View| v.report.per_layer.iter().map(|l| l.quant).sum::<u64>();
        let weights = |v: &View| v.report.per_layer.iter().map(|l| l.weights).sum::<u64>();
        let s = SandboxState::default();
        let all = s.view();
        let mut qv = s.clone();
        for t in [
            LoraTarget::OProj,
            LoraTarget::GateProj,
            LoraTarget::UpProj,
            LoraTarget::DownProj,
            LoraTarget::KProj,
        ] {
            qv = reduce(&qv, Action::SetLoraTarget(t, false));
        }
        assert_eq!(qv.lora_targets, vec![LoraTarget::QProj, LoraTarget::VProj]);
        assert!(adapters(&qv.view()) * 3 < adapters(&all));
        // The last target cannot be removed.
        let q = reduce(&qv, Action::SetLoraTarget(LoraTarget::VProj, false));
        assert_eq!(
            reduce(&q, Action::SetLoraTarget(LoraTarget::QProj, false)).lora_targets,
            vec![LoraTarget::QProj]
        );

        let nf4 = reduce(&s, Action::SetNf4(true));
        let big = reduce(&nf4, Action::SetNf4Block(256));
        // One f32 scale per block: 4× fewer scales with blocks of 256 than of 64.
        assert!(quant(&big.view()) < quant(&nf4.view()));
        assert_eq!(reduce(&nf4, Action::SetNf4Block(100)).nf4_block, 64);

        let bf16 = reduce(&s, Action::SetPrecision(Precision::Bf16Autocast)).view();
        // A block's frozen linears in 2 bytes instead of 4 (its norms stay f32).
        let ratio =
            bf16.report.per_layer[0].weights as f64 / all.report.per_layer[0].weights as f64;
        assert!((0.49..0.51).contains(&ratio), "{ratio}");
        assert!(weights(&bf16) < weights(&all));
        assert!(bf16.time.step_seconds < all.time.step_seconds);
    }

    #[test]
    fn many_gpus_shard_the_state() {
        let mut s = reduce(&SandboxState::default(), Action::SetLora(false));
        let one = s.view();
        s = reduce(&s, Action::SetGpus(8));
        s = reduce(&s, Action::SetStrategy(Strategy::FullShard));
        let eight = s.view();
        let sharded = eight.report.sharding.expect("sharded");
        assert!(sharded.gpu_peak < one.report.step_peak.bytes);
        // What the GPUs send: full sharding gathers every parameter twice a micro-batch, so
        // each GPU sends more than the whole model; one GPU sends nothing.
        let sent = eight
            .report
            .communication
            .expect("communication")
            .sent_per_rank;
        assert!(sent > 2 * 7 * one.report.per_layer.iter().map(|l| l.weights).sum::<u64>() / 8);
        assert!(
            one.report
                .communication
                .is_none_or(|c| c.sent_per_rank == 0)
        );
    }
}
