//! Memory view: jemalloc stats (with fragmentation and dirty pages), the C heap and
//! SQLite's share of it, memory per connection, allocated/RSS sparklines and the
//! connections holding the largest queues.

use std::collections::VecDeque;

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Row, Sparkline, Table, Wrap};
use ratatui::Frame;

use super::{block, header_style, problem, ACCENT, DIM, WARN};
use crate::fmt;
use crate::state::{display_user, AppState, NodeState};

fn tail(series: &VecDeque<u64>, width: u16) -> Vec<u64> {
    let skip = series.len().saturating_sub(width as usize);
    series.iter().skip(skip).copied().collect()
}

/// Draws the memory view of `node`.
pub fn render(frame: &mut Frame<'_>, area: Rect, _state: &AppState, node: &NodeState) {
    let [top, bottom] = Layout::vertical([Constraint::Length(14), Constraint::Min(5)]).areas(area);
    let [stats, right] =
        Layout::horizontal([Constraint::Length(72), Constraint::Min(30)]).areas(top);

    match node.memory.data.as_ref() {
        None => {
            let p = problem(&node.memory, "allocator stats").unwrap_or_default();
            frame.render_widget(
                Paragraph::new(p)
                    .wrap(Wrap { trim: true })
                    .block(block("allocator (jemalloc)")),
                stats,
            );
        }
        Some(m) => {
            let scale = m.mapped.max(m.rss).max(1);
            let bar = |v: u64| {
                let n = (v as f64 / scale as f64 * 16.0).round() as usize;
                "▇".repeat(n.min(16))
            };
            let rows: Vec<Row<'_>> = [
                ("allocated", m.allocated, "live allocations"),
                ("active", m.active, "pages in use"),
                ("resident", m.resident, "physically resident"),
                ("mapped", m.mapped, "mapped extents"),
                ("retained", m.retained, "kept for reuse"),
                ("metadata", m.metadata, "allocator bookkeeping"),
                ("fragmentation", m.fragmentation, "active - allocated"),
                ("dirty", m.dirty, "resident-active-metadata"),
                ("rss", m.rss, "process resident set"),
                ("C heap", m.c_heap, "glibc's, outside jemalloc"),
                ("SQLite", m.sqlite, "its caches, in the C heap"),
            ]
            .into_iter()
            .map(|(k, v, what)| {
                Row::new(vec![
                    Span::raw(k),
                    Span::styled(format!("{:>10}", fmt::bytes(v)), Style::new().bold()),
                    Span::styled(bar(v), Style::new().fg(ACCENT)),
                    Span::styled(what, Style::new().fg(DIM)),
                ])
            })
            .collect();
            let mut title = "allocator (jemalloc, read fresh each poll)".to_owned();
            if node.memory.error.is_some() {
                title.push_str(" · stale");
            }
            frame.render_widget(
                Table::new(
                    rows,
                    [
                        Constraint::Length(13),
                        Constraint::Length(10),
                        Constraint::Length(16),
                        Constraint::Min(10),
                    ],
                )
                .block(block(title)),
                stats,
            );
        }
    }

    let per_conn_block = block("per connection");
    let inner = per_conn_block.inner(right);
    frame.render_widget(per_conn_block, right);
    let [figures, s1, s2] = Layout::vertical([
        Constraint::Length(4),
        Constraint::Min(3),
        Constraint::Min(3),
    ])
    .areas(inner);
    if let Some(m) = node.memory.data.as_ref() {
        let per = |v: u64| {
            v.checked_div(m.connections)
                .map_or_else(|| "-".to_owned(), fmt::bytes)
        };
        let lines = vec![
            Line::from(vec![
                Span::styled(" connections ", Style::new().fg(DIM)),
                Span::styled(m.connections.to_string(), Style::new().bold()),
                Span::styled("   cost per connection ", Style::new().fg(DIM)),
                Span::styled(fmt::bytes(m.per_connection_bytes), Style::new().bold()),
                Span::styled(
                    if m.per_connection_measured {
                        " (measured)"
                    } else {
                        " (estimate, not measured yet)"
                    },
                    if m.per_connection_measured {
                        Style::new().fg(DIM)
                    } else {
                        Style::new().fg(WARN)
                    },
                ),
            ]),
            Line::from(vec![
                Span::styled(" allocated / connection ", Style::new().fg(DIM)),
                Span::styled(per(m.allocated), Style::new().bold()),
                Span::styled("   rss / connection ", Style::new().fg(DIM)),
                Span::styled(per(m.rss), Style::new().bold()),
            ]),
            Line::from(Span::styled(
                " (process totals / connections: an upper bound)",
                Style::new().fg(DIM),
            )),
        ];
        frame.render_widget(Paragraph::new(lines).wrap(Wrap { trim: true }), figures);
    }
    let h = &node.history;
    for (area, name, series, color) in [
        (s1, "allocated", &h.allocated, Color::Green),
        (s2, "rss", &h.rss, Color::Blue),
    ] {
        let [title, spark] =
            Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(area);
        let data = tail(series, spark.width);
        let last = data.last().copied().unwrap_or(0);
        frame.render_widget(
            Line::from(vec![
                Span::styled(format!(" {name} "), Style::new().fg(DIM)),
                Span::styled(fmt::bytes(last), Style::new().bold()),
                Span::styled(
                    format!(" (last {} samples)", data.len()),
                    Style::new().fg(DIM),
                ),
            ]),
            title,
        );
        frame.render_widget(
            Sparkline::default()
                .data(data)
                .style(Style::new().fg(color)),
            spark,
        );
    }

    let title = "largest outbound queues (memory held per connection)";
    match node.top_queued.data.as_ref() {
        None => {
            let p = problem(&node.top_queued, "connections").unwrap_or_default();
            frame.render_widget(
                Paragraph::new(p)
                    .wrap(Wrap { trim: true })
                    .block(block(title)),
                bottom,
            );
        }
        Some(list) => {
            let header = Row::new(["conn", "user", "remote", "queued", "age", "state"])
                .style(header_style());
            let rows = list
                .connections
                .iter()
                .filter(|c| c.queued_bytes > 0)
                .map(|c| {
                    Row::new(vec![
                        c.conn_id.to_string(),
                        display_user(&c.user_id).to_owned(),
                        c.remote.clone(),
                        fmt::bytes(c.queued_bytes),
                        fmt::secs(c.age_secs.max(0.0) as u64),
                        c.state.clone(),
                    ])
                });
            let widths = [
                Constraint::Length(8),
                Constraint::Length(24),
                Constraint::Length(22),
                Constraint::Length(11),
                Constraint::Length(9),
                Constraint::Length(9),
            ];
            let empty = list.connections.iter().all(|c| c.queued_bytes == 0);
            let title = if empty {
                format!("{title}: every queue is empty")
            } else {
                title.to_owned()
            };
            frame.render_widget(
                Table::new(rows, widths)
                    .header(header)
                    .flex(Flex::Start)
                    .block(block(title)),
                bottom,
            );
        }
    }
}
