//! View: draws the console from an [`AppState`] and nothing else (no I/O, no clock), so
//! every screen can be rendered into a `TestBackend` and compared with a snapshot. This
//! module owns the frame around the views (header, cluster row, tabs, status line) and
//! the popups (help, kick confirmation, node picker, forms); each view has a submodule.

mod connections;
mod latency;
mod logs;
mod memory;
mod overview;
mod profile;
mod table;
mod trace;
mod users;
mod webhooks;

use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Block, Cell, Clear, Paragraph, Row, Table, Tabs, Wrap};
use ratatui::Frame;

use crate::api::ApiError;
use crate::fmt;
use crate::input::HELP;
use crate::state::{AppState, Fetched, Form, Health, Level, Mode, NodeState, View};

/// Accent colour of titles and keys.
const ACCENT: Color = Color::Cyan;
/// Dim text.
const DIM: Color = Color::DarkGray;
/// Good / warning / bad.
const OK: Color = Color::Green;
const WARN: Color = Color::Yellow;
const BAD: Color = Color::Red;

/// Draws the whole console.
pub fn render(frame: &mut Frame<'_>, state: &AppState) {
    let area = frame.area();
    let cluster_rows = u16::from(state.nodes.len() > 1);
    let [header, cluster, tabs, body, status] = Layout::vertical([
        Constraint::Length(1),
        Constraint::Length(cluster_rows),
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    render_header(frame, header, state);
    if cluster_rows > 0 {
        render_cluster(frame, cluster, state);
    }
    render_tabs(frame, tabs, state);
    render_status(frame, status, state);
    match state.node() {
        Some(node) => render_body(frame, body, state, node),
        None => frame.render_widget(Paragraph::new("no nodes configured: pass --url"), body),
    }
    match &state.mode {
        Mode::Help => render_help(frame, area),
        Mode::ConfirmKick { conn, node } => {
            let name = state.nodes.get(*node).map_or("?", |n| n.name());
            render_confirm(frame, area, name, conn)
        }
        Mode::ConfirmRevoke { user, node } => {
            let name = state.nodes.get(*node).map_or("?", |n| n.name());
            render_confirm_revoke(frame, area, name, user)
        }
        Mode::NodePicker { cursor } => render_picker(frame, area, state, *cursor),
        Mode::Form(form) => render_form(frame, area, form),
        Mode::Normal | Mode::Filter => {}
    }
}

fn render_header(frame: &mut Frame<'_>, area: Rect, state: &AppState) {
    let mut spans = vec![Span::styled(
        " im-console ",
        Style::new().bold().fg(Color::Black).bg(ACCENT),
    )];
    if let Some(n) = state.node() {
        spans.push(Span::raw(" "));
        spans.push(Span::styled(n.name().to_owned(), Style::new().bold()));
        if state.nodes.len() > 1 {
            spans.push(Span::styled(
                format!(" ({}/{})", state.selected + 1, state.nodes.len()),
                Style::new().fg(DIM),
            ));
        }
        spans.push(Span::styled(format!("  {}  ", n.url), Style::new().fg(DIM)));
        spans.push(health_span(&n.health));
        if n.live_overview().is_some_and(|o| o.draining) {
            spans.push(Span::styled(
                " · draining (shutting down)",
                Style::new().fg(WARN).bold(),
            ));
        }
        if let Some(reason) = n.live_overview().and_then(|o| o.store_refusal.as_deref()) {
            spans.push(Span::styled(
                format!(" · refusing sends: store {reason}"),
                Style::new().fg(BAD).bold(),
            ));
        }
        for h in n.live_overview().map(|o| &o.hooks[..]).unwrap_or_default() {
            if h.breaker != "closed" {
                let effect = if h.on_error == "fail_closed" {
                    "sends refused"
                } else {
                    "sends unchecked"
                };
                let hook = h.hook.replace('_', "-");
                spans.push(Span::styled(
                    format!(" · {hook} hook {}: {effect}", h.breaker.replace('_', "-")),
                    Style::new().fg(BAD).bold(),
                ));
            }
        }
        if let Some(o) = &n.overview.data {
            spans.push(Span::styled(
                format!(
                    "  v{} · {} · up {}",
                    o.version,
                    o.store,
                    fmt::secs(o.uptime_secs)
                ),
                Style::new().fg(DIM),
            ));
        }
        if let Some(at) = n.overview.at {
            let age = state.now.saturating_duration_since(at);
            let style = if age.as_secs() >= 5 {
                Style::new().fg(WARN)
            } else {
                Style::new().fg(DIM)
            };
            spans.push(Span::styled(
                format!(" · data {} old", fmt::ago(age)),
                style,
            ));
        }
    }
    frame.render_widget(Line::from(spans), area);
}

fn health_span(h: &Health) -> Span<'static> {
    match h {
        Health::Up => Span::styled("● up", Style::new().fg(OK).bold()),
        Health::Connecting => Span::styled("○ connecting", Style::new().fg(WARN)),
        Health::Unreachable { .. } => Span::styled("✖ unreachable", Style::new().fg(BAD).bold()),
        Health::Failing { .. } => Span::styled("▲ error", Style::new().fg(BAD).bold()),
    }
}

fn render_cluster(frame: &mut Frame<'_>, area: Rect, state: &AppState) {
    let c = state.cluster();
    let down = c.nodes - c.up;
    let mut spans = vec![
        Span::styled(" cluster ", Style::new().fg(Color::Black).bg(Color::Gray)),
        Span::raw(format!(" {}/{} nodes up", c.up, c.nodes)),
    ];
    if down > 0 {
        spans.push(Span::styled(
            format!(" ({down} down)"),
            Style::new().fg(BAD).bold(),
        ));
    }
    spans.push(Span::raw(format!(
        " │ conns {} │ in {}/s │ out {}/s │ backlog {} │ slow {} │ headroom {} conns",
        c.connections,
        fmt::count(c.msg_rate_in),
        fmt::count(c.msg_rate_out),
        c.persist_backlog,
        c.slow_consumers,
        c.headroom_connections
    )));
    spans.push(Span::styled(
        "   n: pick node  ] [: next/prev",
        Style::new().fg(DIM),
    ));
    frame.render_widget(Line::from(spans), area);
}

fn render_tabs(frame: &mut Frame<'_>, area: Rect, state: &AppState) {
    let titles = View::ALL
        .iter()
        .map(|v| Line::from(format!("{} {}", v.key(), v.title())));
    let tabs = Tabs::new(titles)
        .select(state.view.index())
        .style(Style::new().fg(DIM))
        .highlight_style(
            Style::new()
                .fg(ACCENT)
                .bold()
                .add_modifier(Modifier::REVERSED),
        )
        .divider("│");
    frame.render_widget(tabs, area);
}

fn render_status(frame: &mut Frame<'_>, area: Rect, state: &AppState) {
    let hint = match &state.mode {
        Mode::Filter if state.view == View::Users => " enter: look up user · esc: cancel ",
        Mode::Filter => " enter: keep · esc: clear ",
        Mode::Form(_) => " tab: next field · enter: submit · esc: cancel ",
        Mode::ConfirmKick { .. } => " y: kick · n: cancel ",
        Mode::ConfirmRevoke { .. } => " y: revoke · n: cancel ",
        Mode::NodePicker { .. } => " j/k · enter: pick · esc: close ",
        Mode::Help => " esc/?: close help ",
        Mode::Normal => " ?: help · q: quit ",
    };
    let [left, right] = Layout::horizontal([
        Constraint::Min(0),
        Constraint::Length(hint.chars().count() as u16),
    ])
    .areas(area);
    let line = match (&state.mode, &state.status) {
        (Mode::Filter, _) => Line::from(vec![
            Span::styled("/", Style::new().fg(ACCENT).bold()),
            Span::raw(state.filter.clone()),
            Span::styled("█", Style::new().fg(ACCENT)),
        ]),
        (_, Some(s)) => {
            let style = match s.level {
                Level::Info => Style::new().fg(OK),
                Level::Error => Style::new().fg(BAD).bold(),
            };
            Line::from(Span::styled(format!(" {}", s.text), style))
        }
        (_, None) if !state.filter.is_empty() => Line::from(Span::styled(
            format!(" filter: {} (esc clears)", state.filter),
            Style::new().fg(WARN),
        )),
        (_, None) => Line::from(""),
    };
    frame.render_widget(line, left);
    frame.render_widget(
        Line::from(Span::styled(
            hint,
            Style::new().fg(Color::Black).bg(Color::Gray),
        )),
        right,
    );
}

fn render_body(frame: &mut Frame<'_>, area: Rect, state: &AppState, node: &NodeState) {
    let banner = node_banner(state, node);
    let [banner_area, view_area] = Layout::vertical([
        Constraint::Length(u16::from(banner.is_some())),
        Constraint::Min(0),
    ])
    .areas(area);
    if let Some(b) = banner {
        frame.render_widget(b, banner_area);
    }
    if node.overview.data.is_none() && node.health != Health::Up {
        render_no_data(frame, view_area, node);
        return;
    }
    match state.view {
        View::Overview => overview::render(frame, view_area, state, node),
        View::Connections => connections::render_connections(frame, view_area, state, node),
        View::Slow => connections::render_slow(frame, view_area, state, node),
        View::Latency => latency::render(frame, view_area, state, node),
        View::Memory => memory::render(frame, view_area, state, node),
        View::Profile => profile::render(frame, view_area, state, node),
        View::Logs => logs::render(frame, view_area, state, node),
        View::Users => users::render(frame, view_area, state, node),
        View::Trace => trace::render(frame, view_area, state),
        View::Webhooks => webhooks::render(frame, view_area, state, node),
    }
}

/// A one-line warning above the view when the node is not answering normally.
fn node_banner(state: &AppState, node: &NodeState) -> Option<Line<'static>> {
    let stale = node
        .overview
        .at
        .map(|at| {
            format!(
                "; showing data from {} ago",
                fmt::ago(state.now.saturating_duration_since(at))
            )
        })
        .unwrap_or_default();
    match &node.health {
        Health::Up | Health::Connecting => None,
        Health::Unreachable { error, since } => Some(Line::from(Span::styled(
            format!(
                " ✖ node unreachable for {}: {error}. Retrying every poll{stale}",
                fmt::ago(state.now.saturating_duration_since(*since))
            ),
            Style::new().fg(Color::White).bg(BAD).bold(),
        ))),
        Health::Failing { error } => Some(Line::from(Span::styled(
            format!(
                " ▲ node answers with an error: {error}{}{stale}",
                token_hint(error)
            ),
            Style::new().fg(Color::Black).bg(WARN).bold(),
        ))),
    }
}

