//! On-demand CPU profiles of the live process with `pprof-rs`,
//! sampling from SIGPROF with the frame-pointer unwinder (the binary is built with
//! `-C force-frame-pointers=yes`, see `.cargo/config.toml`).
//!
//! Owns the one-capture-at-a-time rule ([`CaptureSlot`]), the capture itself (the caller
//! waits on a tokio timer, so no runtime thread is held) and the rendering (flamegraph
//! SVG, gzipped pprof protobuf, top functions) on a short-lived low-priority thread, so
//! building a report does not compete with message handling at equal priority.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use super::capture::{on_report_thread, Slot};

/// Seconds a capture may last.
pub const SECONDS: std::ops::RangeInclusive<u32> = 1..=300;
/// Sampling frequencies, Hz.
pub const FREQUENCY: std::ops::RangeInclusive<u32> = 1..=1000;
/// Functions listed in a bundle's `top`.
pub const TOP: usize = 30;
/// Libraries whose code is not sampled or walked through. libc is not among them: the
/// frame-pointer walk is memory-safe anywhere (each frame is validated before it is
/// read), and a server spends much of its CPU in libc's syscall wrappers, which keep the
/// caller's frame pointer; blocking libc would drop every sample taken in a syscall.
const BLOCKLIST: &[&str] = &["libgcc", "vdso"];

/// Errors of a capture.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// Another capture is running.
    #[error("a CPU profile is already being captured")]
    Busy,
    /// The profiler failed.
    #[error("profiler: {0}")]
    Profiler(String),
}

static CAPTURING: AtomicBool = AtomicBool::new(false);

/// The process-wide right to capture (the profiler is process-global); released on drop.
pub struct CaptureSlot {
    _held: Slot,
}

impl CaptureSlot {
    /// Takes the slot, or [`ProfileError::Busy`] if a capture is running.
    pub fn try_take() -> Result<CaptureSlot, ProfileError> {
        Slot::take(&CAPTURING)
            .map(|held| CaptureSlot { _held: held })
            .ok_or(ProfileError::Busy)
    }
}

/// What to render.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Flamegraph SVG.
    Svg,
    /// Gzipped pprof protobuf.
    Pprof,
    /// JSON with both and the top functions.
    Bundle,
}

impl Format {
    /// Parses `svg`, `pprof` or `bundle`.
    pub fn parse(s: &str) -> Option<Format> {
        match s {
            "svg" | "flamegraph" => Some(Format::Svg),
            "pprof" | "proto" => Some(Format::Pprof),
            "bundle" => Some(Format::Bundle),
            _ => None,
        }
    }
}

/// One function's share of a profile: the admin API's type (`top[]` of a bundle).
pub use im_admin_api::TopFunction;

/// A rendered profile; fields present per the requested [`Format`].
#[derive(Debug, Default)]
pub struct Rendered {
    /// Samples taken.
    pub samples: u64,
    /// Flamegraph SVG.
    pub svg: Option<String>,
    /// Gzipped pprof protobuf.
    pub pprof_gz: Option<Vec<u8>>,
    /// Top functions by self samples.
    pub top: Vec<TopFunction>,
}

/// Profiles the whole process for `seconds` at `frequency` Hz and renders `format`.
/// The slot is held for the whole capture and rendering.
pub async fn capture(
    _slot: &CaptureSlot,
    seconds: u32,
    frequency: u32,
    format: Format,
) -> Result<Rendered, ProfileError> {
    let guard = tokio::task::spawn_blocking(move || {
        pprof::ProfilerGuardBuilder::default()
            .frequency(frequency as i32)
            .blocklist(BLOCKLIST)
            .build()
    })
    .await
    .map_err(|e| ProfileError::Profiler(e.to_string()))?
    .map_err(|e| ProfileError::Profiler(e.to_string()))?;
    tokio::time::sleep(Duration::from_secs(seconds as u64)).await;
    let report = move || {
        let report = guard.report().build();
        drop(guard); // stops sampling
        report
            .map_err(|e| ProfileError::Profiler(e.to_string()))
            .and_then(|r| render(&r, seconds, frequency, format))
    };
    let rendered = on_report_thread("im-profile", report, ProfileError::Profiler).await?;
    metrics::counter!("im_profiles_captured_total").increment(1);
    Ok(rendered)
}

fn render(
    report: &pprof::Report,
    seconds: u32,
    frequency: u32,
    format: Format,
) -> Result<Rendered, ProfileError> {
    let samples: u64 = report.data.values().map(|&c| c.max(0) as u64).sum();
    let mut out = Rendered {
        samples,
        ..Default::default()
    };
    if matches!(format, Format::Svg | Format::Bundle) {
        out.svg = Some(flamegraph(report, seconds, frequency)?);
    }
    if matches!(format, Format::Pprof | Format::Bundle) {
        use pprof::protos::Message;
        let profile = report
            .pprof()
            .map_err(|e| ProfileError::Profiler(e.to_string()))?;
        let raw = profile.encode_to_vec();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(&raw)
            .and_then(|_| gz.finish())
            .map(|b| out.pprof_gz = Some(b))
            .map_err(|e| ProfileError::Profiler(e.to_string()))?;
    }
    if format == Format::Bundle {
        out.top = top_functions(report, TOP);
    }
    Ok(out)
}

