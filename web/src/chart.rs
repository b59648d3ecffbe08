//! Chart geometry, computed natively and tested: the per-layer stacked bars (predicted, with
//! the measured activations beside them), the step timeline as a polyline with its peak, and
//! the loss curve. The components only turn these numbers into SVG elements.

use napkin_core::memory::measure::Comparison;
use napkin_core::predict::inventory::LayerBytes;
use napkin_core::predict::timeline::Event;

/// The stacked kinds, bottom to top, with their CSS class.
pub const STACK_KINDS: [(&str, &str); 6] = [
    ("weights", "k-weights"),
    ("NF4 codes + scales", "k-quant"),
    ("LoRA adapters", "k-adapters"),
    ("gradients", "k-grads"),
    ("optimizer state", "k-optim"),
    ("activations (logits outside blocks)", "k-acts"),
];

/// One rectangle of a stacked bar, in chart units (y grows downwards, as in SVG).
#[derive(Debug, Clone, PartialEq)]
pub struct Rect {
    /// Left edge.
    pub x: f64,
    /// Top edge.
    pub y: f64,
    /// Width.
    pub width: f64,
    /// Height.
    pub height: f64,
    /// CSS class (the kind).
    pub class: &'static str,
    /// Bytes it stands for.
    pub bytes: u64,
}

/// One layer's bar: predicted segments, and the measured activations when known.
#[derive(Debug, Clone, PartialEq)]
pub struct Bar {
    /// `layers.3` or `outside blocks`.
    pub label: String,
    /// Predicted, stacked.
    pub segments: Vec<Rect>,
    /// The measured activations, drawn beside the predicted stack.
    pub measured: Option<Rect>,
}

/// The per-layer chart.
#[derive(Debug, Clone, PartialEq)]
pub struct StackedChart {
    /// Bars, left to right.
    pub bars: Vec<Bar>,
    /// The byte count at the top of the chart.
    pub max_bytes: u64,
}

fn kinds_of(row: &LayerBytes) -> [u64; 6] {
    [
        row.weights,
        row.quant,
        row.adapters,
        row.gradients,
        row.optimizer_state,
        row.activations,
    ]
}

/// Bars for `rows` in a `width` × `height` box. `measured` are the per-block comparisons of a
/// measurement (named `layers.N`, activations kept for the backward); each is drawn beside
/// the matching bar's activations segment, on the same base.
pub fn stacked_bars(
    rows: &[LayerBytes],
    measured: &[Comparison],
    width: f64,
    height: f64,
) -> StackedChart {
    let measured_of = |label: &str| measured.iter().find(|c| c.name == label);
    let max_bytes = rows
        .iter()
        .map(|r| {
            let kinds = kinds_of(r);
            let stack: u64 = kinds.iter().sum();
            let others: u64 = kinds[..5].iter().sum();
            stack.max(others + measured_of(&r.layer).map_or(0, |c| c.measured))
        })
        .max()
        .unwrap_or(0)
        .max(1);
    let slot = width / rows.len().max(1) as f64;
    let scale = height / max_bytes as f64;
    let bars = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let x = i as f64 * slot + slot * 0.1;
            let bar_width = slot * if measured.is_empty() { 0.8 } else { 0.5 };
            let mut top = height;
            let segments = kinds_of(row)
                .iter()
                .zip(STACK_KINDS)
                .filter(|(bytes, _)| **bytes > 0)
                .map(|(&bytes, (_, class))| {
                    let h = bytes as f64 * scale;
                    top -= h;
                    Rect {
                        x,
                        y: top,
                        width: bar_width,
                        height: h,
                        class,
                        bytes,
                    }
                })
                .collect();
            // The measured activations stand beside the predicted activations segment: on
            // the same base (the stack of the other kinds), so the two heights compare.
            let base = height - (kinds_of(row)[..5].iter().sum::<u64>() as f64 * scale);
            let measured = measured_of(&row.layer).map(|c| {
                let h = c.measured as f64 * scale;
                Rect {
                    x: x + bar_width + slot * 0.02,
                    y: base - h,
                    width: slot * 0.28,
                    height: h,
                    class: "k-measured",
                    bytes: c.measured,
                }
            });
            Bar {
                label: row.layer.clone(),
                segments,
                measured,
            }
        })
        .collect();
    StackedChart { bars, max_bytes }
}

/// A polyline's `points` attribute and where its highest point is.
#[derive(Debug, Clone, PartialEq)]
pub struct Polyline {
    /// `x,y x,y …`.
    pub points: String,
    /// The highest point (x, y) and its index.
    pub peak: Option<(f64, f64, usize)>,
    /// The largest value.
    pub max: f64,
}

/// `values` spread across `width`, scaled so the largest touches the top of `height`.
pub fn polyline(values: &[f64], width: f64, height: f64) -> Polyline {
    let max = values.iter().copied().fold(0.0, f64::max);
    let scale = if max > 0.0 { height / max } else { 0.0 };
    let step = width / (values.len().max(2) - 1) as f64;
    let mut peak: Option<(f64, f64, usize)> = None;
    let mut points = Vec::with_capacity(values.len());
    for (i, v) in values.iter().enumerate() {
        let (x, y) = (i as f64 * step, height - v * scale);
        if peak.is_none_or(|(_, py, _)| y < py) {
            peak = Some((x, y, i));
        }
        points.push(format!("{x:.1},{y:.1}"));
    }
    Polyline {
        points: points.join(" "),
        peak,
        max,
    }
}

/// The step timeline: bytes alive after each event.
pub fn timeline(events: &[Event], width: f64, height: f64) -> Polyline {
    let bytes: Vec<f64> = events.iter().map(|e| e.bytes as f64).collect();
    polyline(&bytes, width, height)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(layer: &str, weights: u64, activations: u64) -> LayerBytes {
        LayerBytes {
            layer: layer.into(),
            weights,
            quant: 0,
            adapters: 0,
            gradients: 0,
            optimizer_state: 0,
            activations,
        }
    }

    #[test]
    fn bars_stack_in_proportion_and_measured_sits_beside() {
        let rows = [row("layers.0", 300, 100), row("outside blocks", 100, 100)];
        // layers.0: 300 weights + 100 activations predicted, 120 activations measured.
        let measured = [Comparison {
            name: "layers.0".into(),
            predicted: 100,
            measured: 120,
            ratio: 1.2,
        }];
        let chart = stacked_bars(&rows, &measured, 200.0, 400.0);
        assert_eq!(chart.max_bytes, 420);
        let first = &chart.bars[0];
        assert_eq!(first.segments.len(), 2);
        let scale = 400.0 / 420.0;
        assert!((first.segments[0].height - 300.0 * scale).abs() < 1e-9);
        let m = first.measured.as_ref().unwrap();
        assert!((m.height - 120.0 * scale).abs() < 1e-9);
        // Same base as the activations segment; the taller measured bar reaches the top.
        let acts = &first.segments[1];
        assert!((m.y + m.height - (acts.y + acts.height)).abs() < 1e-9);
        assert!(m.y.abs() < 1e-9);
        assert!(m.x >= first.segments[0].x + first.segments[0].width);
        assert!(chart.bars[1].measured.is_none());
    }

    #[test]
    fn the_polyline_marks_its_peak() {
        let p = polyline(&[1.0, 4.0, 2.0], 100.0, 40.0);
        assert_eq!(p.points, "0.0,30.0 50.0,0.0 100.0,20.0");
        assert_eq!(p.peak, Some((50.0, 0.0, 1)));
        assert!(polyline(&[], 10.0, 10.0).peak.is_none());
    }
}
