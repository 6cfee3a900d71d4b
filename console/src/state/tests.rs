//! Reducer tests: key actions and API results against plain state.

use super::*;
use crate::action::Action;
use crate::api::*;
use std::time::{Duration, Instant};

fn conn(id: u64, user: &str, queued: u64) -> Connection {
    Connection {
        conn_id: id,
        user_id: user.into(),
        remote: format!("127.0.0.1:{}", 5000 + id),
        queued_bytes: queued,
        state: "active".into(),
        ..Connection::default()
    }
}

fn with_conns(rows: Vec<Connection>) -> AppState {
    let now = Instant::now();
    let mut s = AppState::new(["http://a:1".to_owned()], now);
    s.on_update(
        0,
        Update::Connections(Ok(ConnectionList {
            total: rows.len() as u64,
            connections: rows,
        })),
        now,
    );
    s.apply(Action::GoView(View::Connections));
    s
}

#[test]
fn kick_needs_confirmation() {
    let mut s = with_conns(vec![conn(1, "alice", 0), conn(2, "bob", 0)]);
    s.apply(Action::Down);
    assert!(s.apply(Action::Delete).is_empty());
    assert!(matches!(&s.mode, Mode::ConfirmKick { conn, .. } if conn.conn_id == 2));
    assert!(
        s.apply(Action::Char('x')).is_empty(),
        "other keys keep asking"
    );
    assert_eq!(
        s.apply(Action::Confirm),
        vec![Command::Kick {
            node: 0,
            conn_id: 2
        }]
    );
    assert_eq!(s.mode, Mode::Normal);
    s.apply(Action::Delete);
    assert!(s.apply(Action::Cancel).is_empty());
    assert_eq!(s.mode, Mode::Normal);
}

#[test]
fn revoke_needs_confirmation() {
    let mut s = with_conns(vec![conn(1, "alice", 0), conn(2, "bob", 0)]);
    s.apply(Action::Down);
    assert!(s.apply(Action::Revoke).is_empty());
    assert!(matches!(&s.mode, Mode::ConfirmRevoke { user, .. } if user == "bob"));
    assert!(s.apply(Action::Char('x')).is_empty());
    assert_eq!(
        s.apply(Action::Confirm),
        vec![Command::Revoke {
            node: 0,
            user: "bob".into()
        }]
    );
    assert_eq!(s.mode, Mode::Normal);
    s.apply(Action::Revoke);
    assert!(s.apply(Action::Cancel).is_empty());
    assert_eq!(s.mode, Mode::Normal);
}

#[test]
fn filter_and_sort() {
    let mut s = with_conns(vec![
        conn(1, "alice", 10),
        conn(2, "bob", 30),
        conn(3, "carol", 20),
    ]);
    s.apply(Action::StartFilter);
    for c in "CAR".chars() {
        s.apply(Action::Char(c));
    }
    s.apply(Action::Submit);
    let ids: Vec<u64> = s.visible_connections().iter().map(|c| c.conn_id).collect();
    assert_eq!(ids, vec![3]);
    s.apply(Action::Cancel);
    for _ in 0..3 {
        s.apply(Action::Sort);
    }
    assert_eq!(s.sort, SortKey::Queued);
    let ids: Vec<u64> = s.visible_connections().iter().map(|c| c.conn_id).collect();
    assert_eq!(ids, vec![2, 3, 1]);
    s.apply(Action::ReverseSort);
    assert_eq!(s.plan(0).connections.as_deref(), Some("-queued"));
    let ids: Vec<u64> = s.visible_connections().iter().map(|c| c.conn_id).collect();
    assert_eq!(ids, vec![1, 3, 2]);
}

#[test]
fn cursor_is_clamped() {
    let mut s = with_conns(vec![conn(1, "a", 0), conn(2, "b", 0)]);
    s.apply(Action::Bottom);
    assert_eq!(s.cursor(), 1);
    s.apply(Action::PageUp);
    assert_eq!(s.cursor(), 0);
}

