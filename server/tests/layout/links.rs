//! The top-level documents stay short and point at files that exist: README.md under 200
//! lines, and every relative link of README.md, ARCHITECTURE.md, `docs/*.md` and the crate
//! READMEs they send readers to resolves to a file (and its `#anchor`, when it names one,
//! to a heading of that file).

use std::fs;
use std::path::{Path, PathBuf};

/// Most lines README.md may have.
const README_MAX_LINES: usize = 200;

/// The documents whose links are checked, relative to the repository root.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "console/README.md",
        "bench/README.md",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    for entry in fs::read_dir(root.join("docs")).expect("reading docs/") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_some_and(|e| e == "md") {
            out.push(
                path.strip_prefix(root)
                    .expect("under the root")
                    .to_path_buf(),
            );
        }
    }
    out.sort();
    out
}

/// The targets of the inline links (`[text](target)`) of `markdown`, outside code blocks,
/// with their line numbers.
fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (n, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push((n + 1, after[..end].to_owned()));
            rest = &after[end..];
        }
    }
    out
}

/// A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to `-`.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of the headings of `markdown`.
fn anchors(markdown: &str) -> Vec<String> {
    markdown
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| anchor(l.trim_start_matches('#')))
        .collect()
}

/// What is wrong with link `target` of document `doc`: `Err` when it is broken.
fn check(root: &Path, doc: &Path, target: &str) -> Result<(), String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return Ok(());
    }
    let (file, fragment) = target.split_once('#').unwrap_or((target, ""));
    let doc_dir = doc.parent().unwrap_or(Path::new(""));
    let path = if file.is_empty() {
        doc.to_path_buf()
    } else {
        normalize(&doc_dir.join(file))
    };
    if !root.join(&path).exists() {
        return Err(format!(
            "{} -> {target}: no file {}",
            doc.display(),
            path.display()
        ));
    }
    if !fragment.is_empty() && path.extension().is_some_and(|e| e == "md") {
        let text = fs::read_to_string(root.join(&path)).unwrap_or_default();
        if !anchors(&text).iter().any(|a| a == fragment) {
            return Err(format!(
                "{} -> {target}: no heading #{fragment} in {}",
                doc.display(),
                path.display()
            ));
        }
    }
    Ok(())
}

/// `path` with its `..` and `.` components folded (it stays relative to the root).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn the_readme_is_short() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = fs::read_to_string(root.join("README.md")).expect("reading README.md");
    let lines = readme.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines; keep it under {README_MAX_LINES} and move the rest to docs/"
    );
}

#[test]
fn every_relative_link_resolves() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut broken = Vec::new();
    for doc in documents(&root) {
        let text = fs::read_to_string(root.join(&doc)).expect("reading a document");
        for (line, target) in links(&text) {
            if let Err(e) = check(&root, &doc, &target) {
                broken.push(format!("line {line}: {e}"));
            }
        }
    }
    assert!(
        broken.is_empty(),
        "broken links:\n  {}",
        broken.join("\n  ")
    );
}

#[test]
fn links_and_anchors_parse() {
    let md = "See [a](docs/a.md#the-b-part) and [c](http://x/).\n```\n[no](nowhere.md)\n```\n";
    assert_eq!(
        links(md),
        [
            (1, "docs/a.md#the-b-part".to_owned()),
            (1, "http://x/".to_owned())
        ]
    );
    assert_eq!(anchor(" The `b` part, again"), "the-b-part-again");
    assert_eq!(
        normalize(Path::new("docs/../bench/./README.md")),
        PathBuf::from("bench/README.md")
    );
}
