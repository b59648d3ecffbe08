//! The headline: the step's predicted peak and what makes it, the fit verdict on the target
//! GPU (per GPU when sharded), the roofline time with its verdict, and the seed formulas
//! beside the exact inventory.

use std::rc::Rc;

use napkin_core::config::ObjectiveKind;
use napkin_core::predict::pytorch::device_process::HOPPER_CUBLAS_WORKSPACE;
use napkin_core::predict::time::Bound;
use yew::prelude::*;

use super::format::{bytes, flops, seconds};
use crate::state::{SandboxState, View};

#[derive(Properties, PartialEq)]
pub struct SummaryProps {
    pub state: SandboxState,
    pub view: Rc<View>,
}

#[function_component(Summary)]
pub fn summary(props: &SummaryProps) -> Html {
    let v = &props.view;
    let s = &props.state;
    let r = &v.report;
    let per_gpu = r
        .sharding
        .as_ref()
        .map_or(r.step_peak.bytes, |m| m.gpu_peak);
    let (verdict, class) = if v.fits {
        ("fits", "fits yes")
    } else {
        ("does not fit", "fits no")
    };
    let bound = match v.time.bound {
        Bound::Compute => "compute-bound",
        Bound::Memory => "memory-bound",
    };
    let sum = |f: fn(&napkin_core::predict::inventory::LayerBytes) -> u64| -> f64 {
        r.per_layer.iter().map(f).sum::<u64>() as f64
    };
    let recomputed = r.activations.recomputed_block.map(|b| {
        (
            format!("recomputed, one block (layers.{})", b.layer),
            r.seed_formulas.one_layer_activations,
            b.bytes as f64,
        )
    });
    let rows = [
        (
            "weights".to_string(),
            r.seed_formulas.weights,
            sum(|l| l.weights + l.quant + l.adapters),
        ),
        (
            "gradients".to_string(),
            r.seed_formulas.gradients,
            sum(|l| l.gradients),
        ),
        (
            "optimizer state".to_string(),
            r.seed_formulas.optimizer,
            sum(|l| l.optimizer_state),
        ),
        (
            if recomputed.is_some() {
                "activations kept (block inputs)".to_string()
            } else {
                "activations".to_string()
            },
            r.seed_formulas.activations,
            sum(|l| l.activations),
        ),
    ]
    .into_iter()
    .chain(recomputed)
    .collect::<Vec<_>>();
    html! {
        <section class="panel summary">
            <h2>{ "Prediction" }</h2>
            <p id="peak" class="big">
                { "Step peak " }<strong>{ bytes(r.step_peak.bytes as f64) }</strong>
                { format!(" at {} ({:?})", r.step_peak.label, r.step_peak.phase) }
            </p>
            <p id="fits" class={class}>
                { format!("{} per GPU on the {}: {verdict} ({} available)", bytes(per_gpu as f64), v.device.name, bytes(v.device.memory)) }
            </p>
            if let Some(m) = &r.sharding {
                <p class="note">{ format!("{} GPUs, {:?}: {} per GPU, {} per node in CPU memory", m.gpus, m.strategy, bytes(m.gpu_peak as f64), bytes(m.cpu_per_node as f64)) }</p>
            }
            if let Some(c) = r.communication.as_ref().filter(|c| c.gpus > 1) {
                <p id="communication" class="note">{ format!("Each optimizer step the GPUs exchange {}; each GPU sends {} (ring algorithms), nothing overlapped: {}.",
                    c.calls.iter().map(|call| format!("{} {} of {} ×{}", call.what, call.op.name(), bytes(call.payload as f64), call.calls)).collect::<Vec<_>>().join(", "),
                    bytes(c.sent_per_rank as f64),
                    c.links.iter().map(|l| format!("{} {}", l.name, seconds(l.seconds_per_step))).collect::<Vec<_>>().join(", ")) }</p>
            }
            if let Some(o) = &r.offload {
                <p id="offload" class="note">{ format!("Optimizer offload: {} of state in host memory; each step sends {} of gradients to the host and {} of updated weights back: {}.",
                    bytes(o.host_bytes as f64), bytes(o.to_host_bytes_per_step as f64), bytes(o.to_device_bytes_per_step as f64),
                    o.links.iter().map(|l| format!("{} {}", l.name, seconds(l.seconds_per_step))).collect::<Vec<_>>().join(", ")) }</p>
            }
            <p id="time">
                { format!("Step time on the {}: at least {} ({bound}: {} at {:.1} TFLOP/s, {} moved); {:.0} tokens/s at best",
                    v.device.name, seconds(v.time.step_seconds), flops(r.time.flops), v.time.peak_flops / 1e12,
                    bytes(r.time.work.bytes_moved), v.time.tokens_per_second) }
            </p>
            if let (Some(p), Some(process)) = (&v.pytorch, &v.pytorch_process) {
                <p id="pytorch" class="note">
                    { format!("In PyTorch ({}{}): weights {}, {} saved for the backward, a forward-and-backward peak of {} allocated (torch.cuda.max_memory_allocated; AdamW's state comes on top once it steps). A fresh process that loads the model and runs this step: {} allocated at most, {} reserved by the caching allocator (max_memory_reserved, what nvidia-smi shows less the CUDA context; cuBLAS {} MiB a handle, as on Hopper). napkin's engine: {} at its step peak.",
                        if s.objective == ObjectiveKind::Dpo {
                            "TRL's DPOTrainer on CUDA: chosen and rejected rows, its fused LM head, the reference forward with the adapter disabled"
                        } else {
                            "a Hugging Face step on CUDA, model.train()"
                        },
                        if s.checkpointing { ", reentrant checkpointing" } else { "" },
                        bytes(p.weights as f64),
                        bytes((p.saved_per_layer.iter().sum::<u64>() + p.saved_outside) as f64),
                        bytes(p.peak_allocated() as f64),
                        bytes(process.max_allocated as f64),
                        bytes(process.max_reserved as f64),
                        HOPPER_CUBLAS_WORKSPACE >> 20,
                        bytes(r.step_peak.bytes as f64)) }
                </p>
            }
            <p class="note">{ format!("Largest at the peak: {}", r.step_peak.largest.iter().take(3).map(|(n, b)| format!("{n} {}", bytes(*b as f64))).collect::<Vec<_>>().join(", ")) }</p>
            <table id="seed-vs-inventory">
                <thead><tr><th>{ "" }</th><th>{ "seed formula" }</th><th>{ "napkin inventory" }</th></tr></thead>
                <tbody>
                    { for rows.iter().map(|(name, seed, exact)| html! {
                        <tr><td>{ name.clone() }</td><td>{ bytes(*seed) }</td><td>{ bytes(*exact) }</td></tr>
                    }) }
                </tbody>
            </table>
            <p class="note">
                { format!("Seed formulas: weights 4 B/param, gradients and optimizer state per trainable parameter, activations L·s·b·h·(34 + 5·a·s/h)·2 (Korthikanti, f32){}. The inventory counts every tensor the engine keeps{}.",
                    if s.checkpointing { "; when recomputing, the block inputs L·2·s·b·h·2 beside what is kept, and one layer's s·b·h·(34 + 5·a·s/h)·2 beside one recomputed block" } else { "" },
                    if s.nf4 { ", with the NF4 base at ~0.5 B/param" } else { "" }) }
            </p>
            <table id="precision-table">
                <caption>{ format!("Full fine-tuning model state per GPU by precision recipe (AdamW{})", if s.gpus > 1 { ", MS-AMP O3 sharded" } else { "" }) }</caption>
                <thead><tr><th>{ "recipe" }</th><th>{ "bytes/param" }</th><th>{ "model state" }</th><th>{ "" }</th></tr></thead>
                <tbody>
                    { for v.precision_table.iter().map(|row| html! {
                        <tr>
                            <td>{ row.name }</td>
                            <td>{ format!("{}", row.per_parameter.total()) }</td>
                            <td>{ bytes(row.model_state_bytes) }</td>
                            <td>{ if row.predicted_only { "predicted only" } else { "runs in napkin" } }</td>
                        </tr>
                    }) }
                </tbody>
            </table>
        </section>
    }
}
