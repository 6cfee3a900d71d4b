//! Latency view: one bar per stage showing p50, p99 and p999 on one axis (log scale by
//! default, `t` for linear), so the slowest stage stands out at a glance.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::Style;
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use ratatui::Frame;

use super::{block, header_style, ACCENT, BAD, DIM, OK, WARN};
use crate::api::StageLatency;
use crate::fmt;
use crate::state::{AppState, NodeState};

/// Width of the columns left of the bars.
const LEFT: usize = 16 + 10 + 10 + 10 + 10;

/// The stage with the highest p99 among those that ran (`end_to_end` excluded: it spans them all).
pub fn slowest_stage(stages: &[StageLatency]) -> Option<String> {
    stages
        .iter()
        .filter(|s| s.count > 0 && s.stage != "end_to_end")
        .max_by(|a, b| a.p99_us.total_cmp(&b.p99_us))
        .map(|s| s.stage.clone())
}

/// Maps microseconds to a column in `0..=width`.
struct Scale {
    log: bool,
    lo: f64,
    hi: f64,
    width: usize,
}

impl Scale {
    fn new(stages: &[StageLatency], log: bool, width: usize) -> Scale {
        let ran = || stages.iter().filter(|s| s.count > 0);
        let max = ran().map(|s| s.p999_us.max(s.p99_us)).fold(0.0, f64::max);
        let min = ran()
            .map(|s| s.p50_us)
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min);
        if log {
            let lo = if min.is_finite() {
                10f64.powf(min.log10().floor())
            } else {
                1.0
            };
            let hi = if max > 0.0 {
                10f64.powf(max.log10().ceil())
            } else {
                10.0
            };
            let hi = if hi <= lo { lo * 10.0 } else { hi };
            Scale { log, lo, hi, width }
        } else {
            Scale {
                log,
                lo: 0.0,
                hi: if max > 0.0 { max } else { 1.0 },
                width,
            }
        }
    }

    fn col(&self, us: f64) -> usize {
        if us <= 0.0 {
            return 0;
        }
        let f = if self.log {
            (us.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            us / self.hi
        };
        (f.clamp(0.0, 1.0) * self.width as f64).round() as usize
    }

    /// Tick labels under the bars.
    fn axis(&self) -> String {
        let mut row = vec![' '; self.width + 8];
        let mut put = |col: usize, label: String| {
            for (i, ch) in label.chars().enumerate() {
                if let Some(c) = row.get_mut(col + i) {
                    *c = ch;
                }
            }
        };
        if self.log {
            let mut v = self.lo;
            while v <= self.hi * 1.0001 {
                put(self.col(v), format!("|{}", tick(v)));
                v *= 10.0;
            }
        } else {
            for i in 0..=4 {
                let v = self.hi * i as f64 / 4.0;
                let label = if i == 0 {
                    "|0".to_owned()
                } else {
                    format!("|{}", fmt::micros(v))
                };
                put(
                    self.col(v).min(self.width.saturating_sub(label.len())),
                    label,
                );
            }
        }
        row.into_iter().collect::<String>().trim_end().to_owned()
    }
}

/// A decade as a tick label: `0.1µs`, `1µs`, `10µs`, `1ms`, `10s`.
fn tick(us: f64) -> String {
    let (v, unit) = if us >= 1e6 {
        (us / 1e6, "s")
    } else if us >= 1e3 {
        (us / 1e3, "ms")
    } else {
        (us, "µs")
    };
    let v = (v * 10.0).round() / 10.0;
    if v >= 1.0 {
        format!("{v:.0}{unit}")
    } else {
        format!("{v}{unit}")
    }
}

