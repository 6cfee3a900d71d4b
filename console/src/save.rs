//! Save: writes a CPU or heap profile bundle to a folder as `<name>.svg` (flamegraph) and
//! `<name>.pb.gz` (the pprof protobuf, base64-decoded; the node sends it gzipped).

use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::api::{HeapProfileBundle, ProfileBundle};
use crate::state::{ProfileKind, ProfileResult};

/// Why the files could not be written.
#[derive(Debug, thiserror::Error)]
pub enum SaveError {
    /// The folder could not be created.
    #[error("create {path}: {source}")]
    Dir {
        /// The folder.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file could not be written.
    #[error("write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `pprof_gz_base64` is not valid base64.
    #[error("pprof_gz_base64 is not base64: {0}")]
    Base64(String),
}

/// File-name-safe version of a node name.
fn safe(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "node".into()
    } else {
        s
    }
}

/// Writes the bundle's files into `dir` (created if missing) as
/// `im-cpu-<node>-<unix_secs>.{svg,pb.gz}`; returns (svg, pprof) paths, each `None` if
/// the bundle had no such part.
pub fn save_bundle(
    dir: &Path,
    node: &str,
    bundle: &ProfileBundle,
    unix_secs: u64,
) -> Result<(Option<PathBuf>, Option<PathBuf>), SaveError> {
    save_files(
        dir,
        &format!("im-cpu-{}-{unix_secs}", safe(node)),
        &bundle.svg,
        &bundle.pprof_gz_base64,
    )
}

/// Writes `<stem>.svg` and `<stem>.pb.gz` (from base64) into `dir`, each if not empty.
fn save_files(
    dir: &Path,
    stem: &str,
    svg: &str,
    pprof_gz_base64: &str,
) -> Result<(Option<PathBuf>, Option<PathBuf>), SaveError> {
    std::fs::create_dir_all(dir).map_err(|source| SaveError::Dir {
        path: dir.to_owned(),
        source,
    })?;
    let write = |path: PathBuf, bytes: &[u8]| -> Result<PathBuf, SaveError> {
        std::fs::write(&path, bytes).map_err(|source| SaveError::Write {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    };
    let svg = if svg.is_empty() {
        None
    } else {
        Some(write(dir.join(format!("{stem}.svg")), svg.as_bytes())?)
    };
    let pprof = if pprof_gz_base64.is_empty() {
        None
    } else {
        let cleaned: String = pprof_gz_base64
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(cleaned)
            .map_err(|e| SaveError::Base64(e.to_string()))?;
        Some(write(dir.join(format!("{stem}.pb.gz")), &bytes)?)
    };
    Ok((svg, pprof))
}

/// Saves the bundle and folds the outcome into the [`ProfileResult`] the console keeps.
pub fn save_result(dir: &Path, node: &str, bundle: ProfileBundle, unix_secs: u64) -> ProfileResult {
    match save_bundle(dir, node, &bundle, unix_secs) {
        Ok((svg, pprof)) => cpu_result(bundle, svg, pprof, None),
        Err(e) => cpu_result(bundle, None, None, Some(e.to_string())),
    }
}

/// The [`ProfileResult`] of a CPU bundle saved to `svg_path` and `pprof_path` (or not:
/// `save_error` says why).
pub fn cpu_result(
    bundle: ProfileBundle,
    svg_path: Option<PathBuf>,
    pprof_path: Option<PathBuf>,
    save_error: Option<String>,
) -> ProfileResult {
    ProfileResult {
        kind: ProfileKind::Cpu,
        seconds: bundle.seconds as f64,
        frequency: bundle.frequency,
        samples: bundle.samples,
        total: bundle.samples,
        top: bundle.top.into_iter().map(Into::into).collect(),
        svg_path,
        pprof_path,
        save_error,
    }
}

/// Saves a heap bundle as `im-heap-<node>-<unix_secs>.{svg,pb.gz}` and folds the outcome
/// into the [`ProfileResult`] the console keeps.
pub fn save_heap_result(
    dir: &Path,
    node: &str,
    bundle: HeapProfileBundle,
    unix_secs: u64,
) -> ProfileResult {
    let stem = format!("im-heap-{}-{unix_secs}", safe(node));
    let (svg_path, pprof_path, save_error) =
        match save_files(dir, &stem, &bundle.svg, &bundle.pprof_gz_base64) {
            Ok((s, p)) => (s, p, None),
            Err(e) => (None, None, Some(e.to_string())),
        };
    ProfileResult {
        kind: ProfileKind::Heap,
        seconds: bundle.seconds as f64,
        frequency: 0,
        samples: bundle.stacks,
        total: bundle.inuse_bytes,
        top: bundle.top.into_iter().map(Into::into).collect(),
        svg_path,
        pprof_path,
        save_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_both_files() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("profiles");
        let b = ProfileBundle {
            svg: "<svg/>".into(),
            // gzip magic + a byte, base64.
            pprof_gz_base64: base64::engine::general_purpose::STANDARD.encode([0x1f, 0x8b, 8]),
            ..ProfileBundle::default()
        };
        let r = save_result(&sub, "node/a", b, 42);
        assert_eq!(r.save_error, None);
        let svg = r.svg_path.unwrap();
        assert!(svg.ends_with("im-cpu-node_a-42.svg"));
        assert_eq!(std::fs::read(&svg).unwrap(), b"<svg/>");
        assert_eq!(
            std::fs::read(r.pprof_path.unwrap()).unwrap(),
            [0x1f, 0x8b, 8]
        );
    }

    #[test]
    fn heap_bundles_are_saved_as_heap_files() {
        let dir = tempfile::tempdir().unwrap();
        let b = HeapProfileBundle {
            seconds: 5,
            inuse_bytes: 4096,
            stacks: 3,
            svg: "<svg/>".into(),
            pprof_gz_base64: base64::engine::general_purpose::STANDARD.encode([0x1f, 0x8b]),
            ..HeapProfileBundle::default()
        };
        let r = save_heap_result(dir.path(), "n1", b, 7);
        assert_eq!(r.save_error, None);
        assert_eq!((r.kind, r.total, r.samples), (ProfileKind::Heap, 4096, 3));
        assert!(r.svg_path.unwrap().ends_with("im-heap-n1-7.svg"));
        assert!(r.pprof_path.unwrap().ends_with("im-heap-n1-7.pb.gz"));
    }

    #[test]
    fn bad_base64_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let b = ProfileBundle {
            pprof_gz_base64: "!!!".into(),
            ..ProfileBundle::default()
        };
        let r = save_result(dir.path(), "a", b, 1);
        assert!(r.save_error.unwrap().contains("base64"));
    }
}