fn flamegraph(
    report: &pprof::Report,
    seconds: u32,
    frequency: u32,
) -> Result<String, ProfileError> {
    let title = format!("im-server CPU: {seconds} s at {frequency} Hz");
    if report.data.is_empty() {
        // inferno writes nothing without samples; answer a valid, explicit SVG.
        return Ok(format!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"600\" height=\"60\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"10\" y=\"30\">{title}: no samples (the process was idle)</text></svg>\n"
        ));
    }
    let mut opts = pprof::flamegraph::Options::default();
    opts.title = title;
    let mut buf = Vec::new();
    report
        .flamegraph_with_options(&mut buf, &mut opts)
        .map_err(|e| ProfileError::Profiler(e.to_string()))?;
    String::from_utf8(buf).map_err(|e| ProfileError::Profiler(e.to_string()))
}

/// `name::h0123456789abcdef` -> `name`.
fn clean(name: String) -> String {
    match name.rfind("::h") {
        Some(i) if name.len() - i == 19 && name[i + 3..].bytes().all(|b| b.is_ascii_hexdigit()) => {
            name[..i].to_string()
        }
        _ => name,
    }
}

/// The name `top` shows: inlined Rust frames carry only a short DWARF name (`record`,
/// `{closure#0}`), so those get their source file, e.g. `record (server/src/obs/mod.rs)`.
fn display_name(sym: &pprof::Symbol) -> String {
    let name = clean(sym.name());
    let file = sym
        .filename
        .as_ref()
        .map(|f| f.to_string_lossy().to_string())
        .filter(|f| f.ends_with(".rs"));
    match file {
        Some(file) if !name.contains("::") => format!("{name} ({})", short_path(&file)),
        _ => name,
    }
}

/// `<crate dir>/src/<path>` of an absolute source path (registry crates by crate-version).
pub(crate) fn short_path(file: &str) -> &str {
    if let Some(i) = file.find("/registry/src/") {
        let rest = &file[i + "/registry/src/".len()..];
        return rest.split_once('/').map_or(rest, |(_, r)| r);
    }
    match file.rfind("/src/") {
        Some(i) => {
            let start = file[..i].rfind('/').map_or(0, |j| j + 1);
            &file[start..]
        }
        None => file,
    }
}

/// The `n` functions with most self samples (ties by name).
pub fn top_functions(report: &pprof::Report, n: usize) -> Vec<TopFunction> {
    let mut by_fn: HashMap<String, (u64, u64)> = HashMap::new();
    for (frames, &count) in &report.data {
        let count = count.max(0) as u64;
        // frames[0] is the innermost frame; within a frame, symbol 0 is the innermost inline.
        if let Some(leaf) = frames.frames.first().and_then(|f| f.first()) {
            by_fn.entry(display_name(leaf)).or_default().0 += count;
        }
        let mut seen = HashSet::new();
        for sym in frames.frames.iter().flatten() {
            let name = display_name(sym);
            if seen.insert(name.clone()) {
                by_fn.entry(name).or_default().1 += count;
            }
        }
    }
    ranked(by_fn, n)
        .into_iter()
        .map(|(function, self_samples, total_samples)| TopFunction {
            function,
            self_samples,
            total_samples,
        })
        .collect()
}

/// The `n` entries of `by_fn` (function -> (self, total)) with the most self weight, ties
/// by name; entries with no self weight are left out. Shared by the CPU and heap tops.
pub(crate) fn ranked(by_fn: HashMap<String, (u64, u64)>, n: usize) -> Vec<(String, u64, u64)> {
    let mut v: Vec<(String, u64, u64)> = by_fn
        .into_iter()
        .filter(|(_, (s, _))| *s > 0)
        .map(|(f, (s, t))| (f, s, t))
        .collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(n);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_capture_at_a_time() {
        let a = CaptureSlot::try_take().unwrap();
        assert!(matches!(CaptureSlot::try_take(), Err(ProfileError::Busy)));
        drop(a);
        assert!(CaptureSlot::try_take().is_ok());
    }

    #[test]
    fn hash_suffixes_are_dropped() {
        assert_eq!(
            clean("im_server::gateway::conn::read_loop::h0123456789abcdef".into()),
            "im_server::gateway::conn::read_loop"
        );
        assert_eq!(clean("main".into()), "main");
        assert_eq!(clean("a::hello".into()), "a::hello");
    }

    #[test]
    fn source_paths_are_shortened() {
        assert_eq!(
            short_path("/work/main/server/src/obs/mod.rs"),
            "server/src/obs/mod.rs"
        );
        assert_eq!(
            short_path("/root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/tokio-1.54.1/src/runtime/io/driver.rs"),
            "tokio-1.54.1/src/runtime/io/driver.rs"
        );
        assert_eq!(
            short_path("/rustc/abc/library/core/src/ptr/mod.rs"),
            "core/src/ptr/mod.rs"
        );
        assert_eq!(short_path("x.rs"), "x.rs");
    }

    #[test]
    fn formats_parse() {
        assert_eq!(Format::parse("svg"), Some(Format::Svg));
        assert_eq!(Format::parse("pprof"), Some(Format::Pprof));
        assert_eq!(Format::parse("bundle"), Some(Format::Bundle));
        assert_eq!(Format::parse("png"), None);
    }
}
