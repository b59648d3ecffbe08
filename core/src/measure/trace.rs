//! The timeline a measurement records: spans and memory counter samples, in Chrome Trace
//! Event form.

use web_time::Instant;

use super::TraceEvent;

/// The timeline being recorded.
pub(super) struct Recorder {
    start: Instant,
    pub(super) events: Vec<TraceEvent>,
}

impl Recorder {
    pub(super) fn new() -> Self {
        Recorder {
            start: Instant::now(),
            events: Vec::new(),
        }
    }

    pub(super) fn now_us(&self) -> f64 {
        self.start.elapsed().as_secs_f64() * 1e6
    }

    pub(super) fn counter(&mut self, bytes: u64) {
        let ts = self.now_us();
        self.events.push(TraceEvent {
            name: "memory".into(),
            ph: "C".into(),
            ts,
            dur: None,
            pid: 1,
            tid: 1,
            args: Some(serde_json::json!({ "bytes": bytes })),
        });
    }

    pub(super) fn span(&mut self, name: String, from_us: f64) {
        let ts = self.now_us();
        self.events.push(TraceEvent {
            name,
            ph: "X".into(),
            ts: from_us,
            dur: Some(ts - from_us),
            pid: 1,
            tid: 1,
            args: None,
        });
    }
}
