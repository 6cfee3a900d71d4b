//! The function-length rule of im-server: no function in `server/src` is longer than
//! [`MAX_LINES`] lines, counted from the line of its `fn` to the line of its closing
//! brace (comments, strings and char literals are skipped when braces are matched).

use std::fs;
use std::path::Path;

use crate::common::rust_files;

/// The longest a function may be.
const MAX_LINES: usize = 150;

/// `text` with comments, string literals and char literals blanked (newlines kept, so
/// byte offsets and line numbers stay those of the file).
fn code_only(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to.min(b.len())] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    let mut i = 0;
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |n| i + n);
            blank(&mut out, i, end);
            i = end;
        } else if rest.starts_with(b"/*") {
            let (mut depth, mut j) = (0usize, i);
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if let Some(end) = raw_string_end(b, i) {
            blank(&mut out, i, end);
            i = end;
        } else if b[i] == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if b[i] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            let end = if rest.get(1) == Some(&b'\\') {
                rest.iter()
                    .skip(2)
                    .position(|&c| c == b'\'')
                    .map(|n| i + n + 3)
            } else {
                let ch = text[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + ch) == Some(&b'\'')).then_some(i + ch + 2)
            };
            match end {
                Some(end) => {
                    blank(&mut out, i, end);
                    i = end;
                }
                None => i += 1,
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Where a raw string starting at `i` (`r"`, `r#"`, `br#"`) ends, if one starts there.
fn raw_string_end(b: &[u8], i: usize) -> Option<usize> {
    let ident_before = i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
    if ident_before {
        return None;
    }
    let mut j = i;
    if b.get(j) == Some(&b'b') {
        j += 1;
    }
    if b.get(j) != Some(&b'r') {
        return None;
    }
    j += 1;
    let hashes = b[j..].iter().take_while(|&&c| c == b'#').count();
    j += hashes;
    if b.get(j) != Some(&b'"') {
        return None;
    }
    let close: Vec<u8> = std::iter::once(b'"')
        .chain(std::iter::repeat_n(b'#', hashes))
        .collect();
    let end = b[j + 1..]
        .windows(close.len())
        .position(|w| w == close.as_slice())?;
    Some(j + 1 + end + close.len())
}

/// Each function with a body in `text`: its name, first line and length in lines.
fn functions(text: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(text);
    let line_of = |at: usize| code[..at].iter().filter(|&&c| c == b'\n').count() + 1;
    let is_ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(n) = code[i..].windows(3).position(|w| w == b"fn ") {
        let at = i + n;
        i = at + 3;
        if at > 0 && is_ident(code[at - 1]) {
            continue;
        }
        let name: String = code[i..]
            .iter()
            .skip_while(|c| c.is_ascii_whitespace())
            .take_while(|&&c| is_ident(c))
            .map(|&c| c as char)
            .collect();
        if name.is_empty() {
            continue;
        }
        let Some(open) = code[i..].iter().position(|&c| c == b'{' || c == b';') else {
            break;
        };
        let open = i + open;
        if code[open] == b';' {
            continue;
        }
        let mut depth = 0usize;
        let mut close = None;
        for (k, &c) in code[open..].iter().enumerate() {
            match c {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        close = Some(open + k);
                        break;
                    }
                }
                _ => {}
            }
        }
        let Some(close) = close else {
            continue;
        };
        out.push((name, line_of(at), line_of(close) - line_of(at) + 1));
    }
    out
}

#[test]
fn no_function_in_server_src_is_over_150_lines() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    files.sort();
    let mut long = Vec::new();
    for file in files {
        let rel = file
            .strip_prefix(&src)
            .expect("a file under src")
            .to_string_lossy()
            .replace('\\', "/");
        let text = fs::read_to_string(&file).expect("reading a source file");
        for (name, line, lines) in functions(&text) {
            if lines <= MAX_LINES {
                continue;
            }
            long.push(format!("server/src/{rel}:{line} `{name}` is {lines} lines"));
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_LINES} lines (split them into steps that each read on one screen):\n  {}",
        long.join("\n  ")
    );
}

#[test]
fn the_counter_skips_comments_strings_and_chars() {
    let text = "fn a() {\n    let s = \"}}\"; // }\n    let c = '}';\n    let r = r#\"{\"#;\n}\n\
                /* fn b() { */\nfn c<'x>(v: &'x str) -> &'x str {\n    v\n}\ntrait T { fn d(&self); }\n";
    let found = functions(text);
    assert_eq!(
        found,
        [("a".to_owned(), 1, 5), ("c".to_owned(), 7, 3)],
        "{found:?}"
    );
}