fn bar(s: &StageLatency, scale: &Scale) -> Vec<Span<'static>> {
    if s.count == 0 {
        return vec![Span::styled(
            "did not run in the window",
            Style::new().fg(DIM),
        )];
    }
    let a = scale.col(s.p50_us).max(1);
    let b = scale.col(s.p99_us).max(a);
    let c = scale.col(s.p999_us).max(b);
    vec![
        Span::styled("█".repeat(a), Style::new().fg(OK)),
        Span::styled("▓".repeat(b - a), Style::new().fg(WARN)),
        Span::styled("░".repeat(c - b), Style::new().fg(BAD)),
    ]
}

/// Draws the per-stage distribution of `node`.
pub fn render(frame: &mut Frame<'_>, area: Rect, state: &AppState, node: &NodeState) {
    let Some(o) = node.overview.data.as_ref() else {
        return;
    };
    let outer = block(format!(
        "per-stage latency over the last {}s · {} scale (t toggles) · probes {}",
        o.latency_window_secs,
        if state.latency_log_scale {
            "log"
        } else {
            "linear"
        },
        if o.probes { "on" } else { "off" }
    ));
    let inner = outer.inner(area);
    frame.render_widget(outer, area);
    // Bars start after the columns and two spaces; leave room for " ◀ slowest p99".
    let width = (inner.width as usize).saturating_sub(LEFT + 2 + 15).max(10);
    let scale = Scale::new(&o.stages, state.latency_log_scale, width);
    let slowest = slowest_stage(&o.stages);
    let spaced = inner.height as usize >= o.stages.len() * 2 + 6;

    let mut lines = vec![Line::from(Span::styled(
        format!(
            "{:<16}{:>10}{:>10}{:>10}{:>10}  distribution",
            "stage", "count", "p50", "p99", "p999"
        ),
        header_style(),
    ))];
    for s in &o.stages {
        if s.stage == "end_to_end" {
            lines.push(Line::from(Span::styled(
                format!("{:<16}{}", "", "─".repeat(width + LEFT - 16)),
                Style::new().fg(DIM),
            )));
        }
        let is_slowest = slowest.as_deref() == Some(s.stage.as_str());
        let name_style = if is_slowest {
            Style::new().fg(BAD).bold()
        } else if s.count == 0 {
            Style::new().fg(DIM)
        } else {
            Style::new()
        };
        let mut spans = vec![
            Span::styled(format!("{:<16}", s.stage), name_style),
            Span::styled(format!("{:>10}", s.count), Style::new().fg(DIM)),
            Span::raw(format!("{:>10}", fmt::micros(s.p50_us))),
            Span::styled(format!("{:>10}", fmt::micros(s.p99_us)), name_style),
            Span::raw(format!("{:>10}  ", fmt::micros(s.p999_us))),
        ];
        spans.extend(bar(s, &scale));
        if is_slowest {
            spans.push(Span::styled(" ◀ slowest p99", Style::new().fg(BAD).bold()));
        }
        lines.push(Line::from(spans));
        if spaced {
            lines.push(Line::from(""));
        }
    }
    lines.push(Line::from(Span::styled(
        format!("{:<w$}{}", "", scale.axis(), w = LEFT + 2),
        Style::new().fg(DIM),
    )));
    lines.push(Line::from(""));
    lines.push(Line::from(vec![
        Span::raw(" "),
        Span::styled("█", Style::new().fg(OK)),
        Span::raw(" up to p50   "),
        Span::styled("▓", Style::new().fg(WARN)),
        Span::raw(" p50..p99   "),
        Span::styled("░", Style::new().fg(BAD)),
        Span::raw(" p99..p999   "),
        Span::styled(
            match &slowest {
                Some(s) => format!("slowest stage by p99: {s}"),
                None => "no stage ran in the window".to_owned(),
            },
            Style::new().fg(ACCENT).bold(),
        ),
        Span::styled(
            "   (percentiles are histogram bucket bounds, within ~19%)",
            Style::new().fg(DIM),
        ),
    ]));
    let [body] = Layout::vertical([Constraint::Min(0)]).areas(inner);
    frame.render_widget(Paragraph::new(lines), body);
}
