//! Webhooks view: the node's webhook endpoints (queue depth, parked events, delivered
//! and failed counts, the failure rate over the last minute, the last error) with the
//! outbox's fill against its bound, and below them the parked events. `c` test-fires the
//! selected endpoint, `e` redelivers its parked events.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Row, Table, Wrap};
use ratatui::Frame;

use super::{block, header_style, problem, table, BAD, DIM, OK, WARN};
use crate::fmt;
use crate::state::{AppState, NodeState};

fn rate_style(r: f64) -> Style {
    match r {
        r if r >= 0.5 => Style::new().fg(BAD).bold(),
        r if r > 0.0 => Style::new().fg(WARN),
        _ => Style::new().fg(OK),
    }
}

/// Draws the webhooks view of `node`.
pub fn render(frame: &mut Frame<'_>, area: Rect, state: &AppState, node: &NodeState) {
    let [top, bottom] =
        Layout::vertical([Constraint::Percentage(50), Constraint::Min(6)]).areas(area);
    let Some(w) = node.webhooks.data.as_ref() else {
        let p = problem(&node.webhooks, "webhooks").unwrap_or_default();
        frame.render_widget(
            Paragraph::new(p)
                .wrap(Wrap { trim: true })
                .block(block("webhook endpoints")),
            top,
        );
        return;
    };
    let fill = if w.outbox_max > 0 {
        w.outbox_events as f64 / w.outbox_max as f64
    } else {
        0.0
    };
    let mut title = format!(
        "webhook endpoints · outbox {} / {} ({}) · {} messages to expand · c: test-fire · e: redeliver parked",
        w.outbox_events,
        w.outbox_max,
        fmt::percent(fill),
        w.outbox_pending
    );
    if w.outbox_full {
        title.push_str(" · FULL: new events stored parked");
    }
    if node.webhooks.error.is_some() {
        title.push_str(" · stale");
    }
    let header = Row::new([
        "endpoint",
        "queued",
        "parked",
        "delivered",
        "failed",
        "fail 1m",
        "last error",
    ])
    .style(header_style());
    let rows = state.visible_endpoints();
    let body = rows.iter().map(|e| {
        let last = if e.last_error.is_empty() {
            Span::styled("-", Style::new().fg(DIM))
        } else {
            Span::raw(format!(
                "{} {}",
                fmt::utc_time_ms(e.last_error_at),
                fmt::truncate(&e.last_error, 80)
            ))
        };
        Row::new(vec![
            Span::raw(e.name.clone()),
            Span::raw(e.queued.to_string()),
            Span::styled(
                e.parked.to_string(),
                if e.parked > 0 {
                    Style::new().fg(WARN)
                } else {
                    Style::new()
                },
            ),
            Span::raw(e.delivered.to_string()),
            Span::raw(e.failed.to_string()),
            Span::styled(fmt::percent(e.failure_rate), rate_style(e.failure_rate)),
            last,
        ])
    });
    let widths = [
        Constraint::Length(16),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(8),
        Constraint::Length(8),
        Constraint::Fill(1),
    ];
    let t = table::selectable(header, body, widths, title);
    table::render(frame, t, top, rows.len(), state.cursor());
    render_parked(frame, bottom, node);
}

/// The parked events, oldest first.
fn render_parked(frame: &mut Frame<'_>, area: Rect, node: &NodeState) {
    let Some(p) = node.parked.data.as_ref() else {
        let line = problem(&node.parked, "parked events").unwrap_or_default();
        frame.render_widget(Paragraph::new(line).block(block("parked events")), area);
        return;
    };
    let title = format!(
        "parked events · {}{} listed",
        p.events.len(),
        if p.more { "+" } else { "" }
    );
    if p.events.is_empty() {
        frame.render_widget(
            Paragraph::new(Line::from(Span::styled(
                "none: every event was delivered or is still being retried",
                Style::new().fg(DIM),
            )))
            .block(block(title)),
            area,
        );
        return;
    }
    let header = Row::new([
        "made",
        "endpoint",
        "kind",
        "event id",
        "attempts",
        "last error",
    ])
    .style(header_style());
    let body = p.events.iter().map(|e| {
        Row::new(vec![
            fmt::utc_ms(e.created_ms),
            e.endpoint.clone(),
            e.kind.clone(),
            e.event_id.clone(),
            e.attempts.to_string(),
            fmt::truncate(&e.last_error, 80),
        ])
    });
    let widths = [
        Constraint::Length(21),
        Constraint::Length(16),
        Constraint::Length(17),
        Constraint::Length(33),
        Constraint::Length(8),
        Constraint::Fill(1),
    ];
    frame.render_widget(
        Table::new(body, widths).header(header).block(block(title)),
        area,
    );
}
