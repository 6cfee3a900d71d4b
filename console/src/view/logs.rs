//! Logs view: the node's global level and per-uid filters (add with `a`, remove with `x`),
//! and its log files with their compression state and the off-peak window.

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Row, Table, Wrap};
use ratatui::Frame;

use super::{block, header_style, problem, BAD, DIM, OK, WARN};
use crate::fmt;
use crate::state::{AppState, NodeState};

fn level_style(level: &str) -> Style {
    match level {
        "trace" | "debug" => Style::new().fg(WARN).bold(),
        "error" => Style::new().fg(BAD),
        _ => Style::new(),
    }
}

fn secs_of(v: f64) -> String {
    fmt::secs(v.max(0.0).round() as u64)
}

/// Draws the logs view of `node`.
pub fn render(frame: &mut Frame<'_>, area: Rect, state: &AppState, node: &NodeState) {
    let [filters_area, files_area] =
        Layout::vertical([Constraint::Percentage(45), Constraint::Min(8)]).areas(area);

    // Per-uid filters.
    match node.log_filters.data.as_ref() {
        None => {
            let p = problem(&node.log_filters, "log filters").unwrap_or_default();
            frame.render_widget(
                Paragraph::new(p)
                    .wrap(Wrap { trim: true })
                    .block(block("per-uid log filters")),
                filters_area,
            );
        }
        Some(f) => {
            let rows = state.visible_log_filters();
            let mut title = format!(
                "per-uid log filters · global level {} · {} active · a: add · x: remove",
                f.global_level,
                f.filters.len()
            );
            if !state.filter.is_empty() {
                title.push_str(&format!(" · filter \"{}\"", state.filter));
            }
            if node.log_filters.error.is_some() {
                title.push_str(" · stale");
            }
            let header =
                Row::new(["user id", "level", "ttl", "remaining", ""]).style(header_style());
            let body = rows.iter().map(|f| {
                let frac = if f.ttl_secs > 0 {
                    (f.remaining_secs / f.ttl_secs as f64).clamp(0.0, 1.0)
                } else {
                    0.0
                };
                let n = (frac * 20.0).round() as usize;
                Row::new(vec![
                    Span::raw(f.uid.clone()),
                    Span::styled(f.level.clone(), level_style(&f.level)),
                    Span::raw(secs_of(f.ttl_secs as f64)),
                    Span::raw(secs_of(f.remaining_secs)),
                    Span::styled(
                        format!("{}{}", "▰".repeat(n), "▱".repeat(20 - n)),
                        Style::new().fg(DIM),
                    ),
                ])
            });
            let widths = [
                Constraint::Length(30),
                Constraint::Length(8),
                Constraint::Length(9),
                Constraint::Length(10),
                Constraint::Length(21),
            ];
            let table = super::table::selectable(header, body, widths, title);
            super::table::render(frame, table, filters_area, rows.len(), state.cursor());
            if rows.is_empty() {
                let inner = block("").inner(filters_area);
                if inner.height > 2 {
                    let r = Rect {
                        y: inner.y + 1,
                        height: 1,
                        ..inner
                    };
                    frame.render_widget(
                        Line::from(Span::styled(
                            " no per-uid filters: press a to log one user at debug for a while",
                            Style::new().fg(DIM),
                        )),
                        r,
                    );
                }
            }
        }
    }

    // Log files.
    let Some(l) = node.logs.data.as_ref() else {
        let p = problem(&node.logs, "log files").unwrap_or_default();
        frame.render_widget(
            Paragraph::new(p)
                .wrap(Wrap { trim: true })
                .block(block("log files")),
            files_area,
        );
        return;
    };
    let outer = block(format!(
        "log files in {}",
        l.dir.as_deref().unwrap_or_default()
    ));
    let inner = outer.inner(files_area);
    frame.render_widget(outer, files_area);
    let [summary, table] =
        Layout::vertical([Constraint::Length(2), Constraint::Min(2)]).areas(inner);
    let ratio = if l.written_bytes_total > 0 && l.compressed_bytes_total > 0 {
        format!(
            " ({} of written)",
            fmt::percent(l.compressed_bytes_total as f64 / l.written_bytes_total as f64)
        )
    } else {
        String::new()
    };
    let next = l.next_window_start_ms.map_or("-".to_owned(), fmt::utc_ms);
    let lines = vec![
        Line::from(vec![
            Span::styled(" compression window ", Style::new().fg(DIM)),
            Span::styled(
                format!("{}-{}", l.window.start, l.window.end),
                Style::new().bold(),
            ),
            Span::raw(" local · "),
            if l.in_window {
                Span::styled("inside it now", Style::new().fg(OK).bold())
            } else {
                Span::styled("outside it", Style::new().fg(DIM))
            },
            Span::styled(" · next starts ", Style::new().fg(DIM)),
            Span::raw(next),
            Span::styled(" · retention ", Style::new().fg(DIM)),
            Span::raw(format!("{}h", l.retention_hours)),
        ]),
        Line::from(vec![
            Span::styled(" written ", Style::new().fg(DIM)),
            Span::styled(fmt::bytes(l.written_bytes_total), Style::new().bold()),
            Span::styled(" · compressed output ", Style::new().fg(DIM)),
            Span::styled(fmt::bytes(l.compressed_bytes_total), Style::new().bold()),
            Span::styled(ratio, Style::new().fg(DIM)),
            Span::styled(format!(" · {} files", l.files.len()), Style::new().fg(DIM)),
        ]),
    ];
    frame.render_widget(Paragraph::new(lines), summary);
    let header = Row::new(["file", "size", "state", "modified (UTC)"]).style(header_style());
    let mut files: Vec<_> = l.files.iter().collect();
    files.sort_by(|a, b| b.modified_ms.cmp(&a.modified_ms).then(a.name.cmp(&b.name)));
    let body = files.iter().map(|f| {
        let st = match f.state.as_str() {
            "compressed" => Style::new().fg(OK),
            "active" | "writing" => Style::new().fg(WARN),
            _ => Style::new(),
        };
        Row::new(vec![
            Span::raw(f.name.clone()),
            Span::raw(fmt::bytes(f.size_bytes)),
            Span::styled(f.state.clone(), st),
            Span::styled(fmt::utc_ms(f.modified_ms), Style::new().fg(DIM)),
        ])
    });
    let widths = [
        Constraint::Length(40),
        Constraint::Length(11),
        Constraint::Length(12),
        Constraint::Length(22),
    ];
    frame.render_widget(
        Table::new(body, widths).header(header).flex(Flex::Start),
        table,
    );
}
