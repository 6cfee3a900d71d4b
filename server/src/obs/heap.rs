//! On-demand heap profiles of the live process from jemalloc's sampling profiler.
//!
//! The binary loads jemalloc with profiling compiled in and inactive (`prof:true,
//! prof_active:false`, see `main.rs`; cargo feature `heap-profiling`, on by default). A
//! capture resets the samples, turns sampling on for the window, dumps, and turns it off
//! again; the dump holds the allocations made during the window that are still live at its
//! end (in-use bytes by stack, unbiased from one sample per 2^19 bytes on average).
//!
//! Owns the one-capture-at-a-time rule ([`HeapSlot`], apart from the CPU profiler's slot:
//! the two profilers share nothing), the switch back off when a capture ends or its request
//! is dropped ([`Sampling`]), and the rendering (flamegraph SVG, gzipped pprof protobuf with
//! function names resolved in the process, top functions) on a short-lived low-priority
//! thread, like the CPU profile.

use std::sync::atomic::AtomicBool;

use super::capture::Slot;

/// Seconds a capture may last.
pub const SECONDS: std::ops::RangeInclusive<u32> = 1..=60;
/// Functions listed in a bundle's `top`.
pub const TOP: usize = 30;
/// jemalloc's sampling interval, log2 bytes (`lg_prof_sample` in `main.rs`).
pub const LG_SAMPLE: u32 = 19;

/// Errors of a capture.
#[derive(Debug, thiserror::Error)]
pub enum HeapError {
    /// Another heap capture is running.
    #[error("a heap profile is already being captured")]
    Busy,
    /// The binary was built without the profiler, or jemalloc was started without it.
    #[error("heap profiling is not available in this build (cargo feature heap-profiling, jemalloc opt.prof)")]
    Unavailable,
    /// The profiler failed.
    #[error("heap profiler: {0}")]
    Profiler(String),
}

static CAPTURING: AtomicBool = AtomicBool::new(false);

/// The process-wide right to capture a heap profile; released on drop.
pub struct HeapSlot {
    _held: Slot,
}

impl HeapSlot {
    /// Takes the slot, or [`HeapError::Busy`] if a heap capture is running.
    pub fn try_take() -> Result<HeapSlot, HeapError> {
        Slot::take(&CAPTURING)
            .map(|held| HeapSlot { _held: held })
            .ok_or(HeapError::Busy)
    }
}

/// One function's share of a heap profile: the admin API's type (`top[]` of a bundle).
pub use im_admin_api::HeapTopFunction;

/// A rendered heap profile; fields present per the requested format.
#[derive(Debug, Default)]
pub struct Rendered {
    /// Estimated in-use bytes of the allocations sampled in the window.
    pub inuse_bytes: u64,
    /// Distinct stacks in the dump.
    pub stacks: u64,
    /// Flamegraph SVG.
    pub svg: Option<String>,
    /// Gzipped pprof protobuf (`inuse_space`/bytes), function names resolved.
    pub pprof_gz: Option<Vec<u8>>,
    /// Top functions by self bytes.
    pub top: Vec<HeapTopFunction>,
}

/// Whether this process can take heap profiles (profiler compiled in and enabled).
pub fn available() -> bool {
    imp::available()
}

/// Samples the heap for `seconds` and renders `format`. The slot is held for the whole
/// capture and rendering; sampling is off again when this returns or is dropped.
pub async fn capture(
    _slot: &HeapSlot,
    seconds: u32,
    format: super::profile::Format,
) -> Result<Rendered, HeapError> {
    let r = imp::capture(seconds, format).await?;
    metrics::counter!("im_heap_profiles_captured_total").increment(1);
    Ok(r)
}

#[cfg(feature = "heap-profiling")]
mod imp {
    use std::io::BufReader;
    use std::time::Duration;

    use jemalloc_pprof::JemallocProfCtl;
    use tokio::sync::OwnedMutexGuard;

    use super::super::profile::Format;
    use super::{HeapError, Rendered, TOP};

    fn ctl_err(e: impl std::fmt::Display) -> HeapError {
        HeapError::Profiler(e.to_string())
    }

