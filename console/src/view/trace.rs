//! Trace view: one message's stage timeline as a waterfall, one row per stage (node,
//! stage, recipient, a bar placed by its start offset and scaled by its duration, the
//! duration), from `GET /admin/v1/messages/{msg_id}/trace`. `/` asks for another msg_id;
//! `m` on a Logs tail line opens it on that line's message.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{Paragraph, Wrap};
use ratatui::Frame;

use super::{block, ACCENT, BAD, DIM, OK, WARN};
use crate::api::{ApiError, MessageTrace, TraceStage};
use crate::fmt;
use crate::state::{AppState, TraceStatus};

/// Colour of a node's bars: the first node (the sender's) accent, the others in turn.
fn node_style(nodes: &[String], node: &str) -> Style {
    const COLOURS: [ratatui::style::Color; 3] = [ACCENT, OK, WARN];
    let i = nodes.iter().position(|n| n == node).unwrap_or(0);
    Style::new().fg(COLOURS[i % COLOURS.len()])
}

/// A duration in nanoseconds, in the unit that fits.
fn dur(ns: u64) -> String {
    if ns < 1000 {
        format!("{ns}ns")
    } else {
        fmt::micros(ns as f64 / 1000.0)
    }
}

/// Draws the Trace view.
pub fn render(frame: &mut Frame<'_>, area: Rect, state: &AppState) {
    let Some(t) = &state.trace else {
        let text = vec![
            Line::from(""),
            Line::from(" No message traced yet."),
            Line::from(""),
            Line::from(Span::styled(
                " /: type a msg_id (32 hex digits) · or m on a Logs tail line that names a msg_id",
                Style::new().fg(DIM),
            )),
            Line::from(Span::styled(
                " A node traces the messages of users under a log filter, and a sample of all \
                 (obs.trace_sample_rate).",
                Style::new().fg(DIM),
            )),
        ];
        frame.render_widget(
            Paragraph::new(text)
                .wrap(Wrap { trim: false })
                .block(block("message trace")),
            area,
        );
        return;
    };
    match &t.status {
        TraceStatus::Loading => frame.render_widget(
            Paragraph::new(Span::styled(
                format!(" asking for the trace of {}…", t.msg_id),
                Style::new().fg(WARN),
            ))
            .block(block(format!("message trace · {}", t.msg_id))),
            area,
        ),
        TraceStatus::Failed(e) => {
            let (headline, hint) = match e {
                ApiError::Status { status: 404, .. } => (
                    format!(" No node holds a trace of {}.", t.msg_id),
                    " Traced: messages of filtered users (Logs view, a) and a sample; each node keeps \
                     its latest obs.trace_store_size.",
                ),
                _ => (
                    format!(" The trace of {} could not be read: {e}", t.msg_id),
                    " /: try another msg_id · r: ask again",
                ),
            };
            frame.render_widget(
                Paragraph::new(vec![
                    Line::from(""),
                    Line::from(Span::styled(headline, Style::new().fg(BAD).bold())),
                    Line::from(""),
                    Line::from(Span::styled(hint, Style::new().fg(DIM))),
                ])
                .wrap(Wrap { trim: false })
                .block(block(format!("message trace · {}", t.msg_id))),
                area,
            );
        }
        TraceStatus::Done(m) => render_waterfall(frame, area, m),
    }
}

