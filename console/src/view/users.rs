//! Users view: "why is this user not getting messages?" for the user typed after `/`,
//! as the selected node answers it for the whole cluster (`GET /admin/v1/users/{uid}`):
//! a summary (nodes asked and missing, refusals, floods, log filters), the user's
//! sessions on every node (selectable: `x` kicks one), the unread backlog per
//! conversation and the recent messages sent and received with their stage timings.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Row, Table, Wrap};
use ratatui::Frame;

use super::{block, centered, header_style, problem, ACCENT, BAD, DIM, WARN};
use crate::api::{ApiError, UserDiag};
use crate::fmt;
use crate::state::{AppState, NodeState};

use super::connections::state_style;

/// Draws the Users view of `node`.
pub fn render(frame: &mut Frame<'_>, area: Rect, state: &AppState, node: &NodeState) {
    let Some(uid) = state.user.as_deref() else {
        render_hint(
            frame,
            area,
            vec![
                Line::from(Span::styled("no user shown", Style::new().bold())),
                Line::from(""),
                Line::from("press / and type a user id, then enter: its sessions on every node,"),
                Line::from("unread backlog, refusals, log filter and recent messages."),
            ],
        );
        return;
    };
    let Some(u) = state.user_answer() else {
        let line = match &node.user.error {
            Some(ApiError::Status {
                status: 404,
                message,
            }) if message.starts_with("nothing known") => vec![
                Line::from(Span::styled(
                    format!("user {uid} not found"),
                    Style::new().fg(WARN).bold(),
                )),
                Line::from(""),
                Line::from(message.clone()),
                Line::from(""),
                Line::from(Span::styled(
                    "a: add a log filter to record their messages from now on · /: another user",
                    Style::new().fg(DIM),
                )),
            ],
            _ => vec![problem(&node.user, &format!("user {uid}"))
                .unwrap_or_else(|| Line::from(format!("loading user {uid}…")))],
        };
        render_hint(frame, area, line);
        return;
    };
    let sessions = u.sessions.len() as u16;
    let backlog = u.backlog.len() as u16;
    let [summary_area, sessions_area, backlog_area, messages_area] = Layout::vertical([
        Constraint::Length(6),
        Constraint::Length(sessions.saturating_add(3).clamp(4, 10)),
        Constraint::Length(backlog.saturating_add(3).clamp(4, 10)),
        Constraint::Min(4),
    ])
    .areas(area);
    render_summary(frame, summary_area, u, node);
    render_sessions(frame, sessions_area, state, u);
    render_backlog(frame, backlog_area, u);
    render_messages(frame, messages_area, u);
}

fn render_hint(frame: &mut Frame<'_>, area: Rect, lines: Vec<Line<'static>>) {
    // Room for the borders and for two wrapped lines.
    let h = lines.len() as u16 + 4;
    frame.render_widget(
        Paragraph::new(lines)
            .centered()
            .wrap(Wrap { trim: true })
            .block(block("user")),
        centered(area, 100, h),
    );
}

fn render_summary(frame: &mut Frame<'_>, area: Rect, u: &UserDiag, node: &NodeState) {
    let mut lines = Vec::new();
    let mut first = vec![
        Span::styled(u.user_id.clone(), Style::new().bold()),
        Span::raw(format!(" · asked {}", u.node_id)),
    ];
    if u.cluster {
        first.push(Span::raw(format!(" · answered: {}", u.nodes.join(", "))));
    } else {
        first.push(Span::styled(" · single node", Style::new().fg(DIM)));
    }
    if !u.missing_nodes.is_empty() {
        first.push(Span::styled(
            format!(
                " · missing: {} (no answer in time: their sessions and messages are not shown)",
                u.missing_nodes.join(", ")
            ),
            Style::new().fg(BAD).bold(),
        ));
    }
    if node.user.error.is_some() {
        first.push(Span::styled(" · stale", Style::new().fg(WARN)));
    }
    lines.push(Line::from(first));

    let mut refusals = vec![Span::styled("refusals ", Style::new().fg(ACCENT))];
    if u.refusals.is_empty() {
        refusals.push(Span::styled("none", Style::new().fg(DIM)));
    }
    for (i, r) in u.refusals.iter().enumerate() {
        if i > 0 {
            refusals.push(Span::raw(" · "));
        }
        refusals.push(Span::styled(
            format!("{} ×{}", r.code, r.count),
            Style::new().fg(WARN).bold(),
        ));
        refusals.push(Span::styled(
            format!(" (last {})", fmt::utc_time_ms(r.last_ms)),
            Style::new().fg(DIM),
        ));
    }
    lines.push(Line::from(refusals));
    let hits = |n: u64| {
        if n > 0 {
            Style::new().fg(BAD).bold()
        } else {
            Style::new()
        }
    };
    lines.push(Line::from(vec![
        Span::styled("rate-limited ", Style::new().fg(ACCENT)),
        Span::styled(u.rate_limited.to_string(), hits(u.rate_limited)),
        Span::styled(" · flood closes ", Style::new().fg(ACCENT)),
        Span::styled(u.floods.to_string(), hits(u.floods)),
    ]));
    let mut filter = vec![Span::styled("log filter ", Style::new().fg(ACCENT))];
    if u.log_filters.is_empty() {
        filter.push(Span::styled(
            "none (a: add one to record this user's messages)",
            Style::new().fg(DIM),
        ));
    }
    for (i, f) in u.log_filters.iter().enumerate() {
        if i > 0 {
            filter.push(Span::raw(" · "));
        }
        filter.push(Span::styled(
            format!(
                "{} {} ({} left)",
                f.node,
                f.level,
                fmt::secs(f.remaining_secs.max(0.0).round() as u64)
            ),
            Style::new().fg(WARN).bold(),
        ));
    }
    filter.push(Span::styled(
        format!(
            " · messages recorded: {} (ring {})",
            if u.tracked { "yes" } else { "no" },
            u.ring_size
        ),
        Style::new().fg(DIM),
    ));
    lines.push(Line::from(filter));
    frame.render_widget(
        Paragraph::new(lines).block(block(format!(
            "user {} · x: kick session · a: log filter · R: revoke · /: another user",
            u.user_id
        ))),
        area,
    );
}

