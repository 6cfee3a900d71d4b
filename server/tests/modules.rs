//! The module graph of im-server against the code map: every `crate::<module>` path in
//! `server/src` (a `use` or an inline path; comments are skipped) is a call from the
//! file's top-level module to that module, and each module's "Calls" sentence in
//! ARCHITECTURE.md ("im-server modules") must name exactly the modules it calls. A path
//! to an item of `lib.rs` itself (`crate::Node`) is a call to "the crate root", declared
//! with those words. Top-level modules may not import each other in a cycle; the crate
//! root, which wires them all together, is left out of that check.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

use common::rust_files;

/// The crate root's name in the tables.
const ROOT: &str = "crate root";

/// Module -> the modules it calls.
type Graph = BTreeMap<String, BTreeSet<String>>;

/// The top-level modules: `src/<m>.rs` and `src/<m>/mod.rs`, except the binary and root.
fn modules(src: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for entry in fs::read_dir(src).expect("reading server/src") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_stem()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        let module_dir = path.is_dir() && path.join("mod.rs").is_file();
        let module_file =
            path.extension().is_some_and(|e| e == "rs") && name != "lib" && name != "main";
        if module_dir || module_file {
            out.insert(name);
        }
    }
    out
}

/// `text` without `//` line comments and `/* */` block comments (doc links are not calls).
fn strip_comments(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_block = 0usize;
    for line in text.lines() {
        let mut rest = line;
        loop {
            if in_block > 0 {
                match rest.find("*/") {
                    Some(i) => {
                        in_block -= 1;
                        rest = &rest[i + 2..];
                        continue;
                    }
                    None => break,
                }
            }
            let line_comment = rest.find("//");
            let block = rest.find("/*");
            match (line_comment, block) {
                (Some(l), Some(b)) if b < l => {
                    out.push_str(&rest[..b]);
                    in_block += 1;
                    rest = &rest[b + 2..];
                }
                (None, Some(b)) => {
                    out.push_str(&rest[..b]);
                    in_block += 1;
                    rest = &rest[b + 2..];
                }
                (Some(l), _) => {
                    out.push_str(&rest[..l]);
                    break;
                }
                (None, None) => {
                    out.push_str(rest);
                    break;
                }
            }
        }
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segments after each `crate::` in `code` (each member of a
/// `crate::{a::x, b}` group counts).
fn crate_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = code[from..].find("crate::") {
        let at = from + i;
        from = at + "crate::".len();
        if code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| is_ident(c) || c == '$')
        {
            continue;
        }
        let rest = &code[from..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item = String::new();
            let mut items = Vec::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => items.push(std::mem::take(&mut item)),
                    _ if depth == 0 => item.push(c),
                    _ => {}
                }
            }
            items.push(item);
            for item in items {
                let name: String = item.trim().chars().take_while(|c| is_ident(*c)).collect();
                if !name.is_empty() && name != "self" {
                    out.push(name);
                }
            }
        } else {
            let name: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// What each top-level module of `src` calls (the crate root's own calls left out).
fn actual_calls(src: &Path) -> Graph {
    let mods = modules(src);
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mut graph: Graph = mods.iter().map(|m| (m.clone(), BTreeSet::new())).collect();
    for file in files {
        let rel = file.strip_prefix(src).expect("a file under src");
        let first = rel
            .components()
            .next()
            .and_then(|c| c.as_os_str().to_str())
            .unwrap_or_default();
        let from = first.strip_suffix(".rs").unwrap_or(first);
        if !mods.contains(from) {
            // lib.rs (the root wires every module) and main.rs (the binary, which
            // goes through the library's public API).
            continue;
        }
        let text = fs::read_to_string(&file).expect("reading a source file");
        for name in crate_paths(&strip_comments(&text)) {
            let to = if mods.contains(&name) {
                name
            } else {
                ROOT.to_owned()
            };
            if to != from {
                graph.get_mut(from).expect("a known module").insert(to);
            }
        }
    }
    graph
}

/// The "Calls" sentence of each module in the "im-server modules" section of the code
/// map: the backticked module names in it (`a::b` counts as `a`), plus [`ROOT`] when it
/// says "crate root". Errors name what is malformed.
fn declared_calls(map: &str, mods: &BTreeSet<String>) -> Result<Graph, String> {
    let start = map
        .find("## im-server modules")
        .ok_or("ARCHITECTURE.md has no \"## im-server modules\" section")?;
    let section = &map[start..];
    let section = match section[3..].find("\n## ") {
        Some(end) => &section[..end + 3],
        None => section,
    };
    let mut out = Graph::new();
    let mut blocks = section.split("\n**`").skip(1);
    for block in blocks.by_ref() {
        let Some((name, body)) = block.split_once("`**") else {
            return Err(format!(
                "a module heading without its closing `**: {block:.40}"
            ));
        };
        let body = body.replace('\n', " ");
        let calls: Vec<&str> = body
            .match_indices("Calls ")
            .map(|(i, _)| &body[i..])
            .collect();
        let [sentence] = calls[..] else {
            return Err(format!(
                "module `{name}` has {} \"Calls\" sentences in ARCHITECTURE.md; it needs exactly one",
                calls.len()
            ));
        };
        let end = sentence.find(". ").unwrap_or(sentence.len());
        let sentence = &sentence[..end];
        let mut set = BTreeSet::new();
        if sentence.contains(ROOT) {
            set.insert(ROOT.to_owned());
        }
        for (i, quoted) in sentence.split('`').enumerate() {
            if i % 2 == 1 {
                let first = quoted.split("::").next().unwrap_or_default();
                if mods.contains(first) && first != name {
                    set.insert(first.to_owned());
                }
            }
        }
        if out.insert(name.to_owned(), set).is_some() {
            return Err(format!(
                "module `{name}` has two paragraphs in ARCHITECTURE.md"
            ));
        }
    }
    Ok(out)
}

/// A cycle among the modules (crate root left out), as the path that closes it.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        stack: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = stack.iter().position(|n| n == node) {
            let mut cycle = stack[i..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if next == ROOT {
                continue;
            }
            if let Some(c) = visit(next, graph, stack, done) {
                return Some(c);
            }
        }
        stack.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|n| visit(n, graph, &mut Vec::new(), &mut done))
}

