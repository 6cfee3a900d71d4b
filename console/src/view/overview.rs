//! Overview view: the node's figures, sparklines of the last minutes (kept client-side),
//! capacity headroom gauges per resource, the cluster's nodes and the replication between
//! regions (when the node reports them), the tokio runtime and its monitored tasks (when
//! the node reports them) and the p50/p99 of every stage.

use std::collections::VecDeque;

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::{LineGauge, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;

use super::{block, header_style, headroom_color, ACCENT, BAD, DIM, WARN};
use crate::api::{Overview, RuntimeStats};
use crate::fmt;
use crate::state::{AppState, NodeState, HISTORY_LEN};

/// Draws the overview of `node`.
pub fn render(frame: &mut Frame<'_>, area: Rect, _state: &AppState, node: &NodeState) {
    let Some(o) = node.overview.data.as_ref() else {
        return;
    };
    // The stage table gets the rows it needs (but leaves the top panels 8); extra
    // height goes to the sparklines.
    let stage_rows = (o.stages.len() as u16 + 3)
        .min(area.height.saturating_sub(6 + 8))
        .max(3);
    // In cluster mode a table of the nodes goes under the capacity gauges.
    let cluster_rows = if o.cluster.enabled {
        (o.cluster.nodes.len() as u16 + 3).min(area.height.saturating_sub(6 + 8 + stage_rows))
    } else {
        0
    };
    // In multi-region mode (on the node that applies) the region pairs under those.
    let region_rows = if o.regions.is_empty() {
        0
    } else {
        (o.regions.len() as u16 + 3).min(
            area.height
                .saturating_sub(6 + 8 + stage_rows + cluster_rows),
        )
    };
    // The runtime panel (a node that reports it) under those, with what height is left.
    let runtime_rows = o.runtime.as_ref().map_or(0, |r| {
        (r.tasks.len() as u16 + 4 + u16::from(r.tasks.is_empty())).min(
            area.height
                .saturating_sub(6 + 8 + stage_rows + cluster_rows + region_rows),
        )
    });
    let [top, capacity, cluster, regions, runtime, stages] = Layout::vertical([
        Constraint::Min(0),
        Constraint::Length(6),
        Constraint::Length(cluster_rows),
        Constraint::Length(region_rows),
        Constraint::Length(runtime_rows),
        Constraint::Length(stage_rows),
    ])
    .areas(area);
    let [info, sparks] =
        Layout::horizontal([Constraint::Length(48), Constraint::Min(20)]).areas(top);
    render_info(frame, info, o);
    render_sparks(frame, sparks, node);
    render_capacity(frame, capacity, o);
    if cluster_rows > 0 {
        render_cluster(frame, cluster, o);
    }
    if region_rows > 0 {
        render_regions(frame, regions, o);
    }
    if let (Some(r), true) = (&o.runtime, runtime_rows > 0) {
        render_runtime(frame, runtime, r);
    }
    render_stages(frame, stages, o);
}

/// Green/yellow/red for a busy ratio (1 = saturated).
fn busy_color(r: f64) -> ratatui::style::Color {
    headroom_color(1.0 - r)
}

/// The tokio runtime (workers' busy share, global queue, alive tasks) and, per
/// monitored task, its polls, mean poll, slow polls and mean scheduled delay over the
/// last second.
fn render_runtime(frame: &mut Frame<'_>, area: Rect, r: &RuntimeStats) {
    let title = format!(
        "runtime: {} workers {} busy · global queue {} · {} alive tasks",
        r.workers,
        fmt::percent(r.busy_ratio),
        r.global_queue_depth,
        r.alive_tasks
    );
    let outer = block(title);
    let inner = outer.inner(area);
    frame.render_widget(outer, area);
    let [workers, table] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(inner);
    let mut spans = vec![Span::styled(
        format!(" {:<14}", "workers busy"),
        Style::new().fg(DIM),
    )];
    for (i, b) in r.worker_busy_ratio.iter().enumerate() {
        spans.push(Span::styled(format!("w{i} "), Style::new().fg(DIM)));
        spans.push(Span::styled(
            format!("{:<8}", fmt::percent(*b)),
            Style::new().fg(busy_color(*b)).bold(),
        ));
    }
    if r.global_queue_depth > 0 {
        spans.push(Span::styled(
            format!(" {} waiting for a worker", r.global_queue_depth),
            Style::new().fg(WARN).bold(),
        ));
    }
    frame.render_widget(Line::from(spans), workers);
    if r.tasks.is_empty() {
        let why = if r.task_monitors {
            " no monitored task has started"
        } else {
            " task monitors off (obs.task_monitors = false)"
        };
        frame.render_widget(Line::styled(why, Style::new().fg(DIM)), table);
        return;
    }
    let header = Row::new([
        "task",
        "alive",
        "polls/s",
        "mean poll",
        "slow/s",
        "slow total",
        "sched delay",
        "polls total",
    ])
    .style(header_style());
    // A scheduled delay past a millisecond is a task waiting behind others for a worker.
    let rows = r.tasks.iter().map(|t| {
        let delay_style = if t.mean_scheduled_delay_us >= 10_000.0 {
            Style::new().fg(BAD).bold()
        } else if t.mean_scheduled_delay_us >= 1_000.0 {
            Style::new().fg(WARN).bold()
        } else {
            Style::new()
        };
        let slow_style = if t.slow_polls > 0 {
            Style::new().fg(WARN).bold()
        } else {
            Style::new()
        };
        Row::new(vec![
            Span::raw(t.task.clone()),
            Span::raw(t.alive.to_string()),
            Span::raw(t.polls.to_string()),
            Span::raw(fmt::micros(t.mean_poll_us)),
            Span::styled(t.slow_polls.to_string(), slow_style),
            Span::raw(format!(
                "{} ({})",
                t.slow_polls_total,
                fmt::micros(t.slow_poll_secs_total * 1e6)
            )),
            Span::styled(fmt::micros(t.mean_scheduled_delay_us), delay_style),
            Span::raw(t.polls_total.to_string()),
        ])
    });
    let widths = [
        Constraint::Length(16),
        Constraint::Length(6),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Length(7),
        Constraint::Length(16),
        Constraint::Length(12),
        Constraint::Min(11),
    ];
    frame.render_widget(Table::new(rows, widths).header(header), table);
}

/// The cluster's nodes as this node's registry sees them, and the total.
fn render_cluster(frame: &mut Frame<'_>, area: Rect, o: &Overview) {
    let c = &o.cluster;
    let title = match &c.summary {
        Some(s) => format!(
            "Cluster: {}/{} healthy, {} connections, {:.0} msg/s in, headroom {} conns",
            s.healthy, s.nodes, s.connections, s.msg_rate_in, s.headroom_connections
        ),
        None => "Cluster".to_owned(),
    };
    let header = Row::new([
        "node", "state", "conns", "msg/s in", "cpu", "rss", "headroom", "score", "age",
    ])
    .style(header_style());
    let rows = c.nodes.iter().map(|n| {
        let color = match n.state.as_str() {
            "up" => ACCENT,
            "draining" => WARN,
            _ => BAD,
        };
        Row::new(vec![
            Span::raw(n.report.node_id.clone()),
            Span::styled(n.state.clone(), Style::new().fg(color)),
            Span::raw(n.report.connections.to_string()),
            Span::raw(format!("{:.0}", n.report.msg_rate_in)),
            Span::raw(format!("{:.0}%", n.report.cpu_busy * 100.0)),
            Span::raw(fmt::bytes(n.report.rss_bytes)),
            Span::raw(n.report.headroom_connections.to_string()),
            Span::raw(format!("{:.1}", n.score)),
            Span::raw(format!("{:.1}s", n.report_age_ms as f64 / 1000.0)),
        ])
    });
    let widths = [
        Constraint::Min(10),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(9),
        Constraint::Length(6),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Length(8),
        Constraint::Length(6),
    ];
    frame.render_widget(
        Table::new(rows, widths).header(header).block(block(&title)),
        area,
    );
}

/// A lag in seconds: tenths under 10 s, then as [`fmt::secs`].
fn lag_secs(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.1}s")
    } else {
        fmt::secs(s as u64)
    }
}

