//! Rust source read as tokens, enough to see its module structure: which modules a file
//! declares (on disk or inline), its `use` trees and the paths its code names. Comments,
//! string and char literals are dropped first, so a path in a doc comment or a message is
//! not a reference. Items under `#[cfg(test)]` modules are left out: tests may reach back
//! into the module they test.

/// One token of code, with the line it starts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Token {
    /// An identifier or keyword, `::`, or a single punctuation character.
    pub text: String,
    /// 1-based line.
    pub line: usize,
}

/// A path as written, with where it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathRef {
    /// The segments (`super`, `self` and `crate` included), without a trailing `*`.
    pub segments: Vec<String>,
    /// The name it brings into scope (`use a::b as c` -> `c`); `None` for globs and for
    /// paths in code.
    pub alias: Option<String>,
    /// 1-based line.
    pub line: usize,
}

/// What one module's code holds: the file modules it declares, its inline modules, the
/// paths of its `use` declarations and the other paths in its code.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ModuleCode {
    /// `mod name;` declarations (not under `#[cfg(test)]`).
    pub file_children: Vec<String>,
    /// `mod name { ... }` bodies (not under `#[cfg(test)]`), by name.
    pub inline_children: Vec<(String, ModuleCode)>,
    /// Paths of `use` declarations.
    pub uses: Vec<PathRef>,
    /// Paths in code (two segments or more, not starting with `::` or `$crate`).
    pub paths: Vec<PathRef>,
}

