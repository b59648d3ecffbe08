//! SVG charts: predicted memory per layer (stacked by kind) with the measured activations
//! beside each bar, the step timeline with its peak, and curves with axes (the loss of the run
//! in the page, an imported run's metrics). Geometry comes from napkin-core's `report::chart`;
//! the curves are the very SVG `napkin report` writes (`report::svg`).

use std::rc::Rc;

use napkin_core::measure::MeasurementReport;
use yew::prelude::*;

use super::format::bytes;
use crate::state::View;
use napkin_core::report::chart::{
    RECOMPUTED_KIND, STACK_KINDS, Series, line_chart, stacked_bars, timeline,
};
use napkin_core::report::svg::line_chart_svg;

const W: f64 = 640.0;
const H: f64 = 220.0;

/// The hatch drawn over a kind's colour, so that no kind is told apart by colour alone. The
/// legend's swatches carry the same hatches (`style.css`).
struct Hatch {
    /// The kind's CSS class (`STACK_KINDS`).
    class: &'static str,
    /// The SVG pattern's id.
    id: &'static str,
    /// Its lines in an 8 × 8 tile: (x1, y1, x2, y2).
    lines: &'static [(f64, f64, f64, f64)],
}

/// Weights stay plain; every other kind has its own hatch.
const HATCHES: [Hatch; 5] = [
    Hatch {
        class: "k-quant",
        id: "hatch-quant",
        lines: &[(0.0, 8.0, 8.0, 0.0)],
    },
    Hatch {
        class: "k-adapters",
        id: "hatch-adapters",
        lines: &[(2.0, 2.0, 2.5, 2.5), (6.0, 6.0, 6.5, 6.5)],
    },
    Hatch {
        class: "k-grads",
        id: "hatch-grads",
        lines: &[(0.0, 4.0, 8.0, 4.0)],
    },
    Hatch {
        class: "k-optim",
        id: "hatch-optim",
        lines: &[(0.0, 8.0, 8.0, 0.0), (0.0, 0.0, 8.0, 8.0)],
    },
    Hatch {
        class: "k-acts",
        id: "hatch-acts",
        lines: &[(4.0, 0.0, 4.0, 8.0)],
    },
];

/// The hatch pattern's id for a kind's class, if it has one.
fn hatch_of(class: &str) -> Option<&'static str> {
    HATCHES.iter().find(|h| h.class == class).map(|h| h.id)
}

/// The `<defs>` of the hatches.
fn hatch_defs() -> Html {
    html! {
        <defs>
            { for HATCHES.iter().map(|h| html! {
                <pattern id={h.id} width="8" height="8" patternUnits="userSpaceOnUse">
                    { for h.lines.iter().map(|(x1, y1, x2, y2)| html! {
                        <line class="hatch-line" x1={x1.to_string()} y1={y1.to_string()}
                              x2={x2.to_string()} y2={y2.to_string()} />
                    }) }
                </pattern>
            }) }
        </defs>
    }
}

#[derive(Properties, PartialEq)]
pub struct LayerChartProps {
    pub view: Rc<View>,
    pub run: Option<Rc<MeasurementReport>>,
}