    pub(super) fn available() -> bool {
        jemalloc_pprof::PROF_CTL.is_some()
    }

    /// Sampling switched on; switched off (and the samples freed) on drop, so a dropped
    /// request does not leave the profiler running.
    struct Sampling(OwnedMutexGuard<JemallocProfCtl>);

    impl Sampling {
        fn start(mut ctl: OwnedMutexGuard<JemallocProfCtl>) -> Result<Sampling, HeapError> {
            // Start from no samples, whatever an earlier capture left.
            let lg = ctl.lg_sample();
            // SAFETY: "prof.reset" is writable and takes a size_t (jemalloc(3), prof.reset).
            unsafe { tikv_jemalloc_ctl::raw::write(b"prof.reset\0", lg) }.map_err(ctl_err)?;
            ctl.activate().map_err(ctl_err)?;
            Ok(Sampling(ctl))
        }
    }

    impl Drop for Sampling {
        fn drop(&mut self) {
            if let Err(e) = self.0.deactivate() {
                tracing::warn!(error = %e, "could not switch the heap profiler off");
            }
        }
    }

    pub(super) async fn capture(seconds: u32, format: Format) -> Result<Rendered, HeapError> {
        let ctl = jemalloc_pprof::PROF_CTL
            .as_ref()
            .ok_or(HeapError::Unavailable)?
            .clone()
            .lock_owned()
            .await;
        let mut sampling = Sampling::start(ctl)?;
        tokio::time::sleep(Duration::from_secs(seconds.into())).await;
        let report = move || {
            let dump = sampling.0.dump();
            drop(sampling); // sampling off before the (allocating) rendering
            dump.map_err(ctl_err)
                .and_then(|f| render(f, format, seconds))
        };
        super::super::capture::on_report_thread("im-heap-profile", report, HeapError::Profiler)
            .await
    }

    fn render(dump: std::fs::File, format: Format, seconds: u32) -> Result<Rendered, HeapError> {
        let profile = pprof_util::parse_jeheap(BufReader::new(dump), mappings::MAPPINGS.as_deref())
            .map_err(ctl_err)?;
        // Addresses are resolved to functions and lines here, in the process.
        let resolved = profile.to_pprof(("inuse_space", "bytes"), ("space", "bytes"), None);
        let mut decoded = super::decode(&resolved)?;
        super::tidy(&mut decoded);
        let mut out = Rendered {
            inuse_bytes: super::total(&decoded),
            stacks: decoded.sample.len() as u64,
            ..Default::default()
        };
        if matches!(format, Format::Svg | Format::Bundle) {
            let title = format!("im-server heap: in use after {seconds} s of sampling");
            out.svg = Some(super::flamegraph(&decoded, title)?);
        }
        if format == Format::Bundle {
            out.top = super::top_functions(&decoded, TOP);
        }
        if matches!(format, Format::Pprof | Format::Bundle) {
            out.pprof_gz = Some(super::encode(&decoded)?);
        }
        Ok(out)
    }
}

#[cfg(not(feature = "heap-profiling"))]
mod imp {
    use super::super::profile::Format;
    use super::{HeapError, Rendered};

    pub(super) fn available() -> bool {
        false
    }

    pub(super) async fn capture(_seconds: u32, _format: Format) -> Result<Rendered, HeapError> {
        Err(HeapError::Unavailable)
    }
}

/// Whether a frame is the allocator's own rather than the code that asked for memory:
/// jemalloc's C code (its sampling, entry points and static helpers such as
/// `prof_alloc_prep` or `do_rallocx`, all from tikv-jemalloc-sys's build), tikv-jemallocator's
/// `GlobalAlloc` impl and the `__rust_alloc` shims.
fn allocator_frame(name: &str, file: &str) -> bool {
    file.contains("tikv-jemalloc-sys")
        || file.contains("tikv-jemallocator")
        || [
            "_rjem_",
            "__rust_",
            "__rustc::__rust_",
            "<tikv_jemallocator::",
        ]
        .iter()
        .any(|p| name.starts_with(p))
}

