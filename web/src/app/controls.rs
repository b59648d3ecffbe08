//! A control for every trick: model, LoRA (r, α), NF4 and double quantization, gradient
//! checkpointing, accumulation, micro-batch, sequence length, the objective (SFT, DPO, ORPO),
//! optimizer, GPUs and sharding, optimizer offload, and the target device.

use napkin_core::config::{AttentionKind, LlamaConfig, LoraTarget, ObjectiveKind, OptimizerKind};
use napkin_core::predict::sharding::Strategy;
use napkin_core::predict::time::device_presets;
use web_sys::{HtmlInputElement, HtmlSelectElement};
use yew::prelude::*;

use crate::page::{Accepts, PageAction};
use crate::state::{Action, NF4_BLOCK_SIZES, Precision, SandboxState};
use crate::training::TRAINABLE_PRESETS;

#[derive(Properties, PartialEq)]
pub struct ControlsProps {
    pub state: SandboxState,
    /// The last refused value, in words.
    pub error: Option<String>,
    pub dispatch: Callback<PageAction>,
}

fn on_check(dispatch: &Callback<PageAction>, make: fn(bool) -> Action) -> Callback<Event> {
    let dispatch = dispatch.clone();
    Callback::from(move |e: Event| {
        let input: HtmlInputElement = e.target_unchecked_into();
        dispatch.emit(PageAction::Sandbox(make(input.checked())));
    })
}

/// A number field's change: the action when the text is a number it accepts; otherwise the
/// refusal shown under the controls (the prediction keeps the last accepted value).
fn on_number(
    dispatch: &Callback<PageAction>,
    field: &'static str,
    accepts: Accepts,
    make: fn(f64) -> Action,
) -> Callback<Event> {
    let dispatch = dispatch.clone();
    Callback::from(move |e: Event| {
        let input: HtmlInputElement = e.target_unchecked_into();
        dispatch.emit(match accepts.read(field, &input.value()) {
            Ok(v) => PageAction::Sandbox(make(v)),
            Err(refusal) => PageAction::ControlRefused(refusal),
        });
    })
}

fn on_select(
    dispatch: &Callback<PageAction>,
    make: fn(String) -> Option<Action>,
) -> Callback<Event> {
    let dispatch = dispatch.clone();
    Callback::from(move |e: Event| {
        let select: HtmlSelectElement = e.target_unchecked_into();
        if let Some(action) = make(select.value()) {
            dispatch.emit(PageAction::Sandbox(action));
        }
    })
}

fn checkbox(id: &str, label: &str, checked: bool, onchange: Callback<Event>) -> Html {
    html! {
        <label class="check" for={id.to_string()}>
            <input type="checkbox" id={id.to_string()} {checked} {onchange} />
            { label }
        </label>
    }
}

fn number(id: &str, label: &str, value: String, min: &str, onchange: Callback<Event>) -> Html {
    html! {
        <label class="number" for={id.to_string()}>
            { label }
            <input type="number" id={id.to_string()} min={min.to_string()} {value} {onchange} />
        </label>
    }
}

fn option(value: &str, label: &str, selected: bool) -> Html {
    html! { <option value={value.to_string()} {selected}>{ label }</option> }
}

const STRATEGIES: [(Strategy, &str, &str); 8] = [
    (Strategy::Ddp, "ddp", "DDP (full replica)"),
    (Strategy::NoShard, "none", "FSDP NO_SHARD"),
    (Strategy::Zero1, "zero1", "ZeRO-1 (optimizer)"),
    (Strategy::Zero2, "zero2", "ZeRO-2 (+ gradients)"),
    (Strategy::ShardGradOp, "grad-op", "FSDP SHARD_GRAD_OP"),
    (Strategy::Zero3, "zero3", "ZeRO-3 (+ parameters)"),
    (Strategy::FullShard, "full", "FSDP FULL_SHARD"),
    (Strategy::HybridShard, "hybrid", "FSDP HYBRID_SHARD"),
];