fn token_hint(error: &str) -> &'static str {
    if error.contains("HTTP 401") {
        " (check --token, --token-file or IM_ADMIN_TOKEN)"
    } else {
        ""
    }
}

fn render_no_data(frame: &mut Frame<'_>, area: Rect, node: &NodeState) {
    let (title, detail) = match &node.health {
        Health::Connecting => ("waiting for the first answer", String::new()),
        Health::Unreachable { error, .. } => ("node unreachable", error.clone()),
        Health::Failing { error } => (
            "node answers with an error",
            format!("{error}{}", token_hint(error)),
        ),
        Health::Up => ("no data yet", String::new()),
    };
    let text = Text::from(vec![
        Line::from(Span::styled(title, Style::new().bold().fg(BAD))),
        Line::from(""),
        Line::from(format!("{}  {detail}", node.url)),
        Line::from(""),
        Line::from(Span::styled(
            "The console keeps polling; the views fill in as soon as the node answers.",
            Style::new().fg(DIM),
        )),
    ]);
    let block = Block::bordered().title(" no data ");
    let inner = centered(area, 90, 9);
    frame.render_widget(
        Paragraph::new(text)
            .block(block)
            .centered()
            .wrap(Wrap { trim: true }),
        inner,
    );
}

/// Describes why a resource has no fresh data, for the views' placeholders.
pub(crate) fn problem<T>(f: &Fetched<T>, what: &str) -> Option<Line<'static>> {
    match (&f.error, &f.data) {
        (Some(ApiError::RouteMissing { path }), _) => Some(Line::from(Span::styled(
            format!(
                "{what} are not available on this node: GET {path} answered 404 \"no such route\" (the server predates this route)"
            ),
            Style::new().fg(WARN).bold(),
        ))),
        (Some(e), Some(_)) => Some(Line::from(Span::styled(
            format!("{what}: last fetch failed ({e}); showing the previous answer"),
            Style::new().fg(WARN),
        ))),
        (Some(e), None) => Some(Line::from(Span::styled(
            format!("{what}: {e}"),
            Style::new().fg(BAD).bold(),
        ))),
        (None, None) => Some(Line::from(Span::styled(format!("loading {what}…"), Style::new().fg(DIM)))),
        (None, Some(_)) => None,
    }
}