fn render_waterfall(frame: &mut Frame<'_>, area: Rect, m: &MessageTrace) {
    let outer = block(format!("message trace · {}", m.msg_id));
    let inner = outer.inner(area);
    frame.render_widget(outer, area);
    let [head, body] = Layout::vertical([Constraint::Length(3), Constraint::Min(0)]).areas(inner);

    let total = m
        .stages
        .iter()
        .map(|s| s.start_offset_ns.saturating_add(s.duration_ns))
        .max()
        .unwrap_or(0);
    let mut summary = vec![
        Span::styled(" sender ", Style::new().fg(DIM)),
        Span::raw(m.sender.clone()),
        Span::styled(" · conversation ", Style::new().fg(DIM)),
        Span::raw(m.conversation.clone()),
        Span::styled(" · seq ", Style::new().fg(DIM)),
        Span::raw(m.seq.to_string()),
        Span::styled(" · total ", Style::new().fg(DIM)),
        Span::styled(dur(total), Style::new().bold()),
    ];
    if m.started_unix_ms > 0 {
        summary.push(Span::styled(" · at ", Style::new().fg(DIM)));
        summary.push(Span::raw(fmt::utc_ms(m.started_unix_ms)));
    }
    let mut nodes = vec![Span::styled(" nodes ", Style::new().fg(DIM))];
    for (i, n) in m.nodes.iter().enumerate() {
        if i > 0 {
            nodes.push(Span::raw(" "));
        }
        nodes.push(Span::styled(format!("■ {n}"), node_style(&m.nodes, n)));
    }
    if m.recipients_omitted > 0 {
        nodes.push(Span::styled(
            format!(" · {} recipients not traced (cap)", m.recipients_omitted),
            Style::new().fg(WARN),
        ));
    }
    if !m.nodes_unanswered.is_empty() {
        nodes.push(Span::styled(
            format!(" · no answer from {}", m.nodes_unanswered.join(", ")),
            Style::new().fg(BAD),
        ));
    }
    if !m.regions.is_empty() {
        nodes.push(Span::styled(" · regions ", Style::new().fg(DIM)));
        nodes.push(Span::raw(m.regions.join(", ")));
    }
    if !m.regions_unanswered.is_empty() {
        nodes.push(Span::styled(
            format!(
                " · no answer from region {}",
                m.regions_unanswered.join(", ")
            ),
            Style::new().fg(BAD),
        ));
    }
    frame.render_widget(
        Paragraph::new(vec![Line::from(summary), Line::from(nodes)]),
        head,
    );

    // Columns: node, stage, recipient, the bar, the duration.
    let node_w = m
        .nodes
        .iter()
        .map(|n| n.len())
        .chain(m.stages.iter().map(|s| where_of(s).len()))
        .max()
        .unwrap_or(4)
        .clamp(4, 12);
    let fixed = node_w + 1 + 15 + 13 + 10;
    let bar_w = (body.width as usize).saturating_sub(fixed + 1).max(10);
    let mut lines = vec![Line::from(Span::styled(
        format!(
            " {:<node_w$} {:<15}{:<13}{:<bar_w$}{:>9}",
            "node", "stage", "recipient", "0 → offset", "took"
        ),
        Style::new().fg(DIM).bold(),
    ))];
    let rows = (body.height as usize).saturating_sub(1);
    for s in m.stages.iter().take(rows) {
        lines.push(stage_line(s, m, node_w, bar_w, total));
    }
    if m.stages.len() > rows {
        if let Some(last) = lines.last_mut() {
            *last = Line::from(Span::styled(
                format!(
                    " … {} more stages (a taller terminal shows them)",
                    m.stages.len() - rows + 1
                ),
                Style::new().fg(DIM),
            ));
        }
    }
    frame.render_widget(Paragraph::new(lines), body);
}

/// Where a stage ran: its node, `region/node` in multi-region mode.
fn where_of(s: &TraceStage) -> String {
    match &s.region {
        Some(r) => format!("{r}/{}", s.node),
        None => s.node.clone(),
    }
}

/// One waterfall row.
fn stage_line(
    s: &TraceStage,
    m: &MessageTrace,
    node_w: usize,
    bar_w: usize,
    total: u64,
) -> Line<'static> {
    let scale = |ns: u64| -> usize {
        if total == 0 {
            0
        } else {
            ((ns as u128 * bar_w as u128) / total as u128) as usize
        }
    };
    let start = scale(s.start_offset_ns).min(bar_w.saturating_sub(1));
    let len = scale(s.duration_ns).max(1).min(bar_w - start);
    let recipient = s.recipient.as_deref().unwrap_or("");
    Line::from(vec![
        Span::styled(
            format!(" {:<node_w$} ", fmt::truncate(&where_of(s), node_w)),
            node_style(&m.nodes, &s.node),
        ),
        Span::raw(format!("{:<15}", s.stage)),
        Span::styled(
            format!("{:<13}", fmt::truncate(recipient, 12)),
            Style::new().fg(DIM),
        ),
        Span::raw(" ".repeat(start)),
        Span::styled("█".repeat(len), node_style(&m.nodes, &s.node)),
        Span::raw(" ".repeat(bar_w - start - len)),
        Span::raw(format!("{:>9}", dur(s.duration_ns))),
    ])
}
