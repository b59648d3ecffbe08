//! The seeds' measured figures, predicted with the settings the seeds state (and those they
//! leave implicit, named here). Explained in docs/seed-figures.md.

use napkin_core::config::{LlamaConfig, LoraConfig};
use napkin_core::predict::pytorch::{ModuleMode, PyTorchSetup, Quant4bit, Stack, predict};

/// Seed 000: TinyLlama-1.1B-Chat, `BitsAndBytesConfig(load_in_4bit=True,
/// bnb_4bit_compute_dtype=torch.bfloat16)` (so fp4, bitsandbytes' default type, without double
/// quantization), `prepare_model_for_kbit_training`, LoRA r 16 α 32 dropout 0.05 on peft's
/// default targets, B 1 × T 1200, one forward and backward on CUDA: "Max memory allocated:
/// 6.42GB". Nothing calls `train()`: the model stays in from_pretrained's eval mode, so the
/// checkpointing `prepare_model_for_kbit_training` enabled never runs, while the adapters peft
/// added are new modules in train mode, so their dropout does; the embedding output is hooked
/// to need a gradient. The releases are those of spring 2024.
#[test]
fn seed_000_tinyllama_qlora_peak_is_predicted_within_five_percent() {
    let lora = LoraConfig {
        r: 16,
        alpha: 32.0,
        dropout: 0.05,
        targets: PyTorchSetup::peft_default_targets(),
        use_rslora: false,
    };
    let mut setup = PyTorchSetup::qlora_prepared(1, 1200, Quant4bit::Fp4, lora, true);
    setup.mode = ModuleMode::AsLoaded;
    setup.stack = Stack::SPRING_2024;
    let step = predict(&LlamaConfig::tiny_llama_1_1b(), &setup);
    let gb = step.peak_allocated() as f64 / 1e9;
    println!(
        "seed 000: weights {:.3} GB, alive after forward {:.3} GB, peak {gb:.3} GB (seed: 6.42 GB)",
        step.weights as f64 / 1e9,
        step.alive_after_forward as f64 / 1e9
    );
    assert!(
        (gb / 6.42 - 1.0).abs() <= 0.05,
        "{gb:.3} GB against 6.42 GB"
    );
}
