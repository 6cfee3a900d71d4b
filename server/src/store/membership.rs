//! Group membership in front of the store: who may post to a group conversation and
//! who receives it (read by the pipeline's relation stage and the persistence writer;
//! the cluster evicts what other nodes changed). Owns the group membership cache:
//! loaded from the store on first use, patched by the persistence writer after each
//! committed group change, bounded (least recently used entries go
//! first) and versioned by the group's change seq, so a stale load or a late patch never
//! replaces a newer list. In cluster mode an entry older than its time to live is read
//! again, so a lost invalidation from another node is repaired within that time; one
//! caller reads it while the others keep using the expired copy until the read lands.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{Store, StoreError};

/// Sorted member list of one group, shared by every delivery that uses it.
pub type Members = Arc<[String]>;

/// One cached group.
struct Entry {
    members: Members,
    /// Seq of the group's last membership change the list includes.
    version: u64,
    /// When it was read from the store or last patched.
    fresh_at: Instant,
    /// Past its time to live, one caller is reading it again; the others keep using
    /// this copy meanwhile (so a large group's expiry is one store read, not one per
    /// member's request).
    reloading: AtomicBool,
    /// Use tick, for least-recently-used eviction.
    used: AtomicU64,
    /// The group was dissolved (or is gone): no members, not found for new requests.
    gone: bool,
}

/// Group membership cache in front of the store.
pub struct Relations {
    store: Arc<dyn Store>,
    groups: RwLock<HashMap<String, Entry>>,
    changes: OnceLock<mpsc::UnboundedSender<(String, u64)>>,
    capacity: usize,
    ttl: Option<Duration>,
    tick: AtomicU64,
}

impl Relations {
    /// An empty cache over `store` holding at most 10,000 groups, with no time to live.
    pub fn new(store: Arc<dyn Store>) -> Self {
        Self::with_limits(store, 10_000, None)
    }

    /// An empty cache of at most `capacity` groups; with `ttl`, an entry older than it
    /// is read again from the store on its next use (cluster mode).
    pub fn with_limits(store: Arc<dyn Store>, capacity: usize, ttl: Option<Duration>) -> Self {
        Relations {
            store,
            groups: RwLock::new(HashMap::new()),
            changes: OnceLock::new(),
            capacity: capacity.max(1),
            ttl,
            tick: AtomicU64::new(0),
        }
    }

    /// Also reports every committed change's group id and version on `tx` (cluster mode:
    /// the other nodes evict their older copy).
    pub fn notify_changes(&self, tx: mpsc::UnboundedSender<(String, u64)>) {
        let _ = self.changes.set(tx);
    }

    /// Drops a cached group older than `version` (changed on another node); the next use
    /// reads the store. `version` 0 drops it whatever its version.
    pub fn evict(&self, group_id: &str, version: u64) {
        if let Ok(mut g) = self.groups.write() {
            if g.get(group_id)
                .is_some_and(|e| version == 0 || e.version < version)
            {
                g.remove(group_id);
            }
        }
    }

    /// Whether the writer must compare cached versions with the store before a commit
    /// (cluster mode: other nodes change groups too).
    pub fn verifies_versions(&self) -> bool {
        self.ttl.is_some()
    }

    /// The cached version of a group.
    pub fn version_of(&self, group_id: &str) -> Option<u64> {
        self.groups.read().ok()?.get(group_id).map(|e| e.version)
    }

    /// Reads a group from the store again (its cached copy is older than the store's).
    pub async fn reload(&self, group_id: &str) -> Result<(), StoreError> {
        match self.store.group_members(group_id).await? {
            Some((mut list, version)) => {
                list.sort();
                self.insert(group_id, list.into(), version, false);
            }
            None => {
                self.insert(group_id, Vec::new().into(), u64::MAX, true);
            }
        }
        Ok(())
    }