/// Titled bordered block.
pub(crate) fn block(title: impl Into<String>) -> Block<'static> {
    Block::bordered()
        .border_style(Style::new().fg(DIM))
        .title(Span::styled(
            format!(" {} ", title.into()),
            Style::new().fg(ACCENT).bold(),
        ))
}

/// Style of a table's selected row.
pub(crate) fn selected_style() -> Style {
    Style::new().add_modifier(Modifier::REVERSED)
}

/// Header row style.
pub(crate) fn header_style() -> Style {
    Style::new().fg(ACCENT).bold()
}

/// Green/yellow/red for a headroom ratio (1 = all free).
pub(crate) fn headroom_color(r: f64) -> Color {
    if r >= 0.5 {
        OK
    } else if r >= 0.2 {
        WARN
    } else {
        BAD
    }
}

/// A `w`x`h` rectangle centred in `area` (clamped to it).
pub(crate) fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let [r] = Layout::horizontal([Constraint::Length(w.min(area.width))])
        .flex(Flex::Center)
        .areas(area);
    let [r] = Layout::vertical([Constraint::Length(h.min(area.height))])
        .flex(Flex::Center)
        .areas(r);
    r
}

fn render_help(frame: &mut Frame<'_>, area: Rect) {
    let mut lines = Vec::new();
    for (group, keys) in HELP {
        lines.push(Line::from(Span::styled(
            *group,
            Style::new().fg(ACCENT).bold(),
        )));
        for (k, what) in *keys {
            lines.push(Line::from(vec![
                Span::styled(format!("  {k:<26}"), Style::new().fg(WARN)),
                Span::raw(*what),
            ]));
        }
    }
    let h = lines.len() as u16 + 2;
    let r = centered(area, 118, h);
    frame.render_widget(Clear, r);
    frame.render_widget(
        Paragraph::new(lines).block(block("keys  (esc or ? closes)")),
        r,
    );
}

