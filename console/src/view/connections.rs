//! Connections and Slow consumers views: the sortable, filterable connections table (kick
//! with `x`), and the slow consumers with their queue growth between polls, the node's
//! marks and what it did about them.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Cell, Paragraph, Row, Wrap};
use ratatui::Frame;

use super::{block, header_style, problem, ACCENT, BAD, DIM, OK, WARN};
use crate::api::Connection;
use crate::fmt;
use crate::state::{display_user, AppState, NodeState, SortKey};

/// The colour of a connection state (active, slow, closing), shared with the Users view.
pub(super) fn state_style(state: &str) -> Style {
    match state {
        "active" => Style::new().fg(OK),
        "slow" => Style::new().fg(WARN).bold(),
        "closing" => Style::new().fg(BAD),
        _ => Style::new().fg(DIM),
    }
}

fn sort_label(state: &AppState, key: SortKey, name: &str) -> String {
    if state.sort != key {
        return name.to_owned();
    }
    // Numbers sort largest first by default; ids, users and states ascending.
    let ascending = matches!(key, SortKey::ConnId | SortKey::User | SortKey::State);
    let up = ascending != state.sort_reversed;
    format!("{name} {}", if up { "↑" } else { "↓" })
}

/// Draws the connections table of `node`.
pub fn render_connections(frame: &mut Frame<'_>, area: Rect, state: &AppState, node: &NodeState) {
    let [summary, table] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(3)]).areas(area);
    if let Some(p) = problem(&node.connections, "connections") {
        if node.connections.data.is_none() {
            frame.render_widget(p, summary);
            return;
        }
        frame.render_widget(p, summary);
    } else {
        let total = node.connections.data.as_ref().map_or(0, |l| l.total);
        let rows = state.visible_connections();
        let fetched = node
            .connections
            .data
            .as_ref()
            .map_or(0, |l| l.connections.len());
        let mut spans = vec![
            Span::styled(format!(" {total} connections"), Style::new().bold()),
            Span::raw(format!(" on {}", node.name())),
            Span::styled(format!(" · showing {}", rows.len()), Style::new().fg(DIM)),
        ];
        if (fetched as u64) < total {
            spans.push(Span::styled(
                format!(
                    " (first {fetched} by {} from the node)",
                    state.sort.api_name()
                ),
                Style::new().fg(WARN),
            ));
        }
        if !state.filter.is_empty() {
            spans.push(Span::styled(
                format!(" · filter \"{}\"", state.filter),
                Style::new().fg(WARN),
            ));
        }
        spans.push(Span::styled(
            "   s: sort · S: reverse · /: filter · x: kick · R: revoke",
            Style::new().fg(DIM),
        ));
        frame.render_widget(Line::from(spans), summary);
    }
    let rows = state.visible_connections();
    let header = Row::new(vec![
        sort_label(state, SortKey::ConnId, "conn"),
        sort_label(state, SortKey::User, "user"),
        "device".to_owned(),
        "remote".to_owned(),
        sort_label(state, SortKey::Age, "age"),
        sort_label(state, SortKey::Queued, "queued"),
        sort_label(state, SortKey::MsgsIn, "msgs in"),
        sort_label(state, SortKey::MsgsOut, "msgs out"),
        sort_label(state, SortKey::State, "state"),
    ])
    .style(header_style());
    let body = rows.iter().map(|c| conn_row(c, true, None, None));
    let widths = [
        Constraint::Length(8),
        Constraint::Length(20),
        Constraint::Length(14),
        Constraint::Length(22),
        Constraint::Length(9),
        Constraint::Length(11),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(10),
    ];
    let t = super::table::selectable(header, body, widths, "connections");
    super::table::render(frame, t, table, rows.len(), state.cursor());
}

// `growth`: `None` leaves the column out (connections view); `Some(None)` shows it with no
// figure yet (a slow consumer seen once).
#[allow(clippy::option_option)]
// `device`: whether the device column is shown (connections view).
fn conn_row<'a>(
    c: &Connection,
    device: bool,
    growth: Option<Option<f64>>,
    hard_mark: Option<u64>,
) -> Row<'a> {
    let mut cells = vec![
        Cell::from(c.conn_id.to_string()),
        Cell::from(display_user(&c.user_id).to_owned()),
    ];
    if device {
        cells.push(Cell::from(Span::styled(
            c.device.clone(),
            Style::new().fg(DIM),
        )));
    }
    cells.extend([
        Cell::from(c.remote.clone()),
        Cell::from(fmt::secs(c.age_secs.max(0.0) as u64)),
        Cell::from(fmt::bytes(c.queued_bytes)),
    ]);
    if let Some(g) = growth {
        cells.push(match g {
            Some(g) => Cell::from(Span::styled(
                fmt::byte_rate(g),
                if g > 0.0 {
                    Style::new().fg(BAD).bold()
                } else {
                    Style::new().fg(OK)
                },
            )),
            None => Cell::from(Span::styled("new", Style::new().fg(DIM))),
        });
    }
    if let Some(hard) = hard_mark {
        let r = if hard > 0 {
            c.queued_bytes as f64 / hard as f64
        } else {
            0.0
        };
        let n = (r.clamp(0.0, 1.0) * 10.0).round() as usize;
        cells.push(Cell::from(Span::styled(
            format!(
                "{}{} {:>5}",
                "█".repeat(n),
                "·".repeat(10 - n),
                fmt::percent(r)
            ),
            if r > 0.75 {
                Style::new().fg(BAD)
            } else {
                Style::new().fg(WARN)
            },
        )));
    }
    cells.push(Cell::from(c.msgs_in.to_string()));
    cells.push(Cell::from(c.msgs_out.to_string()));
    cells.push(Cell::from(Span::styled(
        c.state.clone(),
        state_style(&c.state),
    )));
    Row::new(cells)
}

