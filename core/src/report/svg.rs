//! A [`LineChart`](super::chart::LineChart) as standalone SVG text, for pages written without
//! a browser framework (`napkin report`): axes with their ticks, one polyline per series with
//! a marker at each point, and a legend. Styling comes from the page's CSS (classes `c-…`, so
//! they never meet a page's own; a series' class is its caller's, `c-train` say).

use std::fmt::Write;

use super::chart::LineChart;

/// Room around the plot for tick labels and the legend.
const LEFT: f64 = 56.0;
const BOTTOM: f64 = 28.0;
const TOP: f64 = 22.0;
const RIGHT: f64 = 12.0;

/// Escapes text for XML content and attributes.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// The chart as an `<svg>` element titled `title` (its accessible name), the x axis named
/// `x_name` and the y axis `y_name`.
pub fn line_chart_svg(chart: &LineChart, title: &str, x_name: &str, y_name: &str) -> String {
    let (w, h) = (chart.width, chart.height);
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg class="c-chart" viewBox="0 0 {} {}" role="img" aria-label="{}" xmlns="http://www.w3.org/2000/svg">"#,
        w + LEFT + RIGHT,
        h + TOP + BOTTOM,
        escape(title)
    );
    let _ = write!(s, "<title>{}</title>", escape(title));
    let _ = write!(s, r#"<g transform="translate({LEFT},{TOP})">"#);
    // Grid and ticks.
    for (y, label) in &chart.y_ticks {
        let _ = write!(
            s,
            r#"<line class="c-grid" x1="0" y1="{y:.1}" x2="{w}" y2="{y:.1}"/><text class="c-tick" x="-6" y="{:.1}" text-anchor="end">{}</text>"#,
            y + 4.0,
            escape(label)
        );
    }
    for (x, label) in &chart.x_ticks {
        let _ = write!(
            s,
            r#"<line class="c-axis" x1="{x:.1}" y1="{h}" x2="{x:.1}" y2="{}"/><text class="c-tick" x="{x:.1}" y="{}" text-anchor="middle">{}</text>"#,
            h + 4.0,
            h + 16.0,
            escape(label)
        );
    }
    let _ = write!(
        s,
        r#"<line class="c-axis" x1="0" y1="{h}" x2="{w}" y2="{h}"/><line class="c-axis" x1="0" y1="0" x2="0" y2="{h}"/>"#
    );
    let _ = write!(
        s,
        r#"<text class="c-axis-name" x="{w}" y="{}" text-anchor="end">{}</text><text class="c-axis-name" x="0" y="-8">{}</text>"#,
        h + 27.0,
        escape(x_name),
        escape(y_name)
    );
    // Series, then the legend along the top right.
    for line in &chart.lines {
        let _ = write!(
            s,
            r#"<polyline class="c-series {}" fill="none" points="{}"><title>{}</title></polyline>"#,
            line.class,
            line.points,
            escape(&line.label)
        );
        if line.xy.len() <= 60 {
            for (x, y) in &line.xy {
                let _ = write!(
                    s,
                    r#"<circle class="c-marker {}" cx="{x:.1}" cy="{y:.1}" r="2.5"/>"#,
                    line.class
                );
            }
        }
    }
    let mut x = w;
    for line in chart.lines.iter().rev() {
        let label = escape(&line.label);
        x -= 14.0 + 7.0 * line.label.chars().count() as f64;
        let _ = write!(
            s,
            r#"<line class="c-series {}" x1="{x:.1}" y1="-10" x2="{:.1}" y2="-10"/><text class="c-legend" x="{:.1}" y="-6">{label}</text>"#,
            line.class,
            x + 10.0,
            x + 13.0
        );
    }
    s.push_str("</g></svg>");
    s
}
