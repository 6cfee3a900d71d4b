//! The key table of `console/README.md` against the console's own key table
//! ([`im_console::input::HELP`], which the help overlay shows): every key of a view's group
//! is named in that view's row, and every global or table key in the "Keys and views"
//! section.

use std::fs;
use std::path::Path;

use im_console::input::HELP;

/// Groups whose keys work in every view: documented anywhere in the section.
const EVERYWHERE: [&str; 2] = ["Global", "Tables"];

/// The single keys of a help line's key cell, e.g. `"pgdn pgup, ctrl-d ctrl-u"`.
fn keys(cell: &str) -> Vec<&str> {
    let cell = cell.strip_prefix("form: ").unwrap_or(cell);
    cell.split([',', ' '])
        .filter(|k| !k.is_empty() && *k != "/")
        .collect()
}

/// Whether `word` stands alone in `text` (no letter, digit or `-` on either side).
fn has_word(text: &str, word: &str) -> bool {
    let joins = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '-');
    text.match_indices(word).any(|(at, _)| {
        !joins(text[..at].chars().last()) && !joins(text[at + word.len()..].chars().next())
    })
}

/// Whether `text` names `key` the way the README writes keys: a one-character key in
/// backticks, a range as `` `1`..`9` ``, arrow keys as "arrows", a named key as a word.
fn names(text: &str, key: &str) -> bool {
    if let Some((from, to)) = key.split_once("..") {
        return text.contains(&format!("`{from}`..`{to}`"));
    }
    if ["←", "→", "↓", "↑"].contains(&key) {
        return has_word(text, "arrows");
    }
    if key.chars().count() == 1 {
        return text.contains(&format!("`{key}`"));
    }
    has_word(text, key)
}

/// The README's "Keys and views" section.
fn section(readme: &str) -> &str {
    let section = readme
        .split("\n## Keys and views\n")
        .nth(1)
        .expect("console/README.md has a Keys and views section");
    section.split("\n## ").next().unwrap_or(section)
}

/// The rows of the section's table whose view cell is one of `views`, joined.
fn rows_of(section: &str, views: &[&str]) -> String {
    section
        .lines()
        .filter(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            l.starts_with("| `") && cells.len() > 2 && views.contains(&cells[1].trim())
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_key_of_the_help_table_is_in_the_readme() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let readme = fs::read_to_string(&path).expect("reading console/README.md");
    let section = section(&readme);
    let mut missing = Vec::new();
    for (group, lines) in HELP {
        let scope = if EVERYWHERE.contains(group) {
            section.to_owned()
        } else {
            let views: Vec<&str> = group.split(", ").collect();
            let rows = rows_of(section, &views);
            assert!(
                !rows.is_empty(),
                "help group {group:?} has no row in the README's table"
            );
            rows
        };
        for (cell, what) in *lines {
            for key in keys(cell) {
                if !names(&scope, key) {
                    missing.push(format!("{group}: {key} ({what})"));
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "keys of the help overlay that console/README.md does not name:\n{}",
        missing.join("\n")
    );
}

#[test]
fn keys_are_split_and_matched_as_the_readme_writes_them() {
    assert_eq!(
        keys("tab shift-tab, h l, ← →"),
        ["tab", "shift-tab", "h", "l", "←", "→"]
    );
    assert_eq!(keys("form: enter / esc"), ["enter", "esc"]);
    assert!(names("`M` announces", "M"));
    assert!(!names("Memory", "M"));
    assert!(names("`1`..`9` switch", "1..9"));
    assert!(names("shift-tab", "shift-tab"));
    assert!(!names("shift-tab", "tab"));
    assert!(!names("the end-to-end", "end"));
}
