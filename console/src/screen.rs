//! `View`: which of the console's views is on screen, in tab order. Key actions name a
//! view ([`crate::action`]), the state keeps the current one ([`crate::state`]), the
//! renderer draws it ([`crate::view`]); it depends on none of them.

/// The console's views, in tab order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum View {
    /// Node summary, rates, headroom gauges, stage latency.
    Overview,
    /// The connections table.
    Connections,
    /// Slow consumers and what the node did.
    Slow,
    /// Per-stage latency distribution.
    Latency,
    /// Allocator stats and per-connection memory.
    Memory,
    /// CPU profile capture.
    Profile,
    /// Per-uid log filters and log files.
    Logs,
    /// One user's diagnosis across the cluster (`/` searches a uid).
    Users,
    /// One message's stage timeline across the nodes (key 9).
    Trace,
    /// The webhook endpoints, their queues and the parked events (key 0).
    Webhooks,
}

impl View {
    /// All views in tab order (number keys: [`View::key`]).
    pub const ALL: [View; 10] = [
        View::Overview,
        View::Connections,
        View::Slow,
        View::Latency,
        View::Memory,
        View::Profile,
        View::Logs,
        View::Users,
        View::Trace,
        View::Webhooks,
    ];

    /// Tab title.
    pub fn title(self) -> &'static str {
        match self {
            View::Overview => "Overview",
            View::Connections => "Connections",
            View::Slow => "Slow consumers",
            View::Latency => "Latency",
            View::Memory => "Memory",
            View::Profile => "Profile",
            View::Logs => "Logs",
            View::Users => "Users",
            View::Trace => "Trace",
            View::Webhooks => "Hooks",
        }
    }

    /// The number key that shows this view (and its tab's number).
    pub fn key(self) -> char {
        match self.index() {
            9 => '0',
            i => char::from(b'1' + i as u8),
        }
    }

    /// Position in [`View::ALL`].
    pub fn index(self) -> usize {
        View::ALL.iter().position(|v| *v == self).unwrap_or(0)
    }

    /// The view after this one (wrapping).
    pub fn next(self) -> View {
        View::ALL[(self.index() + 1) % View::ALL.len()]
    }

    /// The view before this one (wrapping).
    pub fn prev(self) -> View {
        View::ALL[(self.index() + View::ALL.len() - 1) % View::ALL.len()]
    }
}