fn render_sessions(frame: &mut Frame<'_>, area: Rect, state: &AppState, u: &UserDiag) {
    let header = Row::new([
        "node", "conn", "device", "state", "age", "queued", "in", "out", "remote",
    ])
    .style(header_style());
    let body = u.sessions.iter().map(|s| {
        Row::new(vec![
            Span::raw(s.node.clone()),
            Span::raw(s.conn_id.to_string()),
            Span::raw(fmt::truncate(&s.device, 14)),
            Span::styled(s.state.clone(), state_style(&s.state)),
            Span::raw(fmt::secs(s.age_secs.max(0.0).round() as u64)),
            Span::raw(fmt::bytes(s.queued_bytes)),
            Span::raw(s.msgs_in.to_string()),
            Span::raw(s.msgs_out.to_string()),
            Span::styled(s.remote.clone(), Style::new().fg(DIM)),
        ])
    });
    let widths = [
        Constraint::Length(12),
        Constraint::Length(8),
        Constraint::Length(14),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(22),
    ];
    let title = if u.sessions.is_empty() {
        "sessions · none: the user is offline on every node that answered".to_owned()
    } else {
        format!("sessions · {}", u.sessions.len())
    };
    let table = super::table::selectable(header, body, widths, title);
    super::table::render(frame, table, area, u.sessions.len(), state.cursor());
}

fn render_backlog(frame: &mut Frame<'_>, area: Rect, u: &UserDiag) {
    let total: u64 = u.backlog.iter().map(|b| b.unread).sum();
    let title = if u.backlog.is_empty() {
        "unread backlog · none".to_owned()
    } else {
        format!(
            "unread backlog · {total} in {} conversations (largest first, at most {})",
            u.backlog.len(),
            u.backlog_limit
        )
    };
    let header = Row::new(["conversation", "cursor", "last seq", "unread"]).style(header_style());
    let body = u.backlog.iter().map(|b| {
        Row::new(vec![
            Span::raw(fmt::truncate(&b.conversation_id, 40)),
            Span::raw(b.cursor.to_string()),
            Span::raw(b.last_seq.to_string()),
            Span::styled(b.unread.to_string(), Style::new().fg(WARN).bold()),
        ])
    });
    let widths = [
        Constraint::Length(40),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
    ];
    frame.render_widget(
        Table::new(body, widths).header(header).block(block(title)),
        area,
    );
}

fn render_messages(frame: &mut Frame<'_>, area: Rect, u: &UserDiag) {
    let title = if u.messages.is_empty() && !u.tracked {
        "recent messages · not recorded: the user has no log filter and is not sampled".to_owned()
    } else {
        format!(
            "recent messages · {} (newest first, at most {})",
            u.messages.len(),
            u.messages_limit
        )
    };
    let header = Row::new([
        "at (UTC)",
        "dir",
        "node",
        "conversation",
        "seq",
        "how",
        "sess",
        "stages",
        "msg_id",
    ])
    .style(header_style());
    let body = u.messages.iter().map(|m| {
        let stages = m
            .stages
            .iter()
            .map(|s| format!("{} {:.1}ms", s.stage, s.ms))
            .collect::<Vec<_>>()
            .join(", ");
        let how = match m.how.as_str() {
            "not_here" => Style::new().fg(WARN),
            "sync_hint" => Style::new().fg(ACCENT),
            _ => Style::new(),
        };
        Row::new(vec![
            Span::styled(fmt::utc_time_ms(m.at_ms), Style::new().fg(DIM)),
            Span::raw(m.direction.clone()),
            Span::raw(m.node.clone()),
            Span::raw(fmt::truncate(&m.conversation_id, 22)),
            Span::raw(m.seq.to_string()),
            Span::styled(m.how.clone(), how),
            Span::raw(m.sessions.to_string()),
            Span::raw(stages),
            Span::styled(m.msg_id.clone(), Style::new().fg(DIM)),
        ])
    });
    let widths = [
        Constraint::Length(12),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(22),
        Constraint::Length(6),
        Constraint::Length(9),
        Constraint::Length(4),
        Constraint::Length(24),
        Constraint::Min(10),
    ];
    frame.render_widget(
        Table::new(body, widths).header(header).block(block(title)),
        area,
    );
}
