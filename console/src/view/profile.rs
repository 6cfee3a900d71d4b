//! Profile view: CPU or heap (`t` toggles), start a capture (`c`), its progress while the
//! node samples, where the SVG and pprof files were saved, and the top functions by
//! samples (CPU) or in-use bytes (heap).

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Gauge, Row, Table};
use ratatui::Frame;

use super::{block, header_style, selected_style, ACCENT, BAD, DIM, OK, WARN};
use crate::fmt;
use crate::state::{AppState, NodeState, ProfileKind, ProfileState};

/// Draws the profile view of `node`.
pub fn render(frame: &mut Frame<'_>, area: Rect, state: &AppState, node: &NodeState) {
    let [head, table] = Layout::vertical([Constraint::Length(7), Constraint::Min(4)]).areas(area);
    let kind = state.profile_kind;
    let heap = kind == ProfileKind::Heap;
    let title = if heap { "Heap" } else { "CPU" };
    let outer = block(format!("{title} profile of {}", node.name()));
    let inner = outer.inner(head);
    frame.render_widget(outer, head);
    let [l1, l2, l3, l4, l5] = Layout::vertical([Constraint::Length(1); 5]).areas(inner);
    let p = &state.profile_settings;
    let next = if heap {
        format!("{} s of allocation sampling", p.heap_seconds)
    } else {
        format!("{} s at {} Hz", p.seconds, p.frequency)
    };
    frame.render_widget(
        Line::from(vec![
            Span::styled(" next capture ", Style::new().fg(DIM)),
            Span::styled(next, Style::new().bold()),
            Span::styled(" → folder ", Style::new().fg(DIM)),
            Span::styled(p.dir.display().to_string(), Style::new().bold()),
            Span::styled(
                format!(
                    "   c/enter: set up and start · t: {} profile",
                    kind.toggled().label()
                ),
                Style::new().fg(DIM),
            ),
        ]),
        l1,
    );
    let idle = if heap {
        " no capture yet: press c to sample the live node's allocations and get the bytes still in use by stack (.svg, .pb.gz)"
    } else {
        " no capture yet: press c to sample the live node's CPU and get a flamegraph (.svg) and a pprof file (.pb.gz)"
    };
    match node.profile_of(kind) {
        ProfileState::Idle => {
            frame.render_widget(Line::from(Span::styled(idle, Style::new().fg(DIM))), l3)
        }
        ProfileState::Running {
            started,
            seconds,
            frequency,
        } => {
            let elapsed = state.now.saturating_duration_since(*started).as_secs_f64();
            let total = *seconds as f64;
            let what = if heap {
                "sampling allocations".to_owned()
            } else {
                format!("sampling at {frequency} Hz")
            };
            let (ratio, label) = if elapsed < total {
                (
                    elapsed / total,
                    format!("{what}: {elapsed:.0}s of {seconds}s"),
                )
            } else {
                (
                    1.0,
                    format!(
                        "{seconds}s sampled; waiting for the node to build the report ({:.0}s)…",
                        elapsed - total
                    ),
                )
            };
            frame.render_widget(
                Gauge::default()
                    .ratio(ratio.clamp(0.0, 1.0))
                    .label(label)
                    .gauge_style(Style::new().fg(ACCENT).bg(ratatui::style::Color::Black)),
                l3,
            );
        }
        ProfileState::Failed(e) => frame.render_widget(
            Line::from(Span::styled(
                format!(" capture failed: {e}"),
                Style::new().fg(BAD).bold(),
            )),
            l3,
        ),
        ProfileState::Done(r) => {
            let summary = if heap {
                vec![
                    Span::styled(" in use ", Style::new().fg(DIM)),
                    Span::styled(fmt::bytes(r.total), Style::new().fg(OK).bold()),
                    Span::styled(
                        format!(
                            " from {} stacks allocated in {}s of sampling",
                            r.samples, r.seconds
                        ),
                        Style::new().fg(DIM),
                    ),
                ]
            } else {
                vec![
                    Span::styled(" captured ", Style::new().fg(DIM)),
                    Span::styled(format!("{} samples", r.samples), Style::new().fg(OK).bold()),
                    Span::styled(
                        format!(" over {}s at {} Hz", r.seconds, r.frequency),
                        Style::new().fg(DIM),
                    ),
                ]
            };
            frame.render_widget(Line::from(summary), l2);
            let saved = |label: &str, p: &Option<std::path::PathBuf>| {
                Line::from(vec![
                    Span::styled(format!(" {label:<11}"), Style::new().fg(DIM)),
                    match p {
                        Some(p) => Span::styled(p.display().to_string(), Style::new().bold()),
                        None => Span::styled("not saved", Style::new().fg(WARN)),
                    },
                ])
            };
            frame.render_widget(saved("flamegraph", &r.svg_path), l3);
            frame.render_widget(saved("pprof", &r.pprof_path), l4);
            if let Some(e) = &r.save_error {
                frame.render_widget(
                    Line::from(Span::styled(
                        format!(" save failed: {e}"),
                        Style::new().fg(BAD).bold(),
                    )),
                    l5,
                );
            } else {
                frame.render_widget(
                    Line::from(Span::styled(
                        " open the .svg in a browser; go tool pprof -top FILE.pb.gz",
                        Style::new().fg(DIM),
                    )),
                    l5,
                );
            }
        }
    }

    let rows = state.visible_top();
    let total = match node.profile_of(kind) {
        ProfileState::Done(r) => r.total.max(1),
        _ => 1,
    };
    let value = |v: u64| if heap { fmt::bytes(v) } else { v.to_string() };
    let header =
        Row::new(["#", "function", "self", "self %", "total", "total %"]).style(header_style());
    let body = rows.iter().enumerate().map(|(i, t)| {
        Row::new(vec![
            Span::styled(format!("{}", i + 1), Style::new().fg(DIM)),
            Span::raw(t.function.clone()),
            Span::raw(value(t.self_value)),
            Span::styled(
                fmt::percent(t.self_value as f64 / total as f64),
                Style::new().fg(WARN),
            ),
            Span::raw(value(t.total_value)),
            Span::raw(fmt::percent(t.total_value as f64 / total as f64)),
        ])
    });
    let w = if heap { 10 } else { 8 };
    let widths = [
        Constraint::Length(4),
        Constraint::Min(30),
        Constraint::Length(w),
        Constraint::Length(8),
        Constraint::Length(w),
        Constraint::Length(8),
    ];
    let mut title = if heap {
        "top allocation sites by bytes in use".to_owned()
    } else {
        "top functions by samples".to_owned()
    };
    if !state.filter.is_empty() {
        title.push_str(&format!(" · filter \"{}\"", state.filter));
    }
    let t = Table::new(body, widths)
        .header(header)
        .row_highlight_style(selected_style())
        .block(block(title));
    super::table::render(frame, t, table, rows.len(), state.cursor());
}