/// Every disagreement between the code's calls and the declared ones, and any cycle.
fn problems(actual: &Graph, declared: &Graph) -> Vec<String> {
    let mut out = Vec::new();
    for (module, calls) in actual {
        let Some(said) = declared.get(module) else {
            out.push(format!(
                "module `{module}` has no paragraph with a \"Calls\" sentence in ARCHITECTURE.md"
            ));
            continue;
        };
        for c in calls.difference(said) {
            out.push(format!(
                "`{module}` calls `{c}`, which its \"Calls\" sentence in ARCHITECTURE.md does not name"
            ));
        }
        for c in said.difference(calls) {
            out.push(format!(
                "ARCHITECTURE.md says `{module}` calls `{c}`, but no `crate::{c}` path is in its code"
            ));
        }
    }
    for module in declared.keys().filter(|m| !actual.contains_key(*m)) {
        out.push(format!(
            "ARCHITECTURE.md describes `{module}`, which is not a module of server/src"
        ));
    }
    if let Some(cycle) = find_cycle(actual) {
        out.push(format!("import cycle: {}", cycle.join(" -> ")));
    }
    out
}

#[test]
fn module_calls_match_the_code_map_and_have_no_cycles() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("src");
    let map = fs::read_to_string(root.join("../ARCHITECTURE.md")).expect("reading ARCHITECTURE.md");
    let actual = actual_calls(&src);
    let declared = match declared_calls(&map, &modules(&src)) {
        Ok(d) => d,
        Err(e) => panic!("{e}"),
    };
    let problems = problems(&actual, &declared);
    assert!(
        problems.is_empty(),
        "the module graph and ARCHITECTURE.md disagree:\n  {}\n(calls found: {actual:#?})",
        problems.join("\n  ")
    );
}

fn graph(edges: &[(&str, &[&str])]) -> Graph {
    edges
        .iter()
        .map(|(m, calls)| (m.to_string(), calls.iter().map(|c| c.to_string()).collect()))
        .collect()
}

#[test]
fn the_check_catches_a_cycle_and_an_undeclared_call() {
    let declared = graph(&[("a", &["b"]), ("b", &["a"]), ("c", &[])]);
    let actual = graph(&[("a", &["b", ROOT]), ("b", &["a"]), ("c", &["a"])]);
    let found = problems(&actual, &declared);
    assert!(
        found.iter().any(|p| p == "import cycle: a -> b -> a"),
        "{found:?}"
    );
    assert!(
        found.iter().any(|p| p.starts_with("`c` calls `a`")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|p| p.starts_with("`a` calls `crate root`")),
        "{found:?}"
    );
    // The crate root closes no cycle.
    let actual = graph(&[("a", &[ROOT]), ("b", &["a"])]);
    assert_eq!(find_cycle(&actual), None);
}

#[test]
fn paths_and_calls_sentences_parse() {
    let code = strip_comments(
        "use crate::{config::{A, B}, obs};\n// crate::admin\nlet x = crate::flow::f(); $crate::no; im_crate::no; /* crate::store */",
    );
    assert_eq!(crate_paths(&code), ["config", "obs", "flow"]);
    let mods: BTreeSet<String> = ["a", "b", "c"].map(String::from).into();
    let map = "## im-server modules\n\n**`a`** owns x. Calls `b::y` (see `c`'s z). More.\n\n**`b`** owns y.\nCalls the crate root (`Node`).\n\n**`c`** owns z. Calls nothing else.\n\n## Next\n\n**`d`** Calls `a`.\n";
    let d = declared_calls(map, &mods).expect("parses");
    assert_eq!(d, graph(&[("a", &["b", "c"]), ("b", &[ROOT]), ("c", &[])]));
}
