//! Numbers as the page prints them.

/// Bytes in binary units (KiB … TiB), three significant digits.
pub fn bytes(b: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = b;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    let digits = if value >= 100.0 || unit == 0 {
        0
    } else if value >= 10.0 {
        1
    } else {
        2
    };
    format!("{value:.digits$} {}", UNITS[unit])
}

/// Seconds as s or ms.
pub fn seconds(s: f64) -> String {
    if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

/// FLOPs with an SI prefix.
pub fn flops(f: f64) -> String {
    match f {
        f if f >= 1e15 => format!("{:.2} PFLOP", f / 1e15),
        f if f >= 1e12 => format!("{:.2} TFLOP", f / 1e12),
        f if f >= 1e9 => format!("{:.2} GFLOP", f / 1e9),
        f => format!("{:.2} MFLOP", f / 1e6),
    }
}
