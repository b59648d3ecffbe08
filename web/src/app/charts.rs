//! SVG charts: predicted memory per layer (stacked by kind) with the measured activations
//! beside each bar, the step timeline with its peak, and curves with axes (the loss of the run
//! in the page, an imported run's metrics). Geometry comes from napkin-core's `report::chart`;
//! the curves are the very SVG `napkin report` writes (`report::svg`).

use std::rc::Rc;

use napkin_core::measure::MeasurementReport;
use yew::prelude::*;

use super::format::bytes;
use crate::state::View;
use napkin_core::report::chart::{STACK_KINDS, Series, line_chart, stacked_bars, timeline};
use napkin_core::report::svg::line_chart_svg;

const W: f64 = 640.0;
const H: f64 = 220.0;

#[derive(Properties, PartialEq)]
pub struct LayerChartProps {
    pub view: Rc<View>,
    pub run: Option<Rc<MeasurementReport>>,
}

#[function_component(LayerChart)]
pub fn layer_chart(props: &LayerChartProps) -> Html {
    let measured = props.run.as_ref().map_or(&[][..], |r| &r.layers[..]);
    let chart = stacked_bars(&props.view.report.per_layer, measured, W, H);
    html! {
        <section class="panel">
            <h2>{ "Memory per layer" }</h2>
            <svg id="layer-chart" viewBox={format!("0 -10 {W} {}", H + 40.0)} role="img"
                 aria-label="predicted bytes per layer, stacked by kind">
                { for chart.bars.iter().zip(&props.view.report.per_layer).map(|(bar, row)| html! {
                    <g class="layer" data-layer={row.layer.clone()} data-weights={row.weights.to_string()}
                       data-quant={row.quant.to_string()} data-activations={row.activations.to_string()}>
                        { for bar.segments.iter().map(|r| html! {
                            <rect class={r.class} x={r.x.to_string()} y={r.y.to_string()}
                                  width={r.width.to_string()} height={r.height.to_string()}>
                                <title>{ format!("{}: {}", bar.label, bytes(r.bytes as f64)) }</title>
                            </rect>
                        }) }
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
            <p class="note">{ "Activations: what each block's forward keeps for its backward. With checkpointing a block keeps only its input between forward and backward and holds these bytes one block at a time, while it is recomputed: the step timeline and the peak show that." }</p>
            <ul class="legend">
                { for STACK_KINDS.iter().map(|(name, class)| html! { <li><span class={format!("swatch {class}")}></span>{ *name }</li> }) }
                <li><span class="swatch k-measured"></span>{ "measured activations (after a run)" }</li>
            </ul>
            <details id="layer-table">
                <summary>{ "The chart's numbers, per layer and kind (predicted)" }</summary>
                <table>
                    <thead><tr>
                        <th scope="col">{ "layer" }</th><th scope="col">{ "weights" }</th><th scope="col">{ "NF4 codes + scales" }</th>
                        <th scope="col">{ "LoRA adapters" }</th><th scope="col">{ "gradients" }</th><th scope="col">{ "optimizer state" }</th>
                        <th scope="col">{ "activations" }</th>
                    </tr></thead>
                    <tbody>
                        { for props.view.report.per_layer.iter().map(|r| html! {
                            <tr>
                                <th scope="row">{ r.layer.clone() }</th>
                                <td>{ bytes(r.weights as f64) }</td><td>{ bytes(r.quant as f64) }</td><td>{ bytes(r.adapters as f64) }</td>
                                <td>{ bytes(r.gradients as f64) }</td><td>{ bytes(r.optimizer_state as f64) }</td><td>{ bytes(r.activations as f64) }</td>
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

/// Curves per optimizer step with axes, ticks and a legend.
#[function_component(CurveChart)]
pub fn curve_chart(props: &CurveProps) -> Html {
    let geometry = line_chart(&props.series, W, 160.0);
    // The SVG text is napkin-core's, every label escaped there: the same chart as the report.
    let svg = line_chart_svg(&geometry, &props.title, "optimizer step", &props.y_name);
    html! {
        <div class="curve" id={props.id.clone()}>{ Html::from_html_unchecked(svg.into()) }</div>
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
