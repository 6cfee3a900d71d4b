//! Navigation: the connections table's sort keys and the table filter (the views in tab
//! order are [`crate::screen::View`]).

use crate::api::Connection;

/// Sort columns of the connections table (the server's `sort` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SortKey {
    /// Connection id, ascending by default.
    ConnId,
    /// User id, ascending by default.
    User,
    /// Age, oldest first by default.
    Age,
    /// Queued bytes, largest first by default.
    Queued,
    /// Frames in, largest first by default.
    MsgsIn,
    /// Frames out, largest first by default.
    MsgsOut,
    /// State, ascending by default.
    State,
}

impl SortKey {
    /// Cycle order of `s`.
    pub const ALL: [SortKey; 7] = [
        SortKey::ConnId,
        SortKey::User,
        SortKey::Age,
        SortKey::Queued,
        SortKey::MsgsIn,
        SortKey::MsgsOut,
        SortKey::State,
    ];

    /// The server's name for this key.
    pub fn api_name(self) -> &'static str {
        match self {
            SortKey::ConnId => "conn_id",
            SortKey::User => "user",
            SortKey::Age => "age",
            SortKey::Queued => "queued",
            SortKey::MsgsIn => "msgs_in",
            SortKey::MsgsOut => "msgs_out",
            SortKey::State => "state",
        }
    }

    /// The next key in the cycle.
    pub fn next(self) -> SortKey {
        let i = SortKey::ALL.iter().position(|k| *k == self).unwrap_or(0);
        SortKey::ALL[(i + 1) % SortKey::ALL.len()]
    }

    /// The server's `sort` parameter for this key, reversed or not.
    pub fn param(self, reversed: bool) -> String {
        if reversed {
            format!("-{}", self.api_name())
        } else {
            self.api_name().to_owned()
        }
    }

    /// Orders rows the way the server does for this key (numbers largest first).
    pub fn sort(self, rows: &mut [&Connection], reversed: bool) {
        match self {
            SortKey::ConnId => rows.sort_by_key(|c| c.conn_id),
            SortKey::User => {
                rows.sort_by(|a, b| a.user_id.cmp(&b.user_id).then(a.conn_id.cmp(&b.conn_id)))
            }
            SortKey::Age => rows.sort_by(|a, b| b.age_secs.total_cmp(&a.age_secs)),
            SortKey::Queued => rows.sort_by_key(|c| std::cmp::Reverse(c.queued_bytes)),
            SortKey::MsgsIn => rows.sort_by_key(|c| std::cmp::Reverse(c.msgs_in)),
            SortKey::MsgsOut => rows.sort_by_key(|c| std::cmp::Reverse(c.msgs_out)),
            SortKey::State => {
                rows.sort_by(|a, b| a.state.cmp(&b.state).then(a.conn_id.cmp(&b.conn_id)))
            }
        }
        if reversed {
            rows.reverse();
        }
    }
}

/// Case-insensitive substring match on user, remote, state and conn id.
pub fn matches_filter(c: &Connection, filter: &str) -> bool {
    if filter.is_empty() {
        return true;
    }
    let f = filter.to_lowercase();
    c.user_id.to_lowercase().contains(&f)
        || c.remote.to_lowercase().contains(&f)
        || c.state.to_lowercase().contains(&f)
        || c.device.to_lowercase().contains(&f)
        || c.conn_id.to_string() == f
}
