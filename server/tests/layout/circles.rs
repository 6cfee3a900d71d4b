//! No import circle between sibling modules, at any level, in any crate of the workspace.
//!
//! Each crate's module tree is read from its `mod` declarations (from `src/lib.rs` and
//! `src/main.rs`). Every path a module's code names through `crate::`, `super::`, `self::`,
//! one of its child modules or one of its own imports is followed, through `use`
//! declarations (re-exports included), to the deepest module it reaches: that is a
//! reference from the module to that one. Under each parent, a reference from one child's
//! subtree into another's is an edge between those two children, and any cycle among the
//! children of one parent fails the test, named with one reference per step. A parent's
//! own file is not one of its children: a child may use its parent's items (a shared
//! helper in `mod.rs`) while the parent calls into the child; what is refused is two
//! siblings (or a longer ring of them) that each need the other, which is what keeps a
//! module from being moved, tested or read without the rest.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::source::{module_code, ModuleCode, PathRef};

/// A module's path from its crate root (empty: the root).
type ModPath = Vec<String>;

/// One module: where it is and what its own code holds.
struct Module {
    file: PathBuf,
    code: ModuleCode,
    children: BTreeSet<String>,
}

/// A crate's module tree.
type Tree = BTreeMap<ModPath, Module>;

/// A reference from one module to another, with where it was written.
#[derive(Clone)]
struct Reference {
    from: ModPath,
    to: ModPath,
    at: String,
}

/// Reads the module tree rooted at `root` (a `lib.rs` or `main.rs`).
fn load_tree(root: &Path) -> Result<Tree, String> {
    let mut tree = Tree::new();
    let dir = root.parent().unwrap_or(Path::new(".")).to_path_buf();
    load_module(root, &dir, Vec::new(), None, &mut tree)?;
    Ok(tree)
}

/// Loads one module from `file` (or from `inline` code within it); its file children
/// live in `dir`.
fn load_module(
    file: &Path,
    dir: &Path,
    path: ModPath,
    inline: Option<ModuleCode>,
    tree: &mut Tree,
) -> Result<(), String> {
    let code = match inline {
        Some(code) => code,
        None => {
            let text =
                fs::read_to_string(file).map_err(|e| format!("reading {}: {e}", file.display()))?;
            module_code(&text)
        }
    };
    let mut children = BTreeSet::new();
    for name in &code.file_children {
        let flat = dir.join(format!("{name}.rs"));
        let nested = dir.join(name).join("mod.rs");
        let child_file = if flat.is_file() { flat } else { nested };
        let mut child = path.clone();
        child.push(name.clone());
        load_module(&child_file, &dir.join(name), child, None, tree)?;
        children.insert(name.clone());
    }
    for (name, body) in &code.inline_children {
        let mut child = path.clone();
        child.push(name.clone());
        load_module(file, &dir.join(name), child, Some(body.clone()), tree)?;
        children.insert(name.clone());
    }
    let module = Module {
        file: file.to_path_buf(),
        code,
        children,
    };
    tree.insert(path, module);
    Ok(())
}

/// The deepest module `segments` reaches from module `base`, or `None` when the path does
/// not start inside the crate (an extern crate, a local item, a type's associated item).
fn resolve(tree: &Tree, base: &[String], segments: &[String], depth: usize) -> Option<ModPath> {
    let mut at: ModPath = base.to_vec();
    for (i, segment) in segments.iter().enumerate() {
        let module = tree.get(&at)?;
        match segment.as_str() {
            "crate" if i == 0 => at.clear(),
            "super" if i == 0 || segments[..i].iter().all(|s| s == "super" || s == "self") => {
                at.pop()?;
            }
            "self" if i == 0 => {}
            name if module.children.contains(name) => at.push(name.to_owned()),
            name => {
                let import = module
                    .code
                    .uses
                    .iter()
                    .find(|u| u.alias.as_deref() == Some(name) && depth < 16);
                match import {
                    Some(u) if u.segments.len() > 1 || i > 0 => {
                        at = resolve(tree, &at, &u.segments, depth + 1)?;
                    }
                    _ if i == 0 => return None,
                    _ => return Some(at),
                }
            }
        }
    }
    Some(at)
}

/// Every reference between two different modules of the tree.
fn references(tree: &Tree, crate_dir: &Path) -> Vec<Reference> {
    let mut out = Vec::new();
    for (path, module) in tree {
        let refs: Vec<&PathRef> = module.code.uses.iter().chain(&module.code.paths).collect();
        for r in refs {
            let Some(to) = resolve(tree, path, &r.segments, 0) else {
                continue;
            };
            if &to != path {
                let file = module.file.strip_prefix(crate_dir).unwrap_or(&module.file);
                let at = format!("{}:{} `{}`", file.display(), r.line, r.segments.join("::"));
                out.push(Reference {
                    from: path.clone(),
                    to,
                    at,
                });
            }
        }
    }
    out
}

/// The edge a reference makes among the children of one parent: (parent, from, to), or
/// `None` when it runs between a module and one of its ancestors or descendants.
fn sibling_edge(r: &Reference) -> Option<(ModPath, String, String)> {
    let common = r.from.iter().zip(&r.to).take_while(|(a, b)| a == b).count();
    let from = r.from.get(common)?.clone();
    let to = r.to.get(common)?.clone();
    Some((r.from[..common].to_vec(), from, to))
}