#[function_component(LayerChart)]
pub fn layer_chart(props: &LayerChartProps) -> Html {
    let measured = props.run.as_ref().map_or(&[][..], |r| &r.layers[..]);
    let chart = stacked_bars(&props.view.report.per_layer, measured, W, H);
    let checkpointed = props.view.report.activations.recomputed_block.is_some();
    html! {
        <section class="panel">
            <h2>{ "Memory per layer" }</h2>
            <svg id="layer-chart" viewBox={format!("0 -10 {W} {}", H + 40.0)} role="img"
                 aria-label="predicted bytes per layer, stacked by kind">
                { hatch_defs() }
                { for chart.bars.iter().zip(&props.view.report.per_layer).map(|(bar, row)| html! {
                    <g class="layer" data-layer={row.layer.clone()} data-weights={row.weights.to_string()}
                       data-quant={row.quant.to_string()} data-adapters={row.adapters.to_string()}
                       data-activations={row.activations.to_string()}
                       data-recomputed={row.recomputed.to_string()}>
                        { for bar.segments.iter().map(|r| html! {
                            <>
                                <rect class={r.class} x={r.x.to_string()} y={r.y.to_string()}
                                      width={r.width.to_string()} height={r.height.to_string()}>
                                    <title>{ format!("{}: {}", bar.label, bytes(r.bytes as f64)) }</title>
                                </rect>
                                if let Some(id) = hatch_of(r.class) {
                                    <rect class="hatch" data-kind={r.class} fill={format!("url(#{id})")}
                                          x={r.x.to_string()} y={r.y.to_string()}
                                          width={r.width.to_string()} height={r.height.to_string()} />
                                }
                            </>
                        }) }
                        if let Some(r) = &bar.recomputed {
                            <rect class={r.class} x={r.x.to_string()} y={r.y.to_string()}
                                  width={r.width.to_string()} height={r.height.to_string()}>
                                <title>{ format!("{}: {} recomputed during its backward (not kept)", bar.label, bytes(r.bytes as f64)) }</title>
                            </rect>
                        }
                        if let Some(m) = &bar.measured {
                            <rect class="k-measured" x={m.x.to_string()} y={m.y.to_string()}
                                  width={m.width.to_string()} height={m.height.to_string()}>
                                <title>{ format!("{} measured activations: {}", bar.label, bytes(m.bytes as f64)) }</title>
                            </rect>
                        }
                    </g>
                }) }
                <text x="0" y={(H + 16.0).to_string()} class="axis">{ "layers.0" }</text>
                <text x={W.to_string()} y={(H + 16.0).to_string()} class="axis end">{ "outside blocks (embeddings, head, logits)" }</text>
                <text x="0" y="0" class="axis">{ format!("top: {}", bytes(chart.max_bytes as f64)) }</text>
            </svg>
            <p class="note">{ if checkpointed {
                "Activations: with checkpointing a block keeps only its input between forward and backward (the solid segment). The dashed outline is what its backward recomputes: those bytes exist for one block at a time, while it runs, and are not kept; the step timeline and the peak show when."
            } else {
                "Activations: what each block's forward keeps for its backward."
            } }</p>
            <ul class="legend">
                { for STACK_KINDS.iter().map(|(name, class)| html! { <li><span class={format!("swatch {class}")}></span>{ *name }</li> }) }
                if checkpointed {
                    <li><span class={format!("swatch {}", RECOMPUTED_KIND.1)}></span>{ RECOMPUTED_KIND.0 }</li>
                }
                <li><span class="swatch k-measured"></span>{ "measured activations (after a run)" }</li>
            </ul>
            <details id="layer-table">
                <summary>{ "The chart's numbers, per layer and kind (predicted)" }</summary>
                <table>
                    <thead><tr>
                        <th scope="col">{ "layer" }</th><th scope="col">{ "weights" }</th><th scope="col">{ "NF4 codes + scales" }</th>
                        <th scope="col">{ "LoRA adapters" }</th><th scope="col">{ "gradients" }</th><th scope="col">{ "optimizer state" }</th>
                        <th scope="col">{ "activations kept" }</th>
                        if checkpointed {
                            <th scope="col">{ "recomputed during its backward" }</th>
                        }
                    </tr></thead>
                    <tbody>
                        { for props.view.report.per_layer.iter().map(|r| html! {
                            <tr>
                                <th scope="row">{ r.layer.clone() }</th>
                                <td>{ bytes(r.weights as f64) }</td><td>{ bytes(r.quant as f64) }</td><td>{ bytes(r.adapters as f64) }</td>
                                <td>{ bytes(r.gradients as f64) }</td><td>{ bytes(r.optimizer_state as f64) }</td><td>{ bytes(r.activations as f64) }</td>
                                if checkpointed {
                                    <td>{ bytes(r.recomputed as f64) }</td>
                                }
                            </tr>
                        }) }
                    </tbody>
                </table>
            </details>
            if let Some(report) = &props.run {
                <MeasuredTable report={report.clone()} />
            }
        </section>
    }
}

#[derive(Properties, PartialEq)]
pub struct MeasuredTableProps {
    pub report: Rc<MeasurementReport>,
}

/// Predicted beside measured, per kind and per block.
#[function_component(MeasuredTable)]
pub fn measured_table(props: &MeasuredTableProps) -> Html {
    let r = &props.report;
    // An imported `napkin measure --offload optimizer` report adds the host and link rows.
    let offload = r
        .offload
        .iter()
        .flat_map(|o| [&o.host, &o.to_host, &o.to_device]);
    let rows = r
        .kinds
        .iter()
        .chain(offload)
        .chain(&r.layers)
        .chain([&r.step_peak]);
    html! {
        <table class="measured">
            <caption>{ format!("Predicted vs measured ({})", r.method_description) }</caption>
            <thead><tr><th>{ "" }</th><th>{ "predicted" }</th><th>{ "measured" }</th><th>{ "ratio" }</th></tr></thead>
            <tbody>
                { for rows.map(|c| html! {
                    <tr class="measured-row" data-name={c.name.clone()}>
                        <td>{ &c.name }</td>
                        <td>{ bytes(c.predicted as f64) }</td>
                        <td>{ bytes(c.measured as f64) }</td>
                        <td class="ratio">{ format!("{:.3}", c.ratio) }</td>
                    </tr>
                }) }
            </tbody>
        </table>
    }
}

#[derive(Properties, PartialEq)]
pub struct TimelineProps {
    pub view: Rc<View>,
}