fn render_confirm(frame: &mut Frame<'_>, area: Rect, node: &str, c: &crate::api::Connection) {
    let r = centered(area, 80, 8);
    frame.render_widget(Clear, r);
    let text = vec![
        Line::from(Span::styled(
            format!("Kick connection {} on {node}?", c.conn_id),
            Style::new().bold(),
        )),
        Line::from(format!(
            "user {} · {} · {} · queued {}",
            crate::state::display_user(&c.user_id),
            c.remote,
            c.state,
            fmt::bytes(c.queued_bytes)
        )),
        Line::from(Span::styled(
            "The client gets close code 4002 (kicked by operator) and may reconnect.",
            Style::new().fg(DIM),
        )),
        Line::from(""),
        Line::from(vec![
            Span::styled(" y ", Style::new().fg(Color::Black).bg(BAD).bold()),
            Span::raw(" kick    "),
            Span::styled(" n ", Style::new().fg(Color::Black).bg(Color::Gray)),
            Span::raw(" / esc  cancel"),
        ]),
    ];
    frame.render_widget(
        Paragraph::new(text).block(block("confirm kick").border_style(Style::new().fg(BAD))),
        r,
    );
}

fn render_confirm_revoke(frame: &mut Frame<'_>, area: Rect, node: &str, user: &str) {
    let r = centered(area, 80, 8);
    frame.render_widget(Clear, r);
    let text = vec![
        Line::from(Span::styled(
            format!("Revoke every token of {user} (asked of {node})?"),
            Style::new().bold(),
        )),
        Line::from("All of the user's sessions close with code 4003 on every node."),
        Line::from(Span::styled(
            "Tokens issued until now are refused, also after a restart; new ones work.",
            Style::new().fg(DIM),
        )),
        Line::from(""),
        Line::from(vec![
            Span::styled(" y ", Style::new().fg(Color::Black).bg(BAD).bold()),
            Span::raw(" revoke  "),
            Span::styled(" n ", Style::new().fg(Color::Black).bg(Color::Gray)),
            Span::raw(" / esc  cancel"),
        ]),
    ];
    frame.render_widget(
        Paragraph::new(text).block(block("confirm revoke").border_style(Style::new().fg(BAD))),
        r,
    );
}