/// `text` with comments, string and char literals replaced by spaces (newlines kept).
pub fn code_only(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |out: &mut String, c: char| out.push(if c == '\n' { '\n' } else { ' ' });
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let skip = if c == '/' && next == Some('/') {
            chars[i..]
                .iter()
                .position(|&c| c == '\n')
                .unwrap_or(chars.len() - i)
        } else if c == '/' && next == Some('*') {
            block_comment_len(&chars[i..])
        } else if c == '"' || (c == 'b' && next == Some('"')) {
            string_len(&chars[i..])
        } else if (c == 'r' || (c == 'b' && next == Some('r'))) && raw_string_start(&chars[i..]) {
            raw_string_len(&chars[i..])
        } else if c == '\'' {
            char_literal_len(&chars[i..])
        } else {
            0
        };
        let starts_token = i == 0 || !is_ident(chars[i - 1]);
        if skip > 0 && (starts_token || c == '/' || c == '"' || c == '\'') {
            for &s in &chars[i..i + skip] {
                blank(&mut out, s);
            }
            i += skip;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn block_comment_len(s: &[char]) -> usize {
    let (mut depth, mut i) = (0usize, 0);
    while i < s.len() {
        if s[i] == '/' && s.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    s.len()
}

fn string_len(s: &[char]) -> usize {
    let mut i = s.iter().position(|&c| c == '"').unwrap_or(0) + 1;
    while i < s.len() {
        match s[i] {
            '\\' => i += 2,
            '"' => return i + 1,
            _ => i += 1,
        }
    }
    s.len()
}

fn raw_string_start(s: &[char]) -> bool {
    let from = if s[0] == 'b' { 2 } else { 1 };
    let hashes = s[from..].iter().take_while(|&&c| c == '#').count();
    s.get(from + hashes) == Some(&'"')
}

fn raw_string_len(s: &[char]) -> usize {
    let from = if s[0] == 'b' { 2 } else { 1 };
    let hashes = s[from..].iter().take_while(|&&c| c == '#').count();
    let mut i = from + hashes + 1;
    while i < s.len() {
        if s[i] == '"'
            && s[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes
        {
            return i + 1 + hashes;
        }
        i += 1;
    }
    s.len()
}

/// A char literal's length, or 0 for a lifetime or label (`'a`).
fn char_literal_len(s: &[char]) -> usize {
    match (s.get(1), s.get(2)) {
        (Some('\\'), _) => s[3..].iter().position(|&c| c == '\'').map_or(0, |p| p + 4),
        (Some(_), Some('\'')) => 3,
        _ => 0,
    }
}

/// The tokens of `code` (as returned by [`code_only`]).
pub fn tokens(code: &str) -> Vec<Token> {
    let mut out = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let chars: Vec<char> = line.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            let c = chars[i];
            let len = if is_ident(c) {
                chars[i..].iter().take_while(|&&c| is_ident(c)).count()
            } else if c == ':' && chars.get(i + 1) == Some(&':') {
                2
            } else {
                1
            };
            if !c.is_whitespace() {
                let text = chars[i..i + len].iter().collect();
                out.push(Token { text, line: n + 1 });
            }
            i += len;
        }
    }
    out
}

/// The module structure of one file's source.
pub fn module_code(text: &str) -> ModuleCode {
    let toks = tokens(&code_only(text));
    let mut at = 0;
    parse_items(&toks, &mut at)
}

/// Items up to the `}` that closes the current block (or the end), consumed.
fn parse_items(toks: &[Token], at: &mut usize) -> ModuleCode {
    let mut code = ModuleCode::default();
    let mut depth = 0usize;
    while *at < toks.len() {
        let t = toks[*at].text.as_str();
        match t {
            "{" => depth += 1,
            "}" if depth == 0 => {
                *at += 1;
                return code;
            }
            "}" => depth -= 1,
            "mod" if module_item(toks, at, &mut code) => continue,
            "use" if is_use(toks, *at) => {
                let line = toks[*at].line;
                *at += 1;
                let end = toks[*at..]
                    .iter()
                    .position(|t| t.text == ";")
                    .map_or(toks.len(), |p| *at + p);
                use_tree(&toks[*at..end], Vec::new(), line, &mut code.uses);
                *at = end;
            }
            _ if starts_path(toks, *at) => {
                let (segments, next) = path_at(toks, *at);
                if segments.len() > 1 {
                    let line = toks[*at].line;
                    code.paths.push(PathRef {
                        segments,
                        alias: None,
                        line,
                    });
                }
                *at = next;
                continue;
            }
            _ => {}
        }
        *at += 1;
    }
    code
}

/// Handles a `mod` item at `at`; true when it consumed it (and moved `at` past it).
fn module_item(toks: &[Token], at: &mut usize, code: &mut ModuleCode) -> bool {
    let (Some(name), Some(after)) = (toks.get(*at + 1), toks.get(*at + 2)) else {
        return false;
    };
    if !name.text.chars().all(is_ident) {
        return false;
    }
    let test_only = under_cfg_test(toks, *at);
    match after.text.as_str() {
        ";" => {
            if !test_only {
                code.file_children.push(name.text.clone());
            }
            *at += 3;
            true
        }
        "{" => {
            *at += 3;
            let body = parse_items(toks, at);
            if !test_only {
                code.inline_children.push((name.text.clone(), body));
            }
            true
        }
        _ => false,
    }
}

/// Whether the item whose keyword is at `at` carries `#[cfg(test)]`.
fn under_cfg_test(toks: &[Token], at: usize) -> bool {
    let mut i = at;
    // Visibility: `pub`, `pub(crate)`, `pub(super)`, `pub(in path)`.
    while i > 0
        && ["pub", "(", ")", "crate", "super", "in", "self", "::"]
            .contains(&toks[i - 1].text.as_str())
    {
        i -= 1;
    }
    while i > 0 && toks[i - 1].text == "]" {
        let Some(open) = toks[..i - 1].iter().rposition(|t| t.text == "[") else {
            return false;
        };
        let inner: Vec<&str> = toks[open + 1..i - 1]
            .iter()
            .map(|t| t.text.as_str())
            .collect();
        if inner == ["cfg", "(", "test", ")"] {
            return true;
        }
        if open == 0 || toks[open - 1].text != "#" {
            return false;
        }
        i = open - 1;
    }
    false
}

/// `use` as a keyword starting a declaration (not a field or method named `use`).
fn is_use(toks: &[Token], at: usize) -> bool {
    at == 0 || !matches!(toks[at - 1].text.as_str(), "." | "::")
}

/// Whether a path starts at `at`: an identifier followed by `::`, not itself after `::`,
/// `$` or `'` (labels), and not a leading `::` path.
fn starts_path(toks: &[Token], at: usize) -> bool {
    let first = &toks[at].text;
    let ident = first
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_');
    let before = at.checked_sub(1).map(|i| toks[i].text.as_str());
    ident
        && toks.get(at + 1).is_some_and(|t| t.text == "::")
        && !matches!(before, Some("::" | "$" | "'"))
}

/// The segments of the path at `at` (generic arguments `::<...>` end it) and the index
/// after it.
fn path_at(toks: &[Token], mut at: usize) -> (Vec<String>, usize) {
    let mut segments = vec![toks[at].text.clone()];
    at += 1;
    while toks.get(at).is_some_and(|t| t.text == "::")
        && toks
            .get(at + 1)
            .is_some_and(|t| t.text.chars().all(is_ident))
    {
        segments.push(toks[at + 1].text.clone());
        at += 2;
    }
    (segments, at)
}

/// The paths a `use` tree (the tokens between `use` and `;`) names, each with its prefix.
fn use_tree(toks: &[Token], prefix: Vec<String>, line: usize, out: &mut Vec<PathRef>) {
    let mut segments = prefix;
    let mut i = 0;
    if toks.first().is_some_and(|t| t.text == "::") {
        return; // `use ::extern_crate::...`
    }
    while i < toks.len() {
        let t = toks[i].text.as_str();
        match t {
            "::" => {}
            "*" => {
                out.push(PathRef {
                    segments,
                    alias: None,
                    line,
                });
                return;
            }
            "{" => {
                for group in split_group(&toks[i + 1..]) {
                    use_tree(group, segments.clone(), line, out);
                }
                return;
            }
            "as" => {
                let alias = toks.get(i + 1).map(|t| t.text.clone()).filter(|a| a != "_");
                out.push(PathRef {
                    segments,
                    alias,
                    line,
                });
                return;
            }
            _ => segments.push(t.to_owned()),
        }
        i += 1;
    }
    if let Some(last) = segments.last() {
        let alias = if last == "self" {
            segments.pop();
            segments.last().cloned()
        } else {
            Some(last.clone())
        };
        out.push(PathRef {
            segments,
            alias,
            line,
        });
    }
}

/// The comma-separated members of a `{...}` group (the tokens after its `{`).
fn split_group(toks: &[Token]) -> Vec<&[Token]> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, t) in toks.iter().enumerate() {
        match t.text.as_str() {
            "{" => depth += 1,
            "}" if depth == 0 => {
                out.push(&toks[start..i]);
                break;
            }
            "}" => depth -= 1,
            "," if depth == 0 => {
                out.push(&toks[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.retain(|g| !g.is_empty());
    out
}

#[test]
fn literals_and_comments_are_not_code() {
    let code = code_only("let a = \"crate::x\"; // crate::y\nlet b = '\"'; /* crate::z */ r#\"crate::w\"#; 'a: loop {}\n");
    assert!(!code.contains("crate::"), "{code}");
    assert!(code.contains("'a: loop"), "{code}");
    assert_eq!(code.lines().count(), 2);
}

#[test]
fn use_trees_paths_and_modules_parse() {
    let src = "mod a;\n#[cfg(test)]\nmod tests;\npub(crate) mod b { use super::a::X; }\n\
               use crate::{c::{self, D as E}, f::*};\nfn g() { super::h::i(); x.use_it(); }\n\
               #[cfg(test)]\nmod t { use crate::zz; }\n";
    let m = module_code(src);
    assert_eq!(m.file_children, ["a"]);
    assert_eq!(m.inline_children.len(), 1);
    assert_eq!(m.inline_children[0].0, "b");
    assert_eq!(m.inline_children[0].1.uses[0].segments, ["super", "a", "X"]);
    let uses: Vec<(Vec<String>, Option<String>)> = m
        .uses
        .iter()
        .map(|u| (u.segments.clone(), u.alias.clone()))
        .collect();
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        uses,
        [
            (s(&["crate", "c"]), Some("c".into())),
            (s(&["crate", "c", "D"]), Some("E".into())),
            (s(&["crate", "f"]), None),
        ]
    );
    assert_eq!(m.paths.len(), 1);
    assert_eq!(m.paths[0].segments, ["super", "h", "i"]);
    assert_eq!(m.paths[0].line, 6);
}