#[test]
fn log_filter_form_validates() {
    let now = Instant::now();
    let mut s = AppState::new(["http://a:1".to_owned()], now);
    s.apply(Action::GoView(View::Logs));
    s.apply(Action::Add);
    assert!(s.apply(Action::Submit).is_empty());
    assert!(matches!(&s.mode, Mode::Form(f) if f.error.is_some()));
    for c in "u42".chars() {
        s.apply(Action::Char(c));
    }
    s.apply(Action::NextField);
    s.apply(Action::Right); // debug -> info
    s.apply(Action::NextField);
    s.apply(Action::Backspace);
    s.apply(Action::Backspace);
    s.apply(Action::Backspace);
    for c in "60".chars() {
        s.apply(Action::Char(c));
    }
    assert_eq!(
        s.apply(Action::Submit),
        vec![Command::SetLogFilter {
            node: 0,
            uid: "u42".into(),
            level: "info".into(),
            ttl_secs: 60
        }]
    );
}

#[test]
fn node_health_transitions() {
    let t0 = Instant::now();
    let mut s = AppState::new(["http://a:1".to_owned()], t0);
    s.on_update(0, Update::Overview(Ok(Box::default())), t0);
    assert_eq!(s.nodes[0].health, Health::Up);
    let e = ApiError::Unreachable("connection refused".into());
    s.on_update(0, Update::Overview(Err(e.clone())), t0);
    assert!(matches!(s.nodes[0].health, Health::Unreachable { .. }));
    assert_eq!(s.status.as_ref().map(|s| s.level), Some(Level::Error));
    assert_eq!(s.cluster().up, 0);
    s.on_update(0, Update::Overview(Ok(Box::default())), t0);
    assert_eq!(s.nodes[0].health, Health::Up);
    assert!(s.status.as_ref().is_some_and(|s| s.text.contains("back")));
    assert_eq!(s.nodes[0].history.connections.len(), 2);
}

#[test]
fn slow_growth_and_events() {
    let t0 = Instant::now();
    let mut st = SlowState::default();
    let mk = |q: u64, marked: u64, disc: u64, rows: bool| SlowConsumers {
        marked_total: marked,
        disconnects_total: disc,
        slow_consumers: if rows { vec![conn(7, "r0", q)] } else { vec![] },
        ..SlowConsumers::default()
    };
    st.record(Ok(mk(1000, 1, 0, true)), t0);
    st.record(Ok(mk(3000, 1, 0, true)), t0 + Duration::from_secs(2));
    assert_eq!(st.growth.get(&7), Some(&1000.0));
    st.record(Ok(mk(0, 1, 1, false)), t0 + Duration::from_secs(3));
    assert_eq!(st.last_delta, (0, 1));
    let texts: Vec<&str> = st.events.iter().map(|e| e.text.as_str()).collect();
    assert!(texts[0].contains("conn 7 (r0) left the list"), "{texts:?}");
    assert!(texts[1].contains("disconnected 1"), "{texts:?}");
}

#[test]
fn users_view_searches_a_valid_uid_and_drops_answers_about_another() {
    let now = Instant::now();
    let mut s = AppState::new(["http://a:1".to_owned()], now);
    s.apply(Action::GoView(View::Users));
    assert_eq!(s.plan(0).user, None);
    s.apply(Action::StartFilter);
    for c in "bad uid".chars() {
        s.apply(Action::Char(c));
    }
    s.apply(Action::Submit);
    assert_eq!(s.user, None, "a space is no user id");
    assert_eq!(s.mode, Mode::Normal);
    s.apply(Action::StartFilter);
    for c in "bob".chars() {
        s.apply(Action::Char(c));
    }
    s.apply(Action::Submit);
    assert_eq!(s.plan(0).user.as_deref(), Some("bob"));
    assert!(s.filter.is_empty());
    // A late answer about someone else is not shown as bob's.
    let other = UserDiag {
        user_id: "eve".into(),
        ..UserDiag::default()
    };
    s.on_update(
        0,
        Update::User {
            uid: "eve".into(),
            result: Ok(other),
        },
        now,
    );
    assert!(s.user_answer().is_none());
    let bob = UserDiag {
        user_id: "bob".into(),
        sessions: vec![UserSession {
            node: "n9".into(),
            conn_id: 3,
            ..UserSession::default()
        }],
        ..UserDiag::default()
    };
    s.on_update(
        0,
        Update::User {
            uid: "bob".into(),
            result: Ok(bob),
        },
        now,
    );
    assert_eq!(s.visible_user_sessions().len(), 1);
    // Its node is not one the console watches: no confirmation, an error instead.
    assert!(s.apply(Action::Delete).is_empty());
    assert_eq!(s.mode, Mode::Normal);
    assert!(s.status.as_ref().is_some_and(|st| st.text.contains("n9")));
}
