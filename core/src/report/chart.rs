//! Chart geometry, one implementation for the browser sandbox and `napkin report`: the
//! per-layer stacked bars (predicted, with the measured activations beside them), the step
//! timeline as a polyline with its peak, and line charts with axes (loss, held-out loss,
//! learning rate, … per step). The page's components and the report's SVG writer only turn
//! these numbers into elements.

use crate::measure::Comparison;
use crate::predict::inventory::LayerBytes;
use crate::predict::timeline::Event;

/// The stacked kinds, bottom to top, with their CSS class.
pub const STACK_KINDS: [(&str, &str); 6] = [
    ("weights", "k-weights"),
    ("NF4 codes + scales", "k-quant"),
    ("LoRA adapters", "k-adapters"),
    ("gradients", "k-grads"),
    ("optimizer state", "k-optim"),
    ("activations (logits outside blocks)", "k-acts"),
];

/// The kind drawn outlined above the stack: with checkpointing, a block's activations that
/// exist only while its backward recomputes them, one block at a time (not kept bytes).
pub const RECOMPUTED_KIND: (&str, &str) = (
    "recomputed during the block's backward (one block at a time)",
    "k-recomputed",
);

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
    /// With checkpointing: the recomputed activations, an outline above the stack.
    pub recomputed: Option<Rect>,
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

/// Where a block's measured activations start: above the other kinds, or with
/// checkpointing above the whole kept stack (the block input), beside the recomputed outline.
fn measured_base(row: &LayerBytes) -> u64 {
    let kinds = kinds_of(row);
    if row.recomputed > 0 {
        kinds.iter().sum()
    } else {
        kinds[..5].iter().sum()
    }
}

/// Bars for `rows` in a `width` × `height` box. A block's recomputed activations (with
/// checkpointing) are an outline above its stack. `measured` are the per-block comparisons of
/// a measurement (named `layers.N`: the activations one plain forward keeps for the
/// backward); each is drawn beside what it compares with, on the same base: the activations
/// segment, or with checkpointing the recomputed outline.
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
            let stack: u64 = kinds_of(r).iter().sum();
            let measured = measured_of(&r.layer).map_or(0, |c| c.measured);
            (stack + r.recomputed).max(measured_base(r) + measured)
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
            let recomputed = (row.recomputed > 0).then(|| {
                let h = row.recomputed as f64 * scale;
                Rect {
                    x,
                    y: top - h,
                    width: bar_width,
                    height: h,
                    class: RECOMPUTED_KIND.1,
                    bytes: row.recomputed,
                }
            });
            // The measured activations stand beside what they compare with, on the same
            // base, so the two heights compare.
            let base = height - measured_base(row) as f64 * scale;
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
                recomputed,
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

/// One series of a line chart: (x, y) points, x increasing.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    /// Shown in the legend.
    pub label: String,
    /// CSS class (the colour and dash of the line).
    pub class: &'static str,
    /// Points in data units.
    pub points: Vec<(f64, f64)>,
}

/// A line chart in a `width` × `height` box (y grows downwards, as in SVG).
#[derive(Debug, Clone, PartialEq)]
pub struct LineChart {
    /// Box width.
    pub width: f64,
    /// Box height.
    pub height: f64,
    /// One polyline per series: label, class, SVG `points`, and the points as chart
    /// coordinates (for markers).
    pub lines: Vec<ChartLine>,
    /// Ticks on the x axis: position and label.
    pub x_ticks: Vec<(f64, String)>,
    /// Ticks on the y axis: position and label.
    pub y_ticks: Vec<(f64, String)>,
}

/// One series placed in the chart.
#[derive(Debug, Clone, PartialEq)]
pub struct ChartLine {
    /// The series' label.
    pub label: String,
    /// The series' class.
    pub class: &'static str,
    /// `x,y x,y …` in chart units.
    pub points: String,
    /// The same points as numbers.
    pub xy: Vec<(f64, f64)>,
}

/// About five round tick values covering `[lo, hi]` (steps of 1, 2 or 5 × 10^k).
pub fn nice_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if !(lo.is_finite() && hi.is_finite()) {
        return Vec::new();
    }
    let span = (hi - lo).abs().max(hi.abs() * 1e-9).max(f64::MIN_POSITIVE);
    let raw = span / 5.0;
    let magnitude = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| span / s <= 6.0)
        .unwrap_or(10.0 * magnitude);
    let first = (lo / step).floor() * step;
    let mut ticks = Vec::new();
    let mut k = 0.0;
    loop {
        let t = first + k * step;
        ticks.push(t);
        if t >= hi - step * 1e-9 {
            break;
        }
        k += 1.0;
    }
    ticks
}

/// A tick label: at most four significant digits, scientific outside 1e-3 … 1e5.
pub fn tick_label(v: f64) -> String {
    let a = v.abs();
    if v == 0.0 {
        "0".into()
    } else if !(1e-3..1e5).contains(&a) {
        format!("{v:.1e}")
    } else {
        let decimals = (3 - a.log10().floor() as i32).clamp(0, 6) as usize;
        let text = format!("{v:.decimals$}");
        if text.contains('.') {
            text.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            text
        }
    }
}