#[function_component(TimelineChart)]
pub fn timeline_chart(props: &TimelineProps) -> Html {
    let v = &props.view;
    let line = timeline(&v.report.timeline, W, H);
    let peak = line.peak.map(|(x, y, i)| {
        let label = v
            .report
            .timeline
            .get(i)
            .map_or("", |e| e.label.as_str())
            .to_string();
        html! {
            <g>
                <circle class="peak" cx={x.to_string()} cy={y.to_string()} r="4" />
                <text class="axis" x={x.min(W - 200.0).to_string()} y={(y + 16.0).to_string()}>
                    { format!("peak {} at {label}", bytes(line.max)) }
                </text>
            </g>
        }
    });
    html! {
        <section class="panel">
            <h2>{ "One step, event by event" }</h2>
            <svg id="timeline-chart" viewBox={format!("0 -10 {W} {}", H + 20.0)} role="img"
                 aria-label="bytes alive through one optimizer step">
                <polyline class="timeline" points={line.points} />
                { for peak }
                <text x="0" y="0" class="axis">{ format!("bytes alive (top: {})", bytes(line.max)) }</text>
                <text x="0" y={(H + 16.0).to_string()} class="axis">{ "start of the step" }</text>
                <text x={W.to_string()} y={(H + 16.0).to_string()} class="axis end">{ "events: forward → backward → optimizer" }</text>
            </svg>
            <p class="note">{ "Forward keeps activations block by block, the backward frees them as gradients appear, then the optimizer updates." }</p>
            <details id="timeline-table">
                <summary>{ "The chart's numbers, event by event (predicted)" }</summary>
                <table>
                    <thead><tr>
                        <th scope="col">{ "event" }</th><th scope="col">{ "micro-batch" }</th><th scope="col">{ "bytes alive" }</th>
                    </tr></thead>
                    <tbody>
                        { for v.report.timeline.iter().map(|e| html! {
                            <tr data-bytes={e.bytes.to_string()}>
                                <th scope="row">{ e.label.clone() }</th>
                                <td>{ e.micro_batch + 1 }</td>
                                <td>{ bytes(e.bytes as f64) }</td>
                            </tr>
                        }) }
                    </tbody>
                </table>
            </details>
        </section>
    }
}

#[derive(Properties, PartialEq)]
pub struct CurveProps {
    /// The element's id.
    pub id: AttrValue,
    /// The chart's accessible name.
    pub title: AttrValue,
    /// What the y axis measures.
    pub y_name: AttrValue,
    /// The curves, on shared axes.
    pub series: Vec<Series>,
}

/// Curves per optimizer step with axes, ticks and a legend, and their numbers in a table.
#[function_component(CurveChart)]
pub fn curve_chart(props: &CurveProps) -> Html {
    let geometry = line_chart(&props.series, W, 160.0);
    // The SVG text is napkin-core's, every label escaped there: the same chart as the report.
    let svg = line_chart_svg(&geometry, &props.title, "optimizer step", &props.y_name);
    let rows = curve_rows(&props.series);
    html! {
        <div class="curve" id={props.id.clone()}>
            { Html::from_html_unchecked(svg.into()) }
            <details class="curve-table">
                <summary>{ format!("The chart's numbers ({})", props.title) }</summary>
                <table>
                    <thead><tr>
                        <th scope="col">{ "optimizer step" }</th>
                        { for props.series.iter().map(|s| html! {
                            <th scope="col">{ format!("{} ({})", s.label, props.y_name) }</th>
                        }) }
                    </tr></thead>
                    <tbody>
                        { for rows.iter().map(|(x, ys)| html! {
                            <tr>
                                <th scope="row">{ format_step(*x) }</th>
                                { for ys.iter().map(|y| html! {
                                    <td>{ y.map_or_else(|| "–".to_string(), format_value) }</td>
                                }) }
                            </tr>
                        }) }
                    </tbody>
                </table>
            </details>
        </div>
    }
}

/// One row per x any series has, ascending, with each series' value there (if it has one).
fn curve_rows(series: &[Series]) -> Vec<(f64, Vec<Option<f64>>)> {
    let mut xs: Vec<f64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    xs.sort_by(f64::total_cmp);
    xs.dedup();
    xs.into_iter()
        .map(|x| {
            let ys = series
                .iter()
                .map(|s| s.points.iter().find(|p| p.0 == x).map(|p| p.1))
                .collect();
            (x, ys)
        })
        .collect()
}

/// A step number as a whole number when it is one.
fn format_step(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

/// A value to four significant digits (losses, learning rates, megabytes alike).
fn format_value(y: f64) -> String {
    if y == 0.0 || !y.is_finite() {
        return format!("{y}");
    }
    let digits = (3 - y.abs().log10().floor() as i32).max(0) as usize;
    if digits > 8 {
        format!("{y:.3e}")
    } else {
        format!("{y:.digits$}")
    }
}

#[derive(Properties, PartialEq)]
pub struct LossProps {
    pub losses: Vec<f32>,
    /// The chart's element id (one per run on the page).
    #[prop_or(AttrValue::Static("loss-chart"))]
    pub id: AttrValue,
}

/// The loss of the run in the page, step by step.
#[function_component(LossChart)]
pub fn loss_chart(props: &LossProps) -> Html {
    let series = vec![Series {
        label: "training loss".into(),
        class: "c-train",
        points: props
            .losses
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as f64 + 1.0, f64::from(l)))
            .collect(),
    }];
    html! {
        <CurveChart id={props.id.clone()} title="loss per step" y_name="nats / token" {series} />
    }
}
