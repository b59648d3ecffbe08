//! napkin-web: the browser sandbox. So far its state: plain data, an action enum, a reducer and
//! the view model the charts will draw, all from napkin-core's predictor (`state.rs`). The yew
//! components, the training Web Worker and the build script come next (see the web sandbox
//! issue).

pub mod state;