/// The replication into this node's region from each other one: lag in records and
/// seconds, records applied, and whether the link to the source's stream works.
fn render_regions(frame: &mut Frame<'_>, area: Rect, o: &Overview) {
    let down = o
        .regions
        .iter()
        .filter(|r| r.link_up == Some(false))
        .count();
    let worst = o.regions.iter().map(|r| r.lag_seconds).fold(0.0, f64::max);
    let title = format!(
        "Regions: {} pairs, {down} links down, worst lag {}",
        o.regions.len(),
        lag_secs(worst)
    );
    let header =
        Row::new(["from", "to", "link", "lag msgs", "lag", "applied"]).style(header_style());
    let rows = o.regions.iter().map(|r| {
        let (link, color) = match r.link_up {
            Some(true) => ("up", ACCENT),
            Some(false) => ("link down", BAD),
            None => ("?", DIM),
        };
        let lag_color = if r.lag_seconds >= 30.0 {
            BAD
        } else if r.lag_seconds > 0.0 {
            WARN
        } else {
            ACCENT
        };
        Row::new(vec![
            Span::raw(r.from.clone()),
            Span::raw(r.to.clone()),
            Span::styled(link, Style::new().fg(color)),
            Span::raw(r.lag_messages.to_string()),
            Span::styled(lag_secs(r.lag_seconds), Style::new().fg(lag_color)),
            Span::raw(r.applied_total.to_string()),
        ])
    });
    let widths = [
        Constraint::Length(14),
        Constraint::Length(14),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Length(9),
        Constraint::Min(12),
    ];
    frame.render_widget(
        Table::new(rows, widths).header(header).block(block(&title)),
        area,
    );
}

