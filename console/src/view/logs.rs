//! Logs view: the node's global level and per-uid filters (add with `a`, remove with `x`),
//! and below them either its log files with their compression state and the off-peak
//! window, or the live tail of the selected filter's user (`f` starts and stops it). The
//! tail's newest shown line is its selected one (reversed); `m` traces its message.

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Paragraph, Row, Table, Wrap};
use ratatui::Frame;

use super::{block, header_style, problem, BAD, DIM, OK, WARN};
use crate::api::LogTailLine;
use crate::fmt;
use crate::state::{AppState, NodeState, TailState, TailStatus};

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
    // With a tail open, the filters table shrinks to its rows and the tail takes the rest.
    let top = if state.tail_shown() {
        let rows = node
            .log_filters
            .data
            .as_ref()
            .map_or(0, |f| f.filters.len());
        Constraint::Length((rows as u16).saturating_add(4).clamp(5, 12))
    } else {
        Constraint::Percentage(45)
    };
    let [filters_area, files_area] = Layout::vertical([top, Constraint::Min(8)]).areas(area);

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
                "per-uid log filters · global level {} · {} active · a: add · x: remove · f: live tail",
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

    if let Some(t) = state.tail.as_ref().filter(|_| state.tail_shown()) {
        render_tail(frame, files_area, t);
        return;
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

/// The level as shown in a tail line: five columns, coloured.
fn tail_level(level: &str) -> Span<'static> {
    let style = match level {
        "error" => Style::new().fg(BAD).bold(),
        "warn" => Style::new().fg(WARN).bold(),
        "info" => Style::new().fg(OK),
        _ => Style::new().fg(DIM),
    };
    Span::styled(format!("{:<5}", level.to_uppercase()), style)
}

/// One tail line: time, level, target (without the crate), message, fields.
fn tail_line(l: &LogTailLine) -> Line<'static> {
    if let Some(n) = l.dropped {
        return Line::from(Span::styled(
            format!(" ⋯ {n} events dropped here: the console fell behind"),
            Style::new().fg(WARN),
        ));
    }
    let target = l.target.strip_prefix("im_server::").unwrap_or(&l.target);
    let mut spans = vec![
        Span::styled(
            format!(" {} ", fmt::utc_time_ms(l.ts_ms)),
            Style::new().fg(DIM),
        ),
        tail_level(&l.level),
        Span::styled(format!(" {target:<18} "), Style::new().fg(DIM)),
        Span::styled(l.message.clone(), Style::new().bold()),
    ];
    // The role (sender / recipient) first: it says how the event concerns the user.
    let role = l.fields.get_key_value("role");
    for (k, v) in role
        .into_iter()
        .chain(l.fields.iter().filter(|(k, _)| *k != "role"))
    {
        let v = match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        spans.push(Span::styled(format!(" {k}="), Style::new().fg(DIM)));
        spans.push(Span::raw(v));
    }
    Line::from(spans)
}

/// The live tail pane: the newest lines that fit (or those `scroll` lines back).
fn render_tail(frame: &mut Frame<'_>, area: Rect, t: &TailState) {
    let status = match &t.status {
        TailStatus::Opening => Span::styled("opening…", Style::new().fg(WARN)),
        TailStatus::Live => Span::styled("live", Style::new().fg(OK).bold()),
        TailStatus::Stopped => Span::styled("stopped", Style::new().fg(DIM)),
        TailStatus::Ended(why) => Span::styled(format!("ended: {why}"), Style::new().fg(BAD)),
    };
    let mut title = vec![
        Span::raw(format!(" live tail of {} · ", t.uid)),
        status,
        Span::raw(format!(" · {} events", t.received)),
    ];
    if t.dropped > 0 {
        title.push(Span::styled(
            format!(" · {} dropped", t.dropped),
            Style::new().fg(WARN).bold(),
        ));
    }
    if t.scroll > 0 {
        title.push(Span::styled(
            format!(" · {} lines back (G follows)", t.scroll),
            Style::new().fg(WARN),
        ));
    }
    title.push(Span::styled(
        if t.is_open() {
            " · f: stop · pgup pgdn: scroll · m: trace msg "
        } else {
            " · f: tail again · m: trace msg "
        },
        Style::new().fg(DIM),
    ));
    let outer = Block::bordered()
        .border_style(Style::new().fg(DIM))
        .title(Line::from(title));
    let inner = outer.inner(area);
    frame.render_widget(outer, area);
    let rows = inner.height as usize;
    if t.lines.is_empty() {
        let hint = if t.is_open() {
            " waiting for events: the user's actions show here as they happen"
        } else {
            " no events"
        };
        frame.render_widget(Line::from(Span::styled(hint, Style::new().fg(DIM))), inner);
        return;
    }
    // `scroll` lines back from the newest; scrolled to the top, a full page from the oldest.
    let mut end = t.lines.len().saturating_sub(t.scroll);
    let start = end.saturating_sub(rows);
    if start == 0 {
        end = t.lines.len().min(rows);
    }
    let selected = t.selected();
    let lines: Vec<Line<'static>> = t
        .lines
        .range(start..end)
        .enumerate()
        .map(|(i, l)| {
            let line = tail_line(l);
            if Some(start + i) == selected {
                line.patch_style(Style::new().add_modifier(ratatui::style::Modifier::REVERSED))
            } else {
                line
            }
        })
        .collect();
    frame.render_widget(Paragraph::new(lines), inner);
}