/// Makes the resolved profile read like a heap profile: the allocator's own frames are cut
/// off the leaf end of every stack (as jeprof does), so the innermost frame is the code
/// that allocated; and every mapping says its functions, files and lines are already
/// resolved, so `go tool pprof` does not try to symbolize again from the binary.
pub fn tidy(p: &mut pprof::protos::Profile) {
    use std::collections::HashMap;
    let internal: HashMap<u64, bool> = {
        let string = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
        let allocator: HashMap<u64, bool> = p
            .function
            .iter()
            .map(|f| (f.id, allocator_frame(string(f.name), string(f.filename))))
            .collect();
        p.location
            .iter()
            .map(|l| {
                let all_allocator = !l.line.is_empty()
                    && l.line
                        .iter()
                        .all(|line| allocator.get(&line.function_id).copied().unwrap_or(false));
                (l.id, all_allocator)
            })
            .collect()
    };
    for s in &mut p.sample {
        let keep = s
            .location_id
            .iter()
            .position(|id| !internal.get(id).copied().unwrap_or(false))
            .unwrap_or(s.location_id.len());
        // A stack made only of allocator frames keeps them rather than vanishing.
        if keep < s.location_id.len() {
            s.location_id.drain(..keep);
        }
    }
    for m in &mut p.mapping {
        m.has_functions = true;
        m.has_filenames = true;
        m.has_line_numbers = true;
        m.has_inline_frames = true;
    }
}

/// Gzipped protobuf of `p`.
pub fn encode(p: &pprof::protos::Profile) -> Result<Vec<u8>, HeapError> {
    use pprof::protos::Message;
    use std::io::Write;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&p.encode_to_vec())
        .and_then(|_| gz.finish())
        .map_err(|e| HeapError::Profiler(format!("gzip: {e}")))
}

/// Flamegraph SVG of `p` (widths are the first sample value, bytes), or a valid SVG that
/// says there were no samples (inferno writes nothing then).
pub fn flamegraph(p: &pprof::protos::Profile, title: String) -> Result<String, HeapError> {
    use std::collections::{BTreeMap, HashMap};
    let locations: HashMap<u64, &pprof::protos::Location> =
        p.location.iter().map(|l| (l.id, l)).collect();
    let functions: HashMap<u64, &str> = p
        .function
        .iter()
        .map(|f| {
            let name = p
                .string_table
                .get(f.name as usize)
                .map_or("?", String::as_str);
            (f.id, name)
        })
        .collect();
    // Root first; within a location the outermost inlined function first. `;` separates
    // frames in inferno's input, so it cannot stay inside a name (`[u8; 4]`).
    let mut stacks: BTreeMap<String, u64> = BTreeMap::new();
    for s in &p.sample {
        let bytes = s.value.first().map_or(0, |&v| v.max(0) as u64);
        if bytes == 0 {
            continue;
        }
        let mut frames = Vec::new();
        for id in s.location_id.iter().rev() {
            match locations.get(id) {
                Some(l) if !l.line.is_empty() => {
                    for line in l.line.iter().rev() {
                        let name = functions.get(&line.function_id).copied().unwrap_or("?");
                        frames.push(name.replace(';', ","));
                    }
                }
                Some(l) => frames.push(format!("{:#x}", l.address)),
                None => frames.push("?".to_owned()),
            }
        }
        if frames.is_empty() {
            frames.push("?".to_owned());
        }
        *stacks.entry(frames.join(";")).or_default() += bytes;
    }
    if stacks.is_empty() {
        return Ok(format!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"600\" height=\"60\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"10\" y=\"30\">{title}: no samples (nothing sampled is still live)</text></svg>\n"
        ));
    }
    let lines: Vec<String> = stacks.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let mut opts = pprof::flamegraph::Options::default();
    opts.title = title;
    opts.count_name = "bytes".to_owned();
    let mut svg = Vec::new();
    pprof::flamegraph::from_lines(&mut opts, lines.iter().map(String::as_str), &mut svg)
        .map_err(|e| HeapError::Profiler(format!("flamegraph: {e}")))?;
    String::from_utf8(svg).map_err(|e| HeapError::Profiler(e.to_string()))
}

