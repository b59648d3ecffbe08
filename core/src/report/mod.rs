//! Presenting runs: chart geometry shared by the browser sandbox and the command line, an SVG
//! writer, and the self-contained HTML report of a training run (`napkin report`).

pub mod chart;
pub mod run;
pub mod svg;