fn kv(label: &str, value: String, note: String) -> Line<'static> {
    Line::from(vec![
        Span::styled(format!(" {label:<14}"), Style::new().fg(DIM)),
        Span::styled(value, Style::new().bold()),
        Span::styled(note, Style::new().fg(DIM)),
    ])
}

fn render_info(frame: &mut Frame<'_>, area: Rect, o: &Overview) {
    let backlog_style =
        if o.persist_queue_capacity > 0 && o.persist_backlog * 2 > o.persist_queue_capacity {
            Style::new().fg(BAD).bold()
        } else {
            Style::new().bold()
        };
    let slow_style = if o.slow_consumers > 0 {
        Style::new().fg(WARN).bold()
    } else {
        Style::new().bold()
    };
    let mut lines = vec![
        kv(
            "node",
            o.node_id.clone(),
            format!("  v{} {}", o.version, o.store),
        ),
        kv(
            "uptime",
            fmt::secs(o.uptime_secs),
            format!("  probes {}", if o.probes { "on" } else { "off" }),
        ),
    ];
    lines.extend(connections_lines(o));
    lines.extend([
        kv(
            "msgs in",
            format!("{}/s", fmt::count(o.msg_rate_in)),
            format!("  total {}", o.messages_in_total),
        ),
        kv(
            "msgs out",
            format!("{}/s", fmt::count(o.msg_rate_out)),
            format!("  total {}", o.messages_out_total),
        ),
        Line::from(vec![
            Span::styled(format!(" {:<14}", "persist queue"), Style::new().fg(DIM)),
            Span::styled(o.persist_backlog.to_string(), backlog_style),
            Span::styled(
                format!("  of {} waiting", o.persist_queue_capacity),
                Style::new().fg(DIM),
            ),
        ]),
        Line::from(vec![
            Span::styled(format!(" {:<14}", "slow"), Style::new().fg(DIM)),
            Span::styled(o.slow_consumers.to_string(), slow_style),
            Span::styled(
                format!("  closed since start {}", o.slow_consumer_disconnects),
                Style::new().fg(DIM),
            ),
        ]),
        kv(
            "queued out",
            fmt::bytes(o.outbound_queued_bytes),
            String::new(),
        ),
        kv(
            "cpu busy",
            fmt::percent(o.cpu_busy),
            format!("  of {} cores", o.process.cores),
        ),
        kv(
            "rss",
            fmt::bytes(o.process.rss_bytes),
            format!("  of {}", fmt::bytes(o.process.memory_limit_bytes)),
        ),
        kv(
            "fds",
            format!("{}", o.process.open_fds),
            format!("  of {}", o.process.max_fds),
        ),
    ]);
    frame.render_widget(Paragraph::new(lines).block(block("node")), area);
}

/// The last `width` samples of a series.
fn tail(series: &VecDeque<u64>, width: u16) -> Vec<u64> {
    let skip = series.len().saturating_sub(width as usize);
    series.iter().skip(skip).copied().collect()
}

/// One sparkline: title, samples, value formatter, colour.
type Series<'a> = (
    &'a str,
    &'a VecDeque<u64>,
    fn(u64) -> String,
    ratatui::style::Color,
);