/// Edges among one parent's children: from -> to -> the reference that makes it.
type SiblingGraph = BTreeMap<String, BTreeMap<String, String>>;

/// The cycles among siblings, each named with its references.
fn cycles(refs: &[Reference]) -> Vec<String> {
    let mut parents: BTreeMap<ModPath, SiblingGraph> = BTreeMap::new();
    for r in refs {
        if let Some((parent, from, to)) = sibling_edge(r) {
            let graph = parents.entry(parent).or_default();
            graph
                .entry(from)
                .or_default()
                .entry(to)
                .or_insert_with(|| r.at.clone());
        }
    }
    let mut out = Vec::new();
    for (parent, graph) in &parents {
        let name = if parent.is_empty() {
            "the crate root".to_owned()
        } else {
            parent.join("::")
        };
        for cycle in graph_cycles(graph) {
            let steps: Vec<String> = cycle
                .windows(2)
                .map(|w| format!("{} -> {} ({})", w[0], w[1], graph[&w[0]][&w[1]]))
                .collect();
            out.push(format!(
                "under `{name}`: {}\n      {}",
                cycle.join(" -> "),
                steps.join("\n      ")
            ));
        }
    }
    out
}

/// One cycle per strongly connected group of nodes, as the path that closes it.
fn graph_cycles(graph: &SiblingGraph) -> Vec<Vec<String>> {
    let mut seen: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for start in graph.keys() {
        if seen.contains(start) {
            continue;
        }
        if let Some(cycle) = cycle_through(graph, start) {
            seen.extend(cycle.iter().cloned());
            out.push(cycle);
        }
    }
    out
}

/// The shortest cycle from `start` back to itself (breadth first), if any.
fn cycle_through(graph: &SiblingGraph, start: &str) -> Option<Vec<String>> {
    let mut came_from: BTreeMap<String, String> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.to_owned()]);
    while let Some(node) = queue.pop_front() {
        for next in graph.get(&node).into_iter().flat_map(|m| m.keys()) {
            if next == start {
                let mut path = vec![node.clone()];
                while path.last().is_some_and(|at| at != start) {
                    let at = path.last().cloned().unwrap_or_default();
                    path.push(came_from[&at].clone());
                }
                path.reverse();
                path.push(start.to_owned());
                return Some(path);
            }
            if !came_from.contains_key(next) && next != start {
                came_from.insert(next.clone(), node.clone());
                queue.push_back(next.clone());
            }
        }
    }
    None
}

/// The workspace's member crates, from the root manifest's `members = [...]`.
fn members(root: &Path) -> Vec<String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).expect("reading Cargo.toml");
    let line = manifest
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("the workspace manifest lists its members");
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Every sibling cycle of every crate root (library and binary) of the workspace, and
/// how many references between modules were followed.
pub fn workspace_cycles(root: &Path) -> (Vec<String>, usize) {
    let (mut out, mut followed) = (Vec::new(), 0);
    for member in members(root) {
        for target in ["lib.rs", "main.rs"] {
            let file = root.join(&member).join("src").join(target);
            if !file.is_file() {
                continue;
            }
            let tree = match load_tree(&file) {
                Ok(tree) => tree,
                Err(e) => {
                    out.push(format!("{member}/src/{target}: {e}"));
                    continue;
                }
            };
            let refs = references(&tree, &root.join(&member));
            followed += refs.len();
            for cycle in cycles(&refs) {
                out.push(format!("{member} ({target}) {cycle}"));
            }
        }
    }
    (out, followed)
}

#[test]
fn no_crate_has_an_import_circle() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let (found, followed) = workspace_cycles(&root);
    assert!(
        followed > 1000,
        "only {followed} references between modules were found"
    );
    assert!(
        found.is_empty(),
        "import circles between sibling modules:\n  {}",
        found.join("\n  ")
    );
}

#[test]
fn the_check_sees_circles_through_imports_and_parents() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let src = dir.path().join("src");
    let write = |name: &str, text: &str| {
        let path = src.join(name);
        fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        fs::write(path, text).expect("writing a source file");
    };
    write("lib.rs", "mod a;\nmod b;\nmod c;\npub use a::X;\n");
    write("a.rs", "use crate::b;\npub struct X;\nfn f() { b::g(); }\n");
    write("b.rs", "pub fn g() { crate::X; }\n");
    // Under c: d and e need each other; c's own file calls d, and d uses c's item.
    write(
        "c/mod.rs",
        "mod d;\nmod e;\npub struct Y;\nfn h() { d::i(); }\n",
    );
    write("c/d.rs", "use super::Y;\npub fn i() { super::e::j(); }\n");
    write("c/e.rs", "use super::d::i;\npub fn j() {}\n");
    let tree = load_tree(&src.join("lib.rs")).expect("loads");
    let found = cycles(&references(&tree, dir.path()));
    assert_eq!(found.len(), 2, "{found:#?}");
    assert!(
        found[0].starts_with("under `the crate root`: a -> b -> a"),
        "{}",
        found[0]
    );
    assert!(
        found[0].contains("b -> a (src/b.rs:1 `crate::X`)"),
        "{}",
        found[0]
    );
    assert!(
        found[1].starts_with("under `c`: d -> e -> d"),
        "{}",
        found[1]
    );
    assert!(
        found[1].contains("e -> d (src/c/e.rs:1 `super::d::i`)"),
        "{}",
        found[1]
    );
}
