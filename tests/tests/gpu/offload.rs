//! Optimizer offload on a GPU backend: `napkin measure`'s engine runs the same steps with the
//! optimizer on the device and offloaded: the optimizer state leaves the device pool and
//! appears on the host heap next to the f32 master weights, in the predicted amounts, and the
//! link carries the predicted bytes.

use napkin_core::config::{LlamaConfig, LoraConfig};
use napkin_core::device::cpu;
use napkin_core::measure::{MachineProbe, MeasurementReport, measure, random_model};
use napkin_core::memory::meter::MeterMethod;
use napkin_core::predict::inventory::{Kind, Scenario, inventory, totals_by_kind};

use super::{ONE_AT_A_TIME, wgpu_device};

/// A small probe: the roofline is not what this test checks.
const PROBE: MachineProbe = MachineProbe {
    gemm_n: 128,
    copy_bytes: 1 << 20,
};

fn run(s: &Scenario, offload: bool) -> MeasurementReport {
    let device = wgpu_device();
    let train = device.clone().autodiff();
    let host = offload.then(cpu);
    measure(s, &device, 2, PROBE, host, || {
        train.seed(7);
        random_model(s, &train)
    })
    .expect("measured steps")
}

fn kind<'a>(r: &'a MeasurementReport, prefix: &str) -> &'a napkin_core::measure::Comparison {
    r.kinds
        .iter()
        .find(|c| c.name.starts_with(prefix))
        .unwrap_or_else(|| panic!("no `{prefix}` row in {:?}", r.kinds))
}

/// Full fine-tuning and LoRA of the small config: 8 bytes of AdamW state per trainable value
/// on the device without offload; with offload none of it, and 12 bytes per value (state +
/// master) on the host; 4 bytes per value each way on the link per step.
#[test]
fn offload_moves_the_optimizer_state_from_the_device_to_the_host() {
    let _lock = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    for lora in [None, Some(LoraConfig::default())] {
        let s = Scenario {
            lora,
            ..Scenario::new(LlamaConfig::small(), 1, 64)
        };
        let what = if s.lora.is_some() {
            "LoRA"
        } else {
            "full fine-tuning"
        };
        // 8 bytes per trainable value, and the state map's own bookkeeping.
        let state = totals_by_kind(&inventory(&s))[&Kind::OptimizerState];
        let trainable = s.trainable_parameters();
        assert!(state >= 8 * trainable);

        let plain = run(&s, false);
        assert_eq!(plain.method, MeterMethod::DevicePool);
        let on_device = kind(&plain, "optimizer state");
        eprintln!("{what}, optimizer on the device: {on_device:?}");
        assert!(
            (on_device.ratio - 1.0).abs() < 0.05,
            "{what}: the device holds {} B of optimizer state, predicted {state}",
            on_device.measured
        );
        assert!(plain.offload.is_none());

        let offloaded = run(&s, true);
        let left = kind(&offloaded, "optimizer state on the device");
        let o = offloaded.offload.as_ref().expect("the offload rows");
        eprintln!(
            "{what}, offloaded: {left:?}\n  {:?}\n  {:?}\n  {:?}",
            o.host, o.to_host, o.to_device
        );
        assert_eq!(left.predicted, 0);
        assert!(
            left.measured < state / 50,
            "{what}: {} B of optimizer state stayed on the device ({state} B offloaded)",
            left.measured
        );
        assert_eq!(o.host.predicted, state + 4 * trainable);
        assert!(
            (o.host.ratio - 1.0).abs() < 0.05,
            "{what}: the host holds {} B, predicted {}",
            o.host.measured,
            o.host.predicted
        );
        assert_eq!(
            (o.to_host.predicted, o.to_device.predicted),
            (4 * trainable, 4 * trainable)
        );
        assert_eq!(
            (o.to_host.measured, o.to_device.measured),
            (4 * trainable, 4 * trainable)
        );
        // The trade: what left the device is what the step no longer holds between steps (the
        // device's share of the state: its map's bookkeeping is host memory either way).
        let freed = on_device.measured.saturating_sub(left.measured) as f64;
        assert!(
            (freed / on_device.predicted as f64 - 1.0).abs() < 0.05,
            "{what}: {freed} B freed on the device"
        );
    }
}
