//! Input: maps a key press to an [`Action`], given the mode the console is in (browsing,
//! typing, confirming, picking). Pure: no state is changed here. The key table is also
//! the help overlay's source ([`HELP`]), so the two cannot drift apart.

use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers};

use crate::action::Action;
use crate::screen::View;
use crate::state::Mode;

/// One line of the help overlay: keys, what they do.
pub type HelpLine = (&'static str, &'static str);

/// Every key, grouped, as the help overlay lists them.
pub const HELP: &[(&str, &[HelpLine])] = &[
    (
        "Global",
        &[
            ("?", "show / hide this help"),
            ("q, ctrl-c", "quit"),
            ("tab shift-tab, h l, ← →", "next / previous view"),
            (
                "1..9, 0",
                "1 Overview 2 Connections 3 Slow 4 Latency 5 Memory 6 Profile 7 Logs 8 Users 9 Trace 0 Webhooks",
            ),
            ("] [", "next / previous node"),
            ("n", "node picker (j/k, enter; 1..9 picks directly)"),
            ("r, ctrl-r", "refresh now"),
            ("M", "announce a SYSTEM message to a group (group id, text)"),
            ("esc", "clear the filter, close a popup"),
            (
                "form: tab / shift-tab",
                "next / previous field (also ↓ ↑; ← → or a first letter picks a choice)",
            ),
            ("form: enter / esc", "submit / cancel"),
        ],
    ),
    (
        "Tables",
        &[
            ("j k, ↓ ↑", "move the selection"),
            ("pgdn pgup, ctrl-d ctrl-u", "page down / up"),
            ("g G, home end", "first / last row"),
            ("/", "filter (type, enter keeps it, esc clears it)"),
        ],
    ),
    (
        "Connections, Slow consumers",
        &[
            ("s", "next sort column (connections)"),
            ("S", "reverse the sort (connections)"),
            ("x, del", "kick the selected connection (asks first: y / n)"),
            (
                "R",
                "revoke the selected user: close all sessions, refuse their tokens (asks first)",
            ),
        ],
    ),
    ("Latency", &[("t", "toggle log / linear scale")]),
    (
        "Profile",
        &[
            (
                "c, enter",
                "capture the shown profile (CPU or heap); saves .svg and .pb.gz",
            ),
            ("t", "toggle CPU / heap profile"),
        ],
    ),
    (
        "Logs",
        &[
            ("a", "add a per-uid log filter (uid, level, ttl)"),
            ("x, del", "remove the selected filter"),
            ("f", "live tail of the selected user: start / stop"),
            (
                "m",
                "trace the message of the selected tail line (Trace view)",
            ),
            ("pgup pgdn, G", "scroll the tail back / follow the newest"),
            (
                "L",
                "set the node's global level (e.g. info or info,im_server::store=debug)",
            ),
        ],
    ),
    (
        "Users",
        &[
            (
                "/",
                "type a user id, enter: show its sessions, backlog, refusals, messages",
            ),
            ("x, del", "kick the selected session (asks first: y / n)"),
            (
                "a",
                "add a log filter for this user (records their messages)",
            ),
            ("R", "revoke the user (asks first)"),
        ],
    ),
    (
        "Trace",
        &[
            ("/", "type a msg_id (32 hex digits) and see its waterfall"),
            ("r", "ask again"),
        ],
    ),
    (
        "Webhooks",
        &[
            ("j k", "select an endpoint"),
            (
                "c",
                "test-fire the selected endpoint (a webhook.test event now)",
            ),
            (
                "e",
                "redeliver the selected endpoint's parked events (same event ids)",
            ),
        ],
    ),
];

/// The action for `key` in `mode`, or `None` if the key does nothing there.
pub fn map_key(key: KeyEvent, mode: &Mode) -> Option<Action> {
    if key.kind == KeyEventKind::Release {
        return None;
    }
    let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
    if ctrl && matches!(key.code, KeyCode::Char('c')) {
        return Some(Action::Quit);
    }
    match mode {
        Mode::Normal => normal(key, ctrl),
        Mode::Help => match key.code {
            KeyCode::Char('?' | 'q') | KeyCode::Esc | KeyCode::Enter => Some(Action::ToggleHelp),
            _ => None,
        },
        Mode::ConfirmKick { .. } | Mode::ConfirmRevoke { .. } => match key.code {
            KeyCode::Char('y' | 'Y') | KeyCode::Enter => Some(Action::Confirm),
            KeyCode::Char('n' | 'N' | 'q') | KeyCode::Esc => Some(Action::Cancel),
            _ => None,
        },
        Mode::NodePicker { .. } => match key.code {
            KeyCode::Char('j') | KeyCode::Down => Some(Action::Down),
            KeyCode::Char('k') | KeyCode::Up => Some(Action::Up),
            KeyCode::Char('g') | KeyCode::Home => Some(Action::Top),
            KeyCode::Char('G') | KeyCode::End => Some(Action::Bottom),
            KeyCode::Enter => Some(Action::Submit),
            KeyCode::Esc | KeyCode::Char('n' | 'q') => Some(Action::Cancel),
            KeyCode::Char(c @ '1'..='9') => Some(Action::PickNode(c as usize - '1' as usize)),
            _ => None,
        },
        Mode::Filter | Mode::Form(_) => text(key, ctrl),
    }
}