const OBJECTIVES: [(ObjectiveKind, &str, &str); 3] = [
    (
        ObjectiveKind::Sft,
        "sft",
        "SFT (the replies' cross-entropy)",
    ),
    (
        ObjectiveKind::Dpo,
        "dpo",
        "DPO (pairs; a reference forward, adapters off)",
    ),
    (ObjectiveKind::Orpo, "orpo", "ORPO (pairs; no reference)"),
];

const OPTIMIZERS: [(OptimizerKind, &str, &str); 3] = [
    (OptimizerKind::AdamW, "adamw", "AdamW (8 B/param of state)"),
    (
        OptimizerKind::AdamW8bit,
        "adamw8bit",
        "8-bit AdamW (2 B/param)",
    ),
    (OptimizerKind::Sgd, "sgd", "SGD + momentum (4 B/param)"),
];

#[function_component(Controls)]
pub fn controls(props: &ControlsProps) -> Html {
    let s = &props.state;
    let d = &props.dispatch;
    let presets: Vec<String> = LlamaConfig::presets()
        .into_iter()
        .map(|(n, _)| n.to_string())
        .chain(s.custom.as_ref().map(|(n, _)| n.clone()))
        .collect();
    html! {
        <section id="controls" class="panel controls">
            <h2>{ "Setup" }</h2>
            <label for="preset">{ "Model" }
                <select id="preset" onchange={on_select(d, |v| Some(Action::SelectPreset(v)))}>
                    { for presets.iter().map(|n| {
                        let tag = if TRAINABLE_PRESETS.contains(&n.as_str()) { " (trains here)" } else { "" };
                        option(n, &format!("{n}{tag}"), *n == s.preset)
                    }) }
                </select>
            </label>
            <fieldset>
                <legend>{ "LoRA" }</legend>
                { checkbox("lora", "LoRA adapters (freeze the base)", s.lora, on_check(d, Action::SetLora)) }
                { number("rank", "rank r", s.rank.to_string(), "1", on_number(d, "rank r", Accepts::WholeFrom(1), |v| Action::SetRank(v as usize))) }
                { number("alpha", "α", s.alpha.to_string(), "0", on_number(d, "α", Accepts::From(0.0), Action::SetAlpha)) }
                { checkbox("dora", "DoRA (a trained magnitude per output row)", s.dora, on_check(d, Action::SetDora)) }
                <div class="targets">
                    { for LoraTarget::ALL.into_iter().map(|t| {
                        let d = d.clone();
                        let onchange = Callback::from(move |e: Event| {
                            let input: HtmlInputElement = e.target_unchecked_into();
                            d.emit(PageAction::Sandbox(Action::SetLoraTarget(t, input.checked())));
                        });
                        let id = format!("target-{}", t.module_name());
                        checkbox(&id, t.module_name(), s.lora_targets.contains(&t), onchange)
                    }) }
                </div>
            </fieldset>
            <fieldset>
                <legend>{ "Quantization" }</legend>
                { checkbox("nf4", "NF4 4-bit base (QLoRA)", s.nf4, on_check(d, Action::SetNf4)) }
                <label for="nf4-block">{ "block size " }
                    <select id="nf4-block" onchange={on_select(d, |v| v.parse().ok().map(Action::SetNf4Block))}>
                        { for NF4_BLOCK_SIZES.iter().map(|b| option(&b.to_string(), &b.to_string(), *b == s.nf4_block)) }
                    </select>
                </label>
                { checkbox("dq", "double quantization of the scales", s.double_quant, on_check(d, Action::SetDoubleQuant)) }
            </fieldset>
            <fieldset>
                <legend>{ "Activations and batch" }</legend>
                { checkbox("ckpt", "gradient checkpointing (per block)", s.checkpointing, on_check(d, Action::SetCheckpointing)) }
                { checkbox("efficient-attention", "memory-efficient attention (tiled, no T×T probabilities)", s.attention == AttentionKind::Efficient, on_check(d, |on| Action::SetAttention(if on { AttentionKind::Efficient } else { AttentionKind::Eager }))) }
                { number("micro", "micro-batch B", s.micro_batch.to_string(), "1", on_number(d, "micro-batch B", Accepts::WholeFrom(1), |v| Action::SetMicroBatch(v as usize))) }
                { number("seq", "sequence length T", s.seq_len.to_string(), "2", on_number(d, "sequence length T", Accepts::WholeFrom(2), |v| Action::SetSeqLen(v as usize))) }
                { number("accum", "gradient accumulation steps", s.accumulation.to_string(), "1", on_number(d, "gradient accumulation steps", Accepts::WholeFrom(1), |v| Action::SetAccumulation(v as usize))) }
            </fieldset>
            <fieldset>
                <legend>{ "Objective" }</legend>
                <select id="objective" aria-label="objective" onchange={on_select(d, |v| OBJECTIVES.iter().find(|o| o.1 == v).map(|o| Action::SetObjective(o.0)))}>
                    { for OBJECTIVES.iter().map(|(k, v, l)| option(v, l, *k == s.objective)) }
                </select>
                if s.objective.is_preference() {
                    <p class="note">{ "B counts pairs and T each sequence: a pair is one row of its chosen and rejected sequences (up to 2T)." }</p>
                }
            </fieldset>
            <fieldset>
                <legend>{ "Optimizer" }</legend>
                <select id="optimizer" aria-label="optimizer" onchange={on_select(d, |v| OPTIMIZERS.iter().find(|o| o.1 == v).map(|o| Action::SetOptimizer(o.0)))}>
                    { for OPTIMIZERS.iter().map(|(k, v, l)| option(v, l, *k == s.optimizer)) }
                </select>
                { checkbox("offload", "offload optimizer state to CPU", s.offload_optimizer, on_check(d, Action::SetOffloadOptimizer)) }
            </fieldset>
            <fieldset>
                <legend>{ "Compare" }</legend>
                { checkbox("compare-pytorch", "the same step in PyTorch (transformers + peft + bitsandbytes on CUDA; supervised steps, and TRL's DPO over an adapter)", s.compare_pytorch, on_check(d, Action::SetComparePyTorch)) }
            </fieldset>
            <fieldset>
                <legend>{ "Hardware" }</legend>
                <label for="device">{ "target GPU" }
                    <select id="device" onchange={on_select(d, |v| Some(Action::SelectDevice(v)))}>
                        { for device_presets().iter().map(|p| option(&p.id, &p.name, p.id == s.device)) }
                    </select>
                </label>
                { number("gpus", "GPUs", s.gpus.to_string(), "1", on_number(d, "GPUs", Accepts::WholeFrom(1), |v| Action::SetGpus(v as u64))) }
                <label for="strategy">{ "sharding" }
                    <select id="strategy" onchange={on_select(d, |v| STRATEGIES.iter().find(|st| st.1 == v).map(|st| Action::SetStrategy(st.0)))}>
                        { for STRATEGIES.iter().map(|(k, v, l)| option(v, l, *k == s.strategy)) }
                    </select>
                </label>
            </fieldset>
            <fieldset>
                <legend>{ "Precision" }</legend>
                <select id="precision" aria-label="precision" onchange={on_select(d, |v| match v.as_str() {
                    "f32" => Some(Action::SetPrecision(Precision::F32)),
                    "bf16" => Some(Action::SetPrecision(Precision::Bf16Autocast)),
                    _ => None,
                })}>
                    { option("f32", "f32", s.precision == Precision::F32) }
                    { option("bf16", "bf16 autocast (f32 master; a LoRA base stored in bf16)", s.precision == Precision::Bf16Autocast) }
                </select>
                <p class="note">{ "Training in the page runs in f32." }</p>
            </fieldset>
            <div aria-live="polite">
                if let Some(error) = &props.error {
                    <p id="controls-error" class="error" role="alert">{ error.clone() }</p>
                }
            </div>
        </section>
    }
}