/// Places `series` on shared axes in a `width` × `height` box: x spans the points' range, y
/// the rounded range of their finite values (non-finite points are left out).
pub fn line_chart(series: &[Series], width: f64, height: f64) -> LineChart {
    let finite = || {
        series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|(x, y)| x.is_finite() && y.is_finite())
    };
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for (x, y) in finite() {
        x_lo = x_lo.min(x);
        x_hi = x_hi.max(x);
        y_lo = y_lo.min(y);
        y_hi = y_hi.max(y);
    }
    if x_lo > x_hi {
        return LineChart {
            width,
            height,
            lines: Vec::new(),
            x_ticks: Vec::new(),
            y_ticks: Vec::new(),
        };
    }
    if x_hi == x_lo {
        x_hi = x_lo + 1.0;
    }
    if y_hi == y_lo {
        let pad = y_lo.abs().max(1.0) * 0.05;
        (y_lo, y_hi) = (y_lo - pad, y_hi + pad);
    }
    let y_ticks = nice_ticks(y_lo, y_hi);
    let (y_min, y_max) = (
        y_ticks.first().copied().unwrap_or(y_lo),
        y_ticks.last().copied().unwrap_or(y_hi),
    );
    let px = |x: f64| (x - x_lo) / (x_hi - x_lo) * width;
    let py = |y: f64| height - (y - y_min) / (y_max - y_min) * height;
    let x_ticks = nice_ticks(x_lo, x_hi)
        .into_iter()
        .filter(|&t| t >= x_lo - 1e-9 && t <= x_hi + 1e-9)
        .map(|t| (px(t), tick_label(t)))
        .collect();
    let lines = series
        .iter()
        .map(|s| {
            let xy: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|&(x, y)| (px(x), py(y)))
                .collect();
            ChartLine {
                label: s.label.clone(),
                class: s.class,
                points: xy
                    .iter()
                    .map(|(x, y)| format!("{x:.1},{y:.1}"))
                    .collect::<Vec<_>>()
                    .join(" "),
                xy,
            }
        })
        .collect();
    LineChart {
        width,
        height,
        lines,
        x_ticks,
        y_ticks: y_ticks
            .into_iter()
            .map(|t| (py(t), tick_label(t)))
            .collect(),
    }
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
            recomputed: 0,
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

    /// A checkpointed block: its input is a kept segment, its recomputed activations an
    /// outline above the stack, and the measured bar (one plain forward's saved activations)
    /// starts where the outline does.
    #[test]
    fn recomputed_activations_are_an_outline_the_measured_bar_stands_beside() {
        let rows = [LayerBytes {
            recomputed: 500,
            ..row("layers.0", 300, 10)
        }];
        let measured = [Comparison {
            name: "layers.0".into(),
            predicted: 500,
            measured: 490,
            ratio: 0.98,
        }];
        let chart = stacked_bars(&rows, &measured, 100.0, 810.0);
        assert_eq!(chart.max_bytes, 810);
        let bar = &chart.bars[0];
        assert_eq!(
            bar.segments.len(),
            2,
            "the recomputed bytes are not a kept segment"
        );
        let outline = bar.recomputed.as_ref().unwrap();
        assert_eq!(outline.class, RECOMPUTED_KIND.1);
        assert!((outline.height - 500.0).abs() < 1e-9 && outline.y.abs() < 1e-9);
        assert!((outline.y + outline.height - bar.segments[1].y).abs() < 1e-9);
        let m = bar.measured.as_ref().unwrap();
        assert!((m.y + m.height - (outline.y + outline.height)).abs() < 1e-9);
        assert!((m.height - 490.0).abs() < 1e-9);
        assert!(
            stacked_bars(&[row("layers.0", 1, 1)], &[], 1.0, 1.0).bars[0]
                .recomputed
                .is_none()
        );
    }

    #[test]
    fn the_polyline_marks_its_peak() {
        let p = polyline(&[1.0, 4.0, 2.0], 100.0, 40.0);
        assert_eq!(p.points, "0.0,30.0 50.0,0.0 100.0,20.0");
        assert_eq!(p.peak, Some((50.0, 0.0, 1)));
        assert!(polyline(&[], 10.0, 10.0).peak.is_none());
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        assert_eq!(nice_ticks(0.43, 2.38), [0.0, 0.5, 1.0, 1.5, 2.0, 2.5]);
        assert_eq!(
            nice_ticks(1.0, 30.0),
            [0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0]
        );
        assert_eq!(nice_ticks(0.0, 1e-3).len(), 6);
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(1.2e-4), "1.2e-4");
        assert_eq!(tick_label(20.0), "20");
    }

    #[test]
    fn a_line_chart_maps_data_to_its_box_on_shared_axes() {
        let train = Series {
            label: "loss".into(),
            class: "train",
            points: vec![(1.0, 2.0), (2.0, 1.0), (3.0, f64::NAN)],
        };
        let eval = Series {
            label: "held-out".into(),
            class: "eval",
            points: vec![(0.0, 2.4), (3.0, 1.2)],
        };
        let c = line_chart(&[train, eval], 300.0, 100.0);
        // x: 0..3 → 0..300; y: ticks 1.0..2.5 (step 0.5) → 100..0.
        assert_eq!(c.lines[0].points, "100.0,33.3 200.0,100.0", "NaN left out");
        assert_eq!(c.lines[1].xy[0], (0.0, 100.0 - (2.4 - 1.0) / 1.5 * 100.0));
        assert_eq!(c.y_ticks.first().map(|t| t.1.as_str()), Some("1"));
        assert_eq!(c.y_ticks.last(), Some(&(0.0, "2.5".to_string())));
        assert!(c.x_ticks.iter().all(|(x, _)| (0.0..=300.0).contains(x)));
        assert!(line_chart(&[], 10.0, 10.0).lines.is_empty());
    }
}