fn render_sparks(frame: &mut Frame<'_>, area: Rect, node: &NodeState) {
    let h = &node.history;
    let minutes = (h.connections.len() as f64 / 60.0).ceil().max(1.0) as u64;
    let outer = block(format!(
        "last {minutes} min (1 sample/s, up to {} min kept)",
        HISTORY_LEN / 60
    ));
    let inner = outer.inner(area);
    frame.render_widget(outer, area);
    let rows = Layout::vertical([Constraint::Ratio(1, 2), Constraint::Ratio(1, 2)]).split(inner);
    let cols = |r: Rect| {
        Layout::horizontal([
            Constraint::Ratio(1, 3),
            Constraint::Ratio(1, 3),
            Constraint::Ratio(1, 3),
        ])
        .split(r)
    };
    let top = cols(rows[0]);
    let bottom = cols(rows[1]);
    let series: [Series<'_>; 6] = [
        ("connections", &h.connections, |v| v.to_string(), ACCENT),
        (
            "msgs in/s",
            &h.msg_in,
            |v| fmt::count(v as f64),
            ratatui::style::Color::Green,
        ),
        (
            "msgs out/s",
            &h.msg_out,
            |v| fmt::count(v as f64),
            ratatui::style::Color::Blue,
        ),
        (
            "persist queue",
            &h.backlog,
            |v| v.to_string(),
            ratatui::style::Color::Magenta,
        ),
        ("slow consumers", &h.slow, |v| v.to_string(), WARN),
        ("rss", &h.rss, fmt::bytes, ratatui::style::Color::Gray),
    ];
    for (i, (name, s, f, color)) in series.into_iter().enumerate() {
        let cell = if i < 3 { top[i] } else { bottom[i - 3] };
        let [title, spark] =
            Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(cell);
        let data = tail(s, spark.width.saturating_sub(1));
        let last = data.last().copied().unwrap_or(0);
        let max = data.iter().copied().max().unwrap_or(0);
        let mut spans = vec![
            Span::styled(format!(" {name} "), Style::new().fg(DIM)),
            Span::styled(f(last), Style::new().bold()),
        ];
        let peak = format!("  max {}", f(max));
        let used: usize = spans.iter().map(|s| s.content.chars().count()).sum();
        if used + peak.chars().count() < title.width as usize {
            spans.push(Span::styled(peak, Style::new().fg(DIM)));
        }
        frame.render_widget(Line::from(spans), title);
        let mut sp = Sparkline::default()
            .data(data)
            .style(Style::new().fg(color));
        if max == 0 {
            sp = sp.max(1);
        }
        frame.render_widget(
            sp,
            Rect {
                x: spark.x + 1,
                width: spark.width.saturating_sub(1),
                ..spark
            },
        );
    }
}