/// Reads a gzipped pprof protobuf.
pub fn decode(gz: &[u8]) -> Result<pprof::protos::Profile, HeapError> {
    use pprof::protos::Message;
    use std::io::Read;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut raw)
        .map_err(|e| HeapError::Profiler(format!("pprof is not gzip: {e}")))?;
    pprof::protos::Profile::decode(raw.as_slice())
        .map_err(|e| HeapError::Profiler(format!("pprof does not decode: {e}")))
}

/// Sum of the first value of every sample.
pub fn total(p: &pprof::protos::Profile) -> u64 {
    p.sample
        .iter()
        .filter_map(|s| s.value.first())
        .map(|&v| v.max(0) as u64)
        .sum()
}

/// Whether a frame is the Rust standard library's: its source is under
/// `/rustc/<hash>/library/`, or (std's own compiled code has no file) its path says so.
fn std_frame(name: &str, file: &str) -> bool {
    const STD: &[&str] = &[
        "alloc::", "<alloc::", "core::", "<core::", "std::", "<std::",
    ];
    file.starts_with("/rustc/") || STD.iter().any(|p| name.starts_with(p))
}

/// The `n` functions with most self bytes (ties by name). A sample's self bytes go to its
/// allocation site: the innermost frame outside the Rust standard library (`Vec` growth,
/// `Box::new` and the like are how memory is asked for, not who asks), or the innermost
/// frame if every frame is std's. Total counts each function once per sample. Inlined
/// frames carry only a short name (`with_capacity`); those get their source file.
pub fn top_functions(p: &pprof::protos::Profile, n: usize) -> Vec<HeapTopFunction> {
    use std::collections::{HashMap, HashSet};
    let string = |i: i64| p.string_table.get(i as usize).map_or("", String::as_str);
    let locations: HashMap<u64, &pprof::protos::Location> =
        p.location.iter().map(|l| (l.id, l)).collect();
    // Per function: (shown name, is std).
    let functions: HashMap<u64, (String, bool)> = p
        .function
        .iter()
        .map(|f| {
            let (name, file) = (string(f.name), string(f.filename));
            let shown = if name.contains("::") || !file.ends_with(".rs") {
                name.to_owned()
            } else {
                format!("{name} ({})", super::profile::short_path(file))
            };
            (f.id, (shown, std_frame(name, file)))
        })
        .collect();
    let unknown = ("?".to_owned(), false);
    let mut by_fn: HashMap<String, (u64, u64)> = HashMap::new();
    for sample in &p.sample {
        let bytes = sample.value.first().map_or(0, |&v| v.max(0) as u64);
        // Leaf first: location_id[0] is the leaf; within a location, line[0] is the
        // innermost inlined function.
        let frames: Vec<&(String, bool)> = sample
            .location_id
            .iter()
            .filter_map(|id| locations.get(id))
            .flat_map(|l| l.line.iter())
            .map(|line| functions.get(&line.function_id).unwrap_or(&unknown))
            .collect();
        if let Some(site) = frames.iter().find(|f| !f.1).or(frames.first()) {
            by_fn.entry(site.0.clone()).or_default().0 += bytes;
        }
        let mut seen = HashSet::new();
        for f in &frames {
            if seen.insert(&f.0) {
                by_fn.entry(f.0.clone()).or_default().1 += bytes;
            }
        }
    }
    super::profile::ranked(by_fn, n)
        .into_iter()
        .map(|(function, self_bytes, total_bytes)| HeapTopFunction {
            function,
            self_bytes,
            total_bytes,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pprof::protos::{Function, Line, Location, Profile, Sample};

    #[test]
    fn one_capture_at_a_time() {
        let a = HeapSlot::try_take().unwrap();
        assert!(matches!(HeapSlot::try_take(), Err(HeapError::Busy)));
        drop(a);
        assert!(HeapSlot::try_take().is_ok());
    }

    #[test]
    fn self_bytes_go_to_the_innermost_frame_outside_std() {
        let strings = [
            "",
            "alloc",
            "outer",
            "recurse",
            "/rustc/abc/library/alloc/src/alloc.rs",
        ]
        .map(String::from)
        .to_vec();
        let f = |id, name, filename| Function {
            id,
            name,
            filename,
            ..Default::default()
        };
        let loc = |id, fs: &[u64]| Location {
            id,
            line: fs
                .iter()
                .map(|&function_id| Line {
                    function_id,
                    line: 1,
                })
                .collect(),
            ..Default::default()
        };
        let sample = |location_id: Vec<u64>, v| Sample {
            location_id,
            value: vec![v],
            ..Default::default()
        };
        let p = Profile {
            string_table: strings,
            function: vec![f(1, 1, 4), f(2, 2, 0), f(3, 3, 0)],
            // location 1: std's alloc inlined into recurse; 2: recurse; 3: outer; 4: alloc.
            location: vec![loc(1, &[1, 3]), loc(2, &[3]), loc(3, &[2]), loc(4, &[1])],
            sample: vec![
                sample(vec![1, 2, 3], 1000),
                sample(vec![3], 10),
                sample(vec![4], 5),
            ],
            ..Default::default()
        };
        assert_eq!(total(&p), 1015);
        let top = top_functions(&p, 10);
        let row = |n: &str| {
            top.iter()
                .find(|t| t.function == n)
                .map(|t| (t.self_bytes, t.total_bytes))
        };
        assert_eq!(row("recurse"), Some((1000, 1000)), "{top:?}");
        assert_eq!(row("outer"), Some((10, 1010)));
        // Only std frames: the innermost one, shown with its source file.
        assert_eq!(row("alloc (alloc/src/alloc.rs)"), Some((5, 1005)));
        assert_eq!(top[0].function, "recurse");
        assert_eq!(top_functions(&p, 1).len(), 1);
    }

    #[test]
    fn allocator_frames_are_cut_from_the_leaf_end_only() {
        let strings = [
            "",
            "do_rallocx",
            "_rjem_malloc",
            "alloc::raw_vec::finish_grow",
            "im_server::gateway::conn::accept",
            "/t/build/tikv-jemalloc-sys-0123/out/build/src/jemalloc.c",
        ]
        .map(String::from)
        .to_vec();
        let f = |id, name| Function {
            id,
            name,
            filename: if name == 1 { 5 } else { 0 },
            ..Default::default()
        };
        let loc = |id, function_id| Location {
            id,
            line: vec![Line {
                function_id,
                line: 1,
            }],
            ..Default::default()
        };
        let mut p = Profile {
            string_table: strings,
            function: vec![f(1, 1), f(2, 2), f(3, 3), f(4, 4)],
            location: vec![loc(1, 1), loc(2, 2), loc(3, 3), loc(4, 4)],
            mapping: vec![pprof::protos::Mapping {
                id: 1,
                ..Default::default()
            }],
            sample: vec![
                Sample {
                    location_id: vec![1, 2, 3, 4],
                    value: vec![524288],
                    ..Default::default()
                },
                Sample {
                    location_id: vec![1, 2],
                    value: vec![100],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        tidy(&mut p);
        assert_eq!(p.sample[0].location_id, [3, 4]);
        assert_eq!(
            p.sample[1].location_id,
            [1, 2],
            "nothing else to show: kept"
        );
        assert!(p.mapping[0].has_functions && p.mapping[0].has_line_numbers);
        let top = top_functions(&p, 10);
        // std's `finish_grow` is how; the site is the caller.
        assert_eq!(top[0].function, "im_server::gateway::conn::accept");
        assert_eq!(top[0].self_bytes, 524288);
        let svg = flamegraph(&p, "t".into()).unwrap();
        assert!(svg.contains("im_server::gateway::conn::accept"), "{svg}");
        // The encoded profile decodes to the same thing.
        assert_eq!(decode(&encode(&p).unwrap()).unwrap(), p);
    }

    #[test]
    fn an_empty_profile_is_a_valid_svg() {
        let svg = flamegraph(&Profile::default(), "t".into()).unwrap();
        assert!(svg.contains("<svg") && svg.contains("no samples"));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(decode(b"not gzip").is_err());
    }
}