/// Draws the slow consumers of `node`.
pub fn render_slow(frame: &mut Frame<'_>, area: Rect, state: &AppState, node: &NodeState) {
    let slow = &node.slow;
    let [summary, table, events] = Layout::vertical([
        Constraint::Length(6),
        Constraint::Min(5),
        Constraint::Length(9),
    ])
    .areas(area);
    let Some(s) = slow.fetched.data.as_ref() else {
        let p = problem(&slow.fetched, "slow consumers").unwrap_or_default();
        frame.render_widget(
            Paragraph::new(p)
                .wrap(Wrap { trim: true })
                .block(block("slow consumers")),
            area,
        );
        return;
    };
    let (m0, d0) = slow
        .first_totals
        .unwrap_or((s.marked_total, s.disconnects_total));
    let marked_style = if s.total > 0 {
        Style::new().fg(WARN).bold()
    } else {
        Style::new().bold()
    };
    let closed_style = if s.disconnects_total > d0 {
        Style::new().fg(BAD).bold()
    } else {
        Style::new().bold()
    };
    let mut lines = vec![
        Line::from(vec![
            Span::styled(" now slow ", Style::new().fg(DIM)),
            Span::styled(s.total.to_string(), marked_style),
            Span::styled(" · marked slow since start ", Style::new().fg(DIM)),
            Span::styled(s.marked_total.to_string(), Style::new().bold()),
            Span::styled(
                format!(
                    " (+{} last poll, +{} while watching)",
                    slow.last_delta.0,
                    s.marked_total.saturating_sub(m0)
                ),
                Style::new().fg(DIM),
            ),
        ]),
        Line::from(vec![
            Span::styled(" closed by the node ", Style::new().fg(DIM)),
            Span::styled(s.disconnects_total.to_string(), closed_style),
            Span::styled(
                format!(
                    " (hard mark or write timeout; +{} last poll, +{} while watching)",
                    slow.last_delta.1,
                    s.disconnects_total.saturating_sub(d0)
                ),
                Style::new().fg(DIM),
            ),
        ]),
        Line::from(vec![
            Span::styled(" soft mark ", Style::new().fg(DIM)),
            Span::styled(fmt::bytes(s.soft_mark_bytes), Style::new().fg(WARN)),
            Span::raw(": marked slow; only acks, errors, pongs and 1:1 messages queued, the rest waits for sync"),
        ]),
        Line::from(vec![
            Span::styled(" hard mark ", Style::new().fg(DIM)),
            Span::styled(fmt::bytes(s.hard_mark_bytes), Style::new().fg(BAD)),
            Span::raw(format!(
                ", or a write stuck over {}s: closed with code 4008",
                s.write_timeout_secs
            )),
        ]),
    ];
    if let Some(p) = problem(&slow.fetched, "slow consumers") {
        lines.push(p);
    }
    frame.render_widget(
        Paragraph::new(lines)
            .wrap(Wrap { trim: false })
            .block(block("slow consumers")),
        summary,
    );

    let rows = state.visible_slow();
    let header = Row::new([
        "conn",
        "user",
        "remote",
        "age",
        "queued",
        "growth",
        "of hard mark",
        "msgs in",
        "msgs out",
        "state",
    ])
    .style(header_style());
    let body = rows.iter().map(|c| {
        conn_row(
            c,
            false,
            Some(slow.growth.get(&c.conn_id).copied()),
            Some(s.hard_mark_bytes),
        )
    });
    let widths = [
        Constraint::Length(8),
        Constraint::Length(20),
        Constraint::Length(22),
        Constraint::Length(8),
        Constraint::Length(11),
        Constraint::Length(14),
        Constraint::Length(18),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(8),
    ];
    let title = if rows.is_empty() {
        "marked connections: none (every queue is below the soft mark)".to_owned()
    } else {
        "marked connections, largest queue first (growth: since the previous poll)".to_owned()
    };
    let t = super::table::selectable(header, body, widths, title);
    super::table::render(frame, t, table, rows.len(), state.cursor());

    let height = events.height.saturating_sub(2) as usize;
    let ev: Vec<Line<'_>> = if slow.events.is_empty() {
        vec![Line::from(Span::styled(
            " nothing yet: marks, departures and disconnects seen between polls show here",
            Style::new().fg(DIM),
        ))]
    } else {
        slow.events
            .iter()
            .rev()
            .take(height)
            .map(|e| {
                Line::from(vec![
                    Span::styled(
                        format!(
                            " {:>8} ago  ",
                            fmt::ago(state.now.saturating_duration_since(e.at))
                        ),
                        Style::new().fg(DIM),
                    ),
                    Span::styled(e.text.clone(), Style::new().fg(ACCENT)),
                ])
            })
            .collect()
    };
    frame.render_widget(
        Paragraph::new(ev).block(block("what happened (newest first)")),
        events,
    );
}