fn normal(key: KeyEvent, ctrl: bool) -> Option<Action> {
    if ctrl {
        return match key.code {
            KeyCode::Char('d') => Some(Action::PageDown),
            KeyCode::Char('u') => Some(Action::PageUp),
            KeyCode::Char('r') => Some(Action::Refresh),
            _ => None,
        };
    }
    Some(match key.code {
        KeyCode::Char('q') => Action::Quit,
        KeyCode::Char('?') => Action::ToggleHelp,
        KeyCode::Tab => Action::NextView,
        KeyCode::BackTab => Action::PrevView,
        KeyCode::Char('l') | KeyCode::Right => Action::NextView,
        KeyCode::Char('h') | KeyCode::Left => Action::PrevView,
        KeyCode::Char(c @ '1'..='8') => Action::GoView(View::ALL[c as usize - '1' as usize]),
        KeyCode::Char('9') => Action::GoView(View::Trace),
        KeyCode::Char('0') => Action::GoView(View::Webhooks),
        KeyCode::Char('e') => Action::Redeliver,
        KeyCode::Char('m') => Action::TraceMessage,
        KeyCode::Char(']') => Action::NextNode,
        KeyCode::Char('[') => Action::PrevNode,
        KeyCode::Char('n') => Action::NodePicker,
        KeyCode::Char('j') | KeyCode::Down => Action::Down,
        KeyCode::Char('k') | KeyCode::Up => Action::Up,
        KeyCode::PageDown => Action::PageDown,
        KeyCode::PageUp => Action::PageUp,
        KeyCode::Char('g') | KeyCode::Home => Action::Top,
        KeyCode::Char('G') | KeyCode::End => Action::Bottom,
        KeyCode::Char('/') => Action::StartFilter,
        KeyCode::Char('s') => Action::Sort,
        KeyCode::Char('S') => Action::ReverseSort,
        KeyCode::Char('t') => Action::ToggleScale,
        KeyCode::Char('r') => Action::Refresh,
        KeyCode::Char('x') | KeyCode::Delete => Action::Delete,
        KeyCode::Char('a' | 'c') => Action::Add,
        KeyCode::Char('L') => Action::GlobalLevel,
        KeyCode::Char('R') => Action::Revoke,
        KeyCode::Char('M') => Action::Announce,
        KeyCode::Char('f') => Action::Tail,
        KeyCode::Enter => Action::Submit,
        KeyCode::Esc => Action::Cancel,
        _ => return None,
    })
}

fn text(key: KeyEvent, ctrl: bool) -> Option<Action> {
    if ctrl {
        return None;
    }
    Some(match key.code {
        KeyCode::Enter => Action::Submit,
        KeyCode::Esc => Action::Cancel,
        KeyCode::Backspace => Action::Backspace,
        KeyCode::Tab | KeyCode::Down => Action::NextField,
        KeyCode::BackTab | KeyCode::Up => Action::PrevField,
        KeyCode::Left => Action::Left,
        KeyCode::Right => Action::Right,
        KeyCode::Char(c) => Action::Char(c),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(code: KeyCode) -> KeyEvent {
        KeyEvent::new(code, KeyModifiers::NONE)
    }

    #[test]
    fn normal_keys() {
        let m = Mode::Normal;
        assert_eq!(map_key(key(KeyCode::Char('q')), &m), Some(Action::Quit));
        assert_eq!(
            map_key(key(KeyCode::Char('3')), &m),
            Some(Action::GoView(View::Slow))
        );
        assert_eq!(map_key(key(KeyCode::Char('j')), &m), Some(Action::Down));
        assert_eq!(map_key(key(KeyCode::Up), &m), Some(Action::Up));
        assert_eq!(map_key(key(KeyCode::Char('z')), &m), None);
        assert_eq!(map_key(key(KeyCode::Char('M')), &m), Some(Action::Announce));
        assert_eq!(
            map_key(key(KeyCode::Char('8')), &m),
            Some(Action::GoView(View::Users))
        );
        assert_eq!(
            map_key(key(KeyCode::Char('9')), &m),
            Some(Action::GoView(View::Trace))
        );
        assert_eq!(
            map_key(key(KeyCode::Char('m')), &m),
            Some(Action::TraceMessage)
        );
        let cc = KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL);
        assert_eq!(map_key(cc, &Mode::Filter), Some(Action::Quit));
    }

    #[test]
    fn typing_modes_take_letters() {
        assert_eq!(
            map_key(key(KeyCode::Char('q')), &Mode::Filter),
            Some(Action::Char('q'))
        );
        assert_eq!(
            map_key(key(KeyCode::Tab), &Mode::Filter),
            Some(Action::NextField)
        );
    }

    #[test]
    fn confirm_keys() {
        let m = Mode::ConfirmKick {
            node: 0,
            conn: Default::default(),
        };
        assert_eq!(map_key(key(KeyCode::Char('y')), &m), Some(Action::Confirm));
        assert_eq!(map_key(key(KeyCode::Esc), &m), Some(Action::Cancel));
        assert_eq!(map_key(key(KeyCode::Char('x')), &m), None);
    }
}
