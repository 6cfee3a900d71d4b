//! The wire contract's compatibility check (`scripts/check-wire`, `buf breaking` against
//! the released snapshot in `proto/released/`): it passes on the repository's proto, and
//! it fails, naming the field, on a copy whose `Error.message` was renumbered and on one
//! where an enum value was removed. Needs sdk/ts's `npm ci` (buf); skipped without it
//! unless CI is set.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::dashboards::repo;

fn buf(root: &Path) -> Option<PathBuf> {
    let buf = root.join("sdk/ts/node_modules/.bin/buf");
    if buf.exists() {
        return Some(buf);
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "CI is set and buf is missing: run `cd sdk/ts && npm ci`"
    );
    eprintln!("skipped: no buf at {} (cd sdk/ts && npm ci)", buf.display());
    None
}

/// Runs scripts/check-wire on `proto`: (exit code, stdout + stderr).
fn check_wire(root: &Path, proto: &Path) -> (i32, String) {
    let out = Command::new(root.join("scripts/check-wire"))
        .arg(proto)
        .output()
        .expect("running scripts/check-wire");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

/// A copy of proto/ (with the released snapshot) whose im.proto has `from` replaced by `to`.
fn changed_copy(root: &Path, from: &str, to: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    for rel in ["im/v1/im.proto", "released/im/v1/im.proto"] {
        let dst = dir.path().join(rel);
        std::fs::create_dir_all(dst.parent().unwrap()).unwrap();
        std::fs::copy(root.join("proto").join(rel), &dst).unwrap();
    }
    let p = dir.path().join("im/v1/im.proto");
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(text.contains(from), "the proto no longer has {from:?}");
    std::fs::write(&p, text.replacen(from, to, 1)).unwrap();
    dir
}

#[test]
fn check_wire_passes_on_the_tree_and_fails_on_breaking_changes() {
    let root = repo();
    let Some(_) = buf(&root) else { return };
    let (code, text) = check_wire(&root, &root.join("proto"));
    assert_eq!(
        code, 0,
        "the repository's proto breaks the released one:\n{text}"
    );

    let renumbered = changed_copy(
        &root,
        "message Error {\n  ErrorCode code = 1;\n  string message = 2;",
        "message Error {\n  ErrorCode code = 1;\n  string message = 7;",
    );
    let (code, text) = check_wire(&root, renumbered.path());
    assert_eq!(code, 1, "a renumbered field passed:\n{text}");
    assert!(
        text.contains("\"message\"") && text.contains("\"Error\""),
        "{text}"
    );

    let removed = changed_copy(&root, "  FORBIDDEN = 9;\n", "");
    let (code, text) = check_wire(&root, removed.path());
    assert_eq!(code, 1, "a removed enum value passed:\n{text}");
    assert!(
        text.contains("enum value \"9\"") && text.contains("ErrorCode"),
        "{text}"
    );
}