    /// Cached groups (the admin API and tests).
    pub fn len(&self) -> usize {
        self.groups.read().map(|g| g.len()).unwrap_or(0)
    }

    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every cached group (group-change notices from other nodes may have been
    /// lost while the cluster link was down); each group is read again on next use.
    pub fn evict_all(&self) {
        if let Ok(mut g) = self.groups.write() {
            g.clear();
        }
    }

    /// Members of a live group (`None` when it does not exist or was dissolved).
    pub async fn members(&self, group_id: &str) -> Result<Option<Members>, StoreError> {
        if let Some((m, gone)) = self.cached_entry(group_id) {
            return Ok((!gone).then_some(m));
        }
        let read = self.store.group_members(group_id).await;
        let Some((mut list, version)) = read.inspect_err(|_| self.reload_failed(group_id))? else {
            return Ok(None);
        };
        list.sort();
        let members: Members = list.into();
        Ok(Some(self.insert(group_id, members, version, false)))
    }

    /// Whether `user` is a member of the group (false when it does not exist).
    pub async fn is_member(&self, group_id: &str, user: &str) -> Result<bool, StoreError> {
        Ok(self
            .members(group_id)
            .await?
            .is_some_and(|m| is_in(&m, user)))
    }

    /// Applies a committed change of this node to the cached list (if cached and older)
    /// and reports it to the other nodes.
    pub fn apply(&self, group_id: &str, added: &[String], removed: &[String], version: u64) {
        if let Ok(mut g) = self.groups.write() {
            if let Some(e) = g.get_mut(group_id) {
                if e.version < version {
                    let gone: std::collections::HashSet<&str> =
                        removed.iter().map(String::as_str).collect();
                    let mut list: Vec<String> = e
                        .members
                        .iter()
                        .filter(|m| !gone.contains(m.as_str()))
                        .chain(added)
                        .cloned()
                        .collect();
                    list.sort_unstable();
                    list.dedup();
                    e.members = list.into();
                    e.version = version;
                    e.fresh_at = Instant::now();
                }
            }
        }
        if let Some(tx) = self.changes.get() {
            let _ = tx.send((group_id.to_owned(), version));
        }
    }

    /// A change applied from another region's replication stream (`region_repl`): the
    /// cached copy older than `version` goes, and the other nodes are told.
    pub fn changed_elsewhere(&self, group_id: &str, version: u64) {
        self.evict(group_id, version);
        if let Some(tx) = self.changes.get() {
            let _ = tx.send((group_id.to_owned(), version));
        }
    }

    /// Marks a group dissolved (no members, not found) and reports it.
    pub fn dissolved(&self, group_id: &str, version: u64) {
        self.insert(group_id, Vec::new().into(), version, true);
        if let Some(tx) = self.changes.get() {
            let _ = tx.send((group_id.to_owned(), version));
        }
    }

    /// The cached list if present and fresh, without touching the store (the writer's
    /// re-check of senders and recipients).
    /// A dissolved group is cached as an empty list.
    pub fn cached(&self, group_id: &str) -> Option<Members> {
        self.cached_entry(group_id).map(|(m, _)| m)
    }

    fn cached_entry(&self, group_id: &str) -> Option<(Members, bool)> {
        let g = self.groups.read().ok()?;
        let e = g.get(group_id)?;
        if self.ttl.is_some_and(|ttl| e.fresh_at.elapsed() > ttl)
            && !e.reloading.swap(true, Ordering::AcqRel)
        {
            return None;
        }
        e.used
            .store(self.tick.fetch_add(1, Ordering::Relaxed), Ordering::Relaxed);
        Some((e.members.clone(), e.gone))
    }

    /// A read of an expired entry failed: the next caller tries again.
    fn reload_failed(&self, group_id: &str) {
        if let Ok(g) = self.groups.read() {
            if let Some(e) = g.get(group_id) {
                e.reloading.store(false, Ordering::Release);
            }
        }
    }

    /// Caches a list read from the store unless a newer one is cached; returns the one kept.
    fn insert(&self, group_id: &str, members: Members, version: u64, gone: bool) -> Members {
        let Ok(mut g) = self.groups.write() else {
            return members;
        };
        let now = Instant::now();
        let used = AtomicU64::new(self.tick.fetch_add(1, Ordering::Relaxed));
        if let Some(e) = g.get_mut(group_id) {
            if e.version > version || (e.gone && !gone) {
                // A read older than the copy: that copy stays, and the next caller past
                // its time to live may read again.
                e.reloading = AtomicBool::new(false);
                return e.members.clone();
            }
            e.members = members.clone();
            e.version = version;
            e.fresh_at = now;
            e.reloading = AtomicBool::new(false);
            e.used = used;
            e.gone = gone;
            return members;
        }
        if g.len() >= self.capacity {
            // Evict the least recently used eighth at once, so the scan is amortised.
            let mut ticks: Vec<(u64, String)> = g
                .iter()
                .map(|(k, e)| (e.used.load(Ordering::Relaxed), k.clone()))
                .collect();
            ticks.sort_unstable();
            for (_, k) in ticks.into_iter().take((self.capacity / 8).max(1)) {
                g.remove(&k);
            }
        }
        g.insert(
            group_id.to_owned(),
            Entry {
                members: members.clone(),
                version,
                fresh_at: now,
                reloading: AtomicBool::new(false),
                used,
                gone,
            },
        );
        members
    }
}

/// Whether `user` is in a sorted member list.
pub fn is_in(members: &[String], user: &str) -> bool {
    members.binary_search_by(|m| m.as_str().cmp(user)).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_expired_group_is_read_again_by_one_caller_while_the_others_use_the_old_copy() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SqliteStore::open(&dir.path().join("im.db"), true, 1)
            .await
            .unwrap();
        let ttl = Duration::from_millis(5);
        let r = Relations::with_limits(Arc::new(store), 10, Some(ttl));
        r.insert("big", vec!["a".to_owned(), "b".to_owned()].into(), 3, false);
        assert!(r.cached_entry("big").is_some(), "fresh");
        std::thread::sleep(ttl * 2);
        assert!(
            r.cached_entry("big").is_none(),
            "expired: this caller reads the store"
        );
        let (stale, _) = r.cached_entry("big").expect("the others keep the old copy");
        assert_eq!(stale.len(), 2);
        // A failed read lets the next caller try again; a landed one is fresh.
        r.reload_failed("big");
        assert!(r.cached_entry("big").is_none());
        r.insert("big", vec!["a".to_owned()].into(), 4, false);
        assert_eq!(r.cached_entry("big").map(|(m, _)| m.len()), Some(1));
        assert_eq!(r.version_of("big"), Some(4));
        // A read that lands older than the copy (a patch got there first) keeps the
        // copy and does not leave the reload taken: the next expiry reads again.
        std::thread::sleep(ttl * 2);
        assert!(r.cached_entry("big").is_none());
        r.insert("big", vec!["z".to_owned()].into(), 3, false);
        assert_eq!(r.version_of("big"), Some(4));
        assert!(r.cached_entry("big").is_none(), "still expired: read again");
    }
}