fn render_picker(frame: &mut Frame<'_>, area: Rect, state: &AppState, cursor: usize) {
    let h = state.nodes.len() as u16 + 5;
    let r = centered(area, 120, h);
    frame.render_widget(Clear, r);
    let header = Row::new([
        "#", "node", "url", "health", "conns", "in/s", "out/s", "backlog", "slow", "headroom",
    ])
    .style(header_style());
    let mut rows: Vec<Row<'_>> = state
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            let o = n.live_overview();
            let num = |f: &dyn Fn(&crate::api::Overview) -> String| o.map_or("-".to_owned(), f);
            let mut row = Row::new(vec![
                Cell::from(format!("{}", i + 1)),
                Cell::from(n.name().to_owned()),
                Cell::from(n.url.clone()),
                Cell::from(health_span(&n.health)),
                Cell::from(num(&|o| o.connections.to_string())),
                Cell::from(num(&|o| fmt::count(o.msg_rate_in))),
                Cell::from(num(&|o| fmt::count(o.msg_rate_out))),
                Cell::from(num(&|o| o.persist_backlog.to_string())),
                Cell::from(num(&|o| o.slow_consumers.to_string())),
                Cell::from(num(&|o| o.capacity.headroom_connections.to_string())),
            ]);
            if i == cursor {
                row = row.style(selected_style());
            }
            row
        })
        .collect();
    let c = state.cluster();
    rows.push(
        Row::new(vec![
            String::new(),
            "cluster".into(),
            format!("{}/{} up", c.up, c.nodes),
            String::new(),
            c.connections.to_string(),
            fmt::count(c.msg_rate_in),
            fmt::count(c.msg_rate_out),
            c.persist_backlog.to_string(),
            c.slow_consumers.to_string(),
            c.headroom_connections.to_string(),
        ])
        .style(Style::new().bold())
        .top_margin(0),
    );
    let widths = [
        Constraint::Length(2),
        Constraint::Length(16),
        Constraint::Min(20),
        Constraint::Length(13),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(7),
        Constraint::Length(8),
        Constraint::Length(5),
        Constraint::Length(9),
    ];
    frame.render_widget(
        Table::new(rows, widths)
            .header(header)
            .block(block("nodes  (j/k, enter picks, esc closes)")),
        r,
    );
}

fn render_form(frame: &mut Frame<'_>, area: Rect, form: &Form) {
    let title = match form.kind {
        crate::state::FormKind::LogFilter => "add per-uid log filter",
        crate::state::FormKind::Profile => "capture CPU profile",
        crate::state::FormKind::HeapProfile => "capture heap profile",
        crate::state::FormKind::GlobalLevel => "global log level (EnvFilter syntax)",
        crate::state::FormKind::Announce => "announce a SYSTEM message to a group",
        crate::state::FormKind::Trace => "trace a message (32 hex digits)",
    };
    let mut lines = Vec::new();
    for (i, f) in form.fields.iter().enumerate() {
        let focused = i == form.focus;
        let label = Span::styled(
            format!("{} {:<16}", if focused { "▶" } else { " " }, f.label),
            if focused {
                Style::new().fg(ACCENT).bold()
            } else {
                Style::new()
            },
        );
        let value = match f.choices {
            Some(choices) => Span::raw(
                choices
                    .iter()
                    .map(|c| {
                        if *c == f.value {
                            format!("[{c}]")
                        } else {
                            format!(" {c} ")
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(""),
            ),
            None => Span::raw(format!("{}{}", f.value, if focused { "█" } else { "" })),
        };
        lines.push(Line::from(vec![label, value]));
    }
    lines.push(Line::from(""));
    match &form.error {
        Some(e) => lines.push(Line::from(Span::styled(
            e.clone(),
            Style::new().fg(BAD).bold(),
        ))),
        None => lines.push(Line::from(Span::styled(
            "tab/↓ next field · ←/→ choose · enter submit · esc cancel",
            Style::new().fg(DIM),
        ))),
    }
    let r = centered(area, 72, lines.len() as u16 + 2);
    frame.render_widget(Clear, r);
    frame.render_widget(Paragraph::new(lines).block(block(title)), r);
}
