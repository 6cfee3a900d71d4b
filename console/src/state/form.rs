//! Forms: the popups that ask for a log filter, a global level, a CPU capture or a
//! group announcement, and their field parsing.

use std::path::PathBuf;

use super::LEVELS;

/// One field of a form.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// Label shown left of the value.
    pub label: &'static str,
    /// Current text.
    pub value: String,
    /// When set, the value is picked from these with left/right instead of typed.
    pub choices: Option<&'static [&'static str]>,
}

impl Field {
    /// A typed field (no choices) with `value` filled in.
    pub fn text(label: &'static str, value: impl Into<String>) -> Field {
        Field {
            label,
            value: value.into(),
            choices: None,
        }
    }
}

/// What a form is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormKind {
    /// Add a per-uid log filter: uid, level, ttl.
    LogFilter,
    /// Start a CPU capture: seconds, frequency, folder.
    Profile,
    /// Start a heap capture: seconds, folder.
    HeapProfile,
    /// Set the node's global log level.
    GlobalLevel,
    /// Announce a SYSTEM message to a group: group id, text.
    Announce,
    /// Trace a message: its msg_id.
    Trace,
}

/// A small form in a popup.
#[derive(Debug, Clone, PartialEq)]
pub struct Form {
    /// What submitting does.
    pub kind: FormKind,
    /// The fields, top to bottom.
    pub fields: Vec<Field>,
    /// The field being edited.
    pub focus: usize,
    /// Validation error of the last submit.
    pub error: Option<String>,
}

impl Form {
    /// The log-filter form, empty uid, `debug`, 600 s.
    pub fn log_filter() -> Form {
        Form {
            kind: FormKind::LogFilter,
            fields: vec![
                Field::text("user id", ""),
                Field {
                    label: "level",
                    value: "debug".into(),
                    choices: Some(LEVELS),
                },
                Field::text("ttl (seconds)", "600"),
            ],
            focus: 0,
            error: None,
        }
    }

    /// The global-level form, prefilled with the level in force.
    pub fn global_level(current: &str) -> Form {
        Form {
            kind: FormKind::GlobalLevel,
            fields: vec![Field::text("global level", current)],
            focus: 0,
            error: None,
        }
    }

    /// The announcement form: group id and text, both empty.
    pub fn announce() -> Form {
        Form {
            kind: FormKind::Announce,
            fields: vec![Field::text("group id", ""), Field::text("text", "")],
            focus: 0,
            error: None,
        }
    }

    /// The msg_id form of the Trace view, prefilled with the message shown.
    pub fn trace(current: &str) -> Form {
        Form {
            kind: FormKind::Trace,
            fields: vec![Field::text("msg_id", current)],
            focus: 0,
            error: None,
        }
    }

    /// The capture form, prefilled from the last settings.
    pub fn profile(p: &ProfileSettings) -> Form {
        Form {
            kind: FormKind::Profile,
            fields: vec![
                Field::text("seconds", p.seconds.to_string()),
                Field::text("frequency (Hz)", p.frequency.to_string()),
                Field::text("save to folder", p.dir.display().to_string()),
            ],
            focus: 0,
            error: None,
        }
    }

    /// The heap capture form, prefilled from the last settings.
    pub fn heap_profile(p: &ProfileSettings) -> Form {
        Form {
            kind: FormKind::HeapProfile,
            fields: vec![
                Field::text("seconds (1-60)", p.heap_seconds.to_string()),
                Field::text("save to folder", p.dir.display().to_string()),
            ],
            focus: 0,
            error: None,
        }
    }

    pub(super) fn value(&self, i: usize) -> &str {
        self.fields.get(i).map_or("", |f| f.value.trim())
    }
}

/// The heap capture's default window, seconds: the runbook asks for 30-60 s, since a heap
/// profile shows what was allocated in the window and is still live at its end.
pub const HEAP_SECONDS_DEFAULT: u64 = 30;

/// The last capture settings.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileSettings {
    /// CPU capture length (1..=300 s).
    pub seconds: u64,
    /// CPU sampling frequency (1..=1000 Hz).
    pub frequency: u64,
    /// Heap sampling window (1..=60 s).
    pub heap_seconds: u64,
    /// Folder the SVG and pprof files go to.
    pub dir: PathBuf,
}

impl Default for ProfileSettings {
    fn default() -> Self {
        ProfileSettings {
            seconds: 10,
            frequency: 99,
            heap_seconds: HEAP_SECONDS_DEFAULT,
            dir: PathBuf::from("."),
        }
    }
}

pub(super) fn parse_in(text: &str, what: &str, lo: u64, hi: u64) -> Result<u64, String> {
    match text.parse::<u64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => Err(format!("{what} must be a whole number from {lo} to {hi}")),
    }
}
