//! Helpers the source-layout tests share (`modules.rs`, `layout/functions.rs`): they read
//! `server/src` as text.

use std::fs;
use std::path::{Path, PathBuf};

/// Every `.rs` file under `dir`.
pub fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("reading a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}
