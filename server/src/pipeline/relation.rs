//! Relation stage: who may post to a conversation and who receives it. Owns the group
//! membership cache (loaded from the store on first use, replaced by the persistence
//! writer after each committed group change).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use tokio::sync::mpsc;

use crate::store::{Store, StoreError};

/// Sorted member list of one group, shared by every delivery that uses it.
pub type Members = Arc<[String]>;

/// Group membership cache in front of the store.
pub struct Relations {
    store: Arc<dyn Store>,
    groups: RwLock<HashMap<String, Members>>,
    changes: OnceLock<mpsc::UnboundedSender<String>>,
}

impl Relations {
    /// An empty cache over `store`.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Relations {
            store,
            groups: RwLock::new(HashMap::new()),
            changes: OnceLock::new(),
        }
    }

    /// Also reports every committed change's group id on `tx` (cluster mode: the other
    /// nodes evict their cached copy).
    pub fn notify_changes(&self, tx: mpsc::UnboundedSender<String>) {
        let _ = self.changes.set(tx);
    }

    /// Drops a cached group (changed on another node); the next use reads the store.
    pub fn evict(&self, group_id: &str) {
        if let Ok(mut g) = self.groups.write() {
            g.remove(group_id);
        }
    }

    /// Drops every cached group (group-change notices from other nodes may have been
    /// lost while the cluster link was down); each group is read again on next use.
    pub fn evict_all(&self) {
        if let Ok(mut g) = self.groups.write() {
            g.clear();
        }
    }

    /// Members of a group (`None` when it does not exist).
    pub async fn members(&self, group_id: &str) -> Result<Option<Members>, StoreError> {
        if let Some(m) = self.cached(group_id) {
            return Ok(Some(m));
        }
        let Some(mut list) = self.store.group_members(group_id).await? else {
            return Ok(None);
        };
        list.sort();
        let members: Members = list.into();
        if let Ok(mut g) = self.groups.write() {
            // A writer update may have landed meanwhile; it is newer than our read.
            return Ok(Some(
                g.entry(group_id.to_string())
                    .or_insert_with(|| members.clone())
                    .clone(),
            ));
        }
        Ok(Some(members))
    }

    /// Whether `user` is a member of the group (false when it does not exist).
    pub async fn is_member(&self, group_id: &str, user: &str) -> Result<bool, StoreError> {
        Ok(self
            .members(group_id)
            .await?
            .is_some_and(|m| is_in(&m, user)))
    }

    /// Replaces the cached members after a committed change.
    pub fn update(&self, group_id: &str, mut members: Vec<String>) {
        members.sort();
        if let Ok(mut g) = self.groups.write() {
            g.insert(group_id.to_string(), members.into());
        }
        if let Some(tx) = self.changes.get() {
            let _ = tx.send(group_id.to_string());
        }
    }

    fn cached(&self, group_id: &str) -> Option<Members> {
        self.groups.read().ok()?.get(group_id).cloned()
    }
}

/// Whether `user` is in a sorted member list.
pub fn is_in(members: &[String], user: &str) -> bool {
    members.binary_search_by(|m| m.as_str().cmp(user)).is_ok()
}
