//! Multi-region home moves: the bodies of `POST /admin/v1/homes/{conversation}` (move
//! one conversation's home to the node's region) and `POST /admin/v1/homes` (move every
//! conversation homed in a region), and the answers: a conversation's home with its
//! epoch and fence, a bulk move's counts, the node's view of moves and reconciliation.
//! Meanings: `docs/multi-region.md` and `docs/admin-api.md`.

use serde::{Deserialize, Serialize};

/// `POST /admin/v1/homes/{conversation}`: make `region` (the region of the node asked)
/// the conversation's home. Without `force` the old home must confirm.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveHome {
    /// The new home: the region of the node the request goes to.
    pub region: String,
    /// Move without the old home's confirmation (it is lost).
    #[serde(default)]
    pub force: bool,
}

/// `POST /admin/v1/homes`: move every conversation this region knows that is homed in
/// `from` to `to` (the region of the node asked).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoveHomes {
    /// The old home.
    pub from: String,
    /// The new home: the region of the node the request goes to.
    pub to: String,
    /// Move without the old home's confirmation (it is lost).
    #[serde(default)]
    pub force: bool,
}

/// A conversation's home as this node knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Home {
    /// The conversation.
    pub conversation_id: String,
    /// Its home region.
    pub home: String,
    /// The epoch of that home (0: the hash rule's home, never moved).
    pub epoch: u64,
    /// The last seq of the epoch before (0 when never moved).
    pub fence: u64,
    /// Messages this region set aside above the fence when it moved (a move's answer).
    pub set_aside: u64,
}

/// The answer of a bulk move.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct HomesMoved {
    /// Conversations moved.
    pub moved: u64,
    /// Conversations found homed in `from` and not moved (the first errors are listed).
    pub failed: u64,
    /// The first errors, one line each.
    pub errors: Vec<String>,
}

/// `GET /admin/v1/homes`: this node's view of home moves.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Homes {
    /// This node's region.
    pub region: String,
    /// Whether the node serves its region's homes (it read every other region's stream
    /// since it started).
    pub ready: bool,
    /// Conversations with a moved home.
    pub moved: u64,
    /// Set-aside messages this region still has to re-send to their new home.
    pub reconcile_pending: u64,
    /// Set-aside messages re-sent and committed at their new home.
    pub reconciled: u64,
    /// Set-aside events (SYSTEM, RECALL, EDIT) kept for the operator, not re-sent.
    pub reconcile_kept: u64,
}