fn render_capacity(frame: &mut Frame<'_>, area: Rect, o: &Overview) {
    let c = &o.capacity;
    let outer = block("capacity headroom (free share of each resource)");
    let inner = outer.inner(area);
    frame.render_widget(outer, area);
    let rows = Layout::vertical([Constraint::Length(1); 4]).split(inner);
    let gauges = [
        (
            "memory",
            c.ratio_memory,
            format!(
                "rss {} of {} ({})",
                fmt::bytes(o.process.rss_bytes),
                fmt::bytes(o.process.memory_limit_bytes),
                o.process.memory_limit_source
            ),
        ),
        (
            "fds",
            c.ratio_fds,
            format!("{} of {} open", o.process.open_fds, o.process.max_fds),
        ),
        (
            "cpu",
            c.ratio_cpu,
            format!(
                "{} busy of {} cores",
                fmt::percent(o.cpu_busy),
                o.process.cores
            ),
        ),
    ];
    for (i, (name, ratio, detail)) in gauges.into_iter().enumerate() {
        let limiting = c.limiting_resource == name;
        let [g, note] =
            Layout::horizontal([Constraint::Min(20), Constraint::Length(52)]).areas(rows[i]);
        let ratio = if ratio.is_finite() {
            ratio.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let color = headroom_color(ratio);
        frame.render_widget(
            LineGauge::default()
                .ratio(ratio)
                .label(Line::from(vec![
                    Span::styled(
                        format!(" {name:<7}"),
                        if limiting {
                            Style::new().bold().fg(color)
                        } else {
                            Style::new()
                        },
                    ),
                    Span::styled(
                        format!("{:>6} free ", fmt::percent(ratio)),
                        Style::new().fg(color).bold(),
                    ),
                ]))
                .filled_style(Style::new().fg(color))
                .unfilled_style(Style::new().fg(DIM)),
            g,
        );
        let mut spans = vec![Span::styled(format!(" {detail}"), Style::new().fg(DIM))];
        if limiting {
            spans.push(Span::styled("  ◀ limiting", Style::new().fg(color).bold()));
        }
        frame.render_widget(Line::from(spans), note);
    }
    let msgs = match c.headroom_msgs_per_sec {
        Some(m) => format!("{} more msgs/s", fmt::count(m)),
        None => "msgs/s headroom: too idle to tell".to_owned(),
    };
    frame.render_widget(
        Line::from(vec![
            Span::raw(" room for "),
            Span::styled(
                format!("{} more connections", c.headroom_connections),
                Style::new().bold(),
            ),
            Span::raw(format!(" · {msgs} · limited by ")),
            Span::styled(c.limiting_resource.clone(), Style::new().bold()),
            Span::styled(
                format!(
                    " · {} per connection ({})",
                    fmt::bytes(c.per_connection_bytes),
                    if c.per_connection_measured {
                        "measured"
                    } else {
                        "estimate"
                    }
                ),
                Style::new().fg(DIM),
            ),
        ]),
        rows[3],
    );
}

fn render_stages(frame: &mut Frame<'_>, area: Rect, o: &Overview) {
    let slowest = super::latency::slowest_stage(&o.stages);
    let max_p99 = o.stages.iter().map(|s| s.p99_us).fold(0.0, f64::max);
    let header = Row::new([
        "stage",
        "count",
        "p50",
        "p99",
        "p99 (relative to the largest)",
    ])
    .style(header_style());
    // Columns, spacing and borders take 50; leave room for the "◀ slowest" mark.
    let bar_width = area.width.saturating_sub(50 + 11) as f64;
    let rows = o.stages.iter().map(|s| {
        let is_slowest = slowest.as_deref() == Some(s.stage.as_str());
        let n = if max_p99 > 0.0 {
            (s.p99_us / max_p99 * bar_width).round() as usize
        } else {
            0
        };
        let style = if is_slowest {
            Style::new().fg(BAD).bold()
        } else {
            Style::new()
        };
        let bar = format!(
            "{}{}",
            "▆".repeat(n.max(usize::from(s.count > 0))),
            if is_slowest { " ◀ slowest" } else { "" }
        );
        Row::new(vec![
            Span::styled(s.stage.clone(), style),
            Span::raw(s.count.to_string()),
            Span::raw(fmt::micros(s.p50_us)),
            Span::styled(fmt::micros(s.p99_us), style),
            Span::styled(
                bar,
                if is_slowest {
                    Style::new().fg(BAD)
                } else {
                    Style::new().fg(ACCENT)
                },
            ),
        ])
        .style(if s.count == 0 {
            Style::new().fg(DIM)
        } else {
            Style::new()
        })
    });
    let widths = [
        Constraint::Length(15),
        Constraint::Length(9),
        Constraint::Length(10),
        Constraint::Length(10),
        Constraint::Min(10),
    ];
    frame.render_widget(
        Table::new(rows, widths).header(header).block(block(format!(
            "stage latency over the last {}s (4: Latency view for p999)",
            o.latency_window_secs
        ))),
        area,
    );
}

/// `connections  N [of MAX]  users online U`, then `refused  R  full F, per ip P, ...`
/// when the node has refused any (warning colour); the cap shows only when reported.
fn connections_lines(o: &Overview) -> Vec<Line<'static>> {
    let cap = if o.max_connections > 0 {
        format!(" of {}", o.max_connections)
    } else {
        String::new()
    };
    let mut lines = vec![kv(
        "connections",
        o.connections.to_string(),
        format!("{cap}  users online {}", o.users_online),
    )];
    let r = &o.connections_refused;
    if r.total() > 0 {
        let reasons: Vec<String> = [
            ("full", r.node_full),
            ("per ip", r.per_ip),
            ("draining", r.draining),
        ]
        .iter()
        .filter(|(_, n)| *n > 0)
        .map(|(what, n)| format!("{what} {n}"))
        .collect();
        lines.push(Line::from(vec![
            Span::styled(format!(" {:<14}", "refused"), Style::new().fg(DIM)),
            Span::styled(r.total().to_string(), Style::new().fg(WARN).bold()),
            Span::styled(format!("  {}", reasons.join(", ")), Style::new().fg(DIM)),
        ]));
    }
    lines
}
