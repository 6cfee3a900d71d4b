//! The admin API table of `docs/operations.md` against the admin router: every route the
//! router serves (`.route(routes::NAME, get(..).delete(..))` in `server/src/admin/`, the
//! path from the constant in `admin-api/src/routes.rs`) has a row with its method and path,
//! and every row names a route the router serves.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// The HTTP methods axum's method router is built from.
const METHODS: [&str; 5] = ["get", "post", "put", "delete", "patch"];

/// The route constants of `routes.rs`: name to path.
fn constants(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.trim().strip_prefix("pub const ") else {
            continue;
        };
        let Some((name, value)) = rest.split_once(": &str = \"") else {
            continue;
        };
        let path = value.trim_end_matches("\";");
        out.insert(name.to_owned(), path.to_owned());
    }
    out
}

/// The text between the `(` at `open` and its matching `)`.
fn parenthesized(text: &str, open: usize) -> &str {
    let mut depth = 0;
    for (i, c) in text[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &text[open + 1..open + i];
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced parenthesis at byte {open}");
}

/// The methods of a method router expression such as `get(a).delete(b)`: each method
/// name called at the start or after a `.`.
fn methods(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for m in METHODS {
        let call = format!("{m}(");
        for (at, _) in expr.match_indices(&call) {
            let before = expr[..at].trim_end().chars().last();
            if before.is_none() || before == Some('.') {
                out.push(m.to_uppercase());
            }
        }
    }
    out
}

/// The `(METHOD, constant)` pairs of every `.route(routes::NAME, ..)` in `code`.
fn routed(code: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices(".route(routes::") {
        let args = parenthesized(code, at + ".route".len());
        let (name, expr) = args
            .trim_start_matches("routes::")
            .split_once(',')
            .expect("a route with a handler");
        for m in methods(expr) {
            out.push((m, name.trim().to_owned()));
        }
    }
    out
}

/// The admin router's routes as `METHOD /path`.
fn served(root: &Path) -> BTreeSet<String> {
    let consts = constants(
        &fs::read_to_string(root.join("admin-api/src/routes.rs")).expect("reading routes.rs"),
    );
    let mut out = BTreeSet::new();
    let dir = root.join("server/src/admin");
    for entry in fs::read_dir(&dir).expect("reading server/src/admin") {
        let path = entry.expect("a directory entry").path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let code = fs::read_to_string(&path).expect("reading an admin module");
        for (method, name) in routed(&code) {
            let route = consts
                .get(&name)
                .unwrap_or_else(|| panic!("{}: no constant routes::{name}", path.display()));
            out.insert(format!("{method} {route}"));
        }
    }
    out
}

/// The rows of the admin API table in `operations`: `METHOD /path`, the query dropped.
fn documented(operations: &str) -> BTreeSet<String> {
    let section = operations
        .split("\n## Admin API\n")
        .nth(1)
        .expect("docs/operations.md has an Admin API section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(|route| route.split('?').next().unwrap_or(route).to_owned())
        .collect()
}

#[test]
fn every_admin_route_has_a_row_and_every_row_a_route() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let served = served(&root);
    assert!(
        served.contains("POST /admin/v1/messages") && served.contains("GET /healthz"),
        "the router was not read: {served:?}"
    );
    let operations =
        fs::read_to_string(root.join("docs/operations.md")).expect("reading docs/operations.md");
    let documented = documented(&operations);
    let missing: Vec<_> = served.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty(),
        "admin routes without a row in docs/operations.md's Admin API table: {missing:?}"
    );
    assert!(
        stale.is_empty(),
        "rows of docs/operations.md's Admin API table that no route serves: {stale:?}"
    );
}

#[test]
fn methods_are_read_from_a_method_router() {
    assert_eq!(methods("get(connection).delete(kick)"), ["GET", "DELETE"]);
    assert_eq!(methods("put(set_filter)"), ["PUT"]);
    assert!(methods("forget(x)").is_empty());
}
