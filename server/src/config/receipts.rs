//! `[receipts]`: read receipts (who gets a ReadReceipt push after a MarkRead): the
//! group size up to which every online member gets each reader's receipt, what larger
//! groups get, and the coalescing window, with their defaults and validation.

use serde::{Deserialize, Serialize};

use super::check::{invalid, range};
use super::ConfigError;

/// Read receipt settings.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Receipts {
    /// Groups of at most this many members: each reader's receipt goes to the online
    /// members (0: no group gets per-member receipts).
    pub group_member_max: u32,
    /// Larger groups: `"count"` (one receipt per conversation per window, with the
    /// number of readers, to the sender of the message read) or `"none"`.
    pub large_group: String,
    /// Receipts of one (conversation, reader) within this window are coalesced into
    /// one, with the latest seq, ms.
    pub coalesce_ms: u32,
    /// Receipts waiting for the receipt task; more are dropped (and counted).
    pub queue_capacity: u32,
}

impl Default for Receipts {
    fn default() -> Self {
        Receipts {
            group_member_max: 100,
            large_group: "count".into(),
            coalesce_ms: 300,
            queue_capacity: 10_000,
        }
    }
}

impl Receipts {
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        range(
            "receipts.group_member_max",
            self.group_member_max,
            0,
            100_000,
        )?;
        if !matches!(self.large_group.as_str(), "count" | "none") {
            return Err(invalid(
                "receipts.large_group",
                &self.large_group,
                "use \"count\" or \"none\"",
            ));
        }
        range("receipts.coalesce_ms", self.coalesce_ms, 0, 60_000)?;
        range(
            "receipts.queue_capacity",
            self.queue_capacity,
            1,
            10_000_000,
        )?;
        Ok(())
    }

    /// Whether groups above `group_member_max` get counted receipts.
    pub fn counts_large_groups(&self) -> bool {
        self.large_group == "count"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_values_name_the_key() {
        assert!(Receipts::default().validate().is_ok());
        let bad = Receipts {
            large_group: "all".into(),
            ..Receipts::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            e.contains("receipts.large_group") && e.contains("all"),
            "{e}"
        );
        let bad = Receipts {
            coalesce_ms: 70_000,
            ..Receipts::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("receipts.coalesce_ms"), "{e}");
    }
}
