//! Presence: which other nodes each user is connected to, as read from the KV bucket
//! `<prefix>-presence` (one key `<node>.<user>` per user and node while the user has a
//! connection there). The KV watch in `cluster` feeds this map; the router reads it to
//! find the nodes a message must be forwarded to. This node's own users are not kept
//! here (the router's session registry knows them). A key's value is the user's device
//! count on that node (decimal; empty, as older nodes write it, means one), which
//! presence subscriptions show.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};

/// A KV key for `user` on `node`. Ids may hold `.` and `@` (see `im_proto::valid_id`),
/// which KV keys reserve or refuse, so both are escaped with `=` (never in an id).
pub fn key(node: &str, user: &str) -> String {
    format!("{}.{}", escape(node), escape(user))
}

/// The `(node, user)` of a presence key; `None` for a key of another shape.
pub fn parse_key(key: &str) -> Option<(String, String)> {
    let (node, user) = key.split_once('.')?;
    Some((unescape(node)?, unescape(user)?))
}

/// The key prefix of every presence key of `node`.
pub fn node_prefix(node: &str) -> String {
    format!("{}.", escape(node))
}

fn escape(id: &str) -> String {
    let mut s = String::with_capacity(id.len());
    for c in id.chars() {
        match c {
            '.' => s.push_str("=2E"),
            '@' => s.push_str("=40"),
            c => s.push(c),
        }
    }
    s
}

fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 3)?;
        out.push(match code {
            "2E" => '.',
            "40" => '@',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    (!out.is_empty()).then_some(out)
}

/// The device count a presence key's value holds (empty or unreadable: one).
pub fn devices_of(value: &[u8]) -> u32 {
    std::str::from_utf8(value)
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(1)
}

/// The other nodes one user is connected to, with its device count on each.
type Nodes = Vec<(Arc<str>, u32)>;

/// User -> the other nodes it is connected to, with its device count there.
#[derive(Default)]
pub struct PresenceMap {
    users: RwLock<HashMap<String, Nodes>>,
}

impl PresenceMap {
    /// `user` has a connection on `node`.
    pub fn put(&self, node: &str, user: &str) {
        self.put_devices(node, user, 1);
    }

    /// `user` has `devices` connections on `node`.
    pub fn put_devices(&self, node: &str, user: &str, devices: u32) {
        if let Ok(mut u) = self.users.write() {
            let nodes = u.entry(user.to_owned()).or_default();
            match nodes.iter_mut().find(|(n, _)| &**n == node) {
                Some((_, d)) => *d = devices,
                None => nodes.push((node.into(), devices)),
            }
        }
    }

    /// `user`'s connections on the other nodes that `alive` accepts.
    pub fn devices(&self, user: &str, alive: impl Fn(&str) -> bool) -> u32 {
        let Ok(u) = self.users.read() else {
            return 0;
        };
        u.get(user)
            .into_iter()
            .flatten()
            .filter(|(n, _)| alive(n))
            .map(|(_, d)| *d)
            .sum()
    }

    /// `user` has no connection on `node` any more.
    pub fn delete(&self, node: &str, user: &str) {
        if let Ok(mut u) = self.users.write() {
            if let Some(nodes) = u.get_mut(user) {
                nodes.retain(|(n, _)| &**n != node);
                if nodes.is_empty() {
                    u.remove(user);
                }
            }
        }
    }

    /// Forgets everything (the watch starts over).
    pub fn clear(&self) {
        if let Ok(mut u) = self.users.write() {
            u.clear();
        }
    }

    /// `users` grouped by the other node(s) they are on, for nodes `alive` accepts (asked
    /// once per node), under one read lock. Users on no other node are left out.
    pub fn by_node<'a>(
        &self,
        users: impl Iterator<Item = &'a str>,
        alive: impl Fn(&str) -> bool,
    ) -> BTreeMap<Arc<str>, Vec<String>> {
        let mut out: BTreeMap<Arc<str>, Vec<String>> = BTreeMap::new();
        let Ok(u) = self.users.read() else {
            return out;
        };
        if u.is_empty() {
            return out;
        }
        let mut live: HashMap<Arc<str>, bool> = HashMap::new();
        for user in users {
            for (node, _) in u.get(user).into_iter().flatten() {
                let ok = *live.entry(node.clone()).or_insert_with(|| alive(node));
                if ok {
                    out.entry(node.clone()).or_default().push(user.to_owned());
                }
            }
        }
        out
    }

    /// Users known to be on other nodes.
    pub fn len(&self) -> usize {
        self.users.read().map(|u| u.len()).unwrap_or(0)
    }

    /// Whether no user is known on another node.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_ids_with_dots_and_ats() {
        for (n, u) in [
            ("node-a", "alice"),
            ("n.1", "bob@example.com"),
            ("x", "a..b"),
        ] {
            let k = key(n, u);
            assert_eq!(k.matches('.').count(), 1, "{k}");
            assert!(!k.contains('@'), "{k}");
            assert_eq!(parse_key(&k), Some((n.to_owned(), u.to_owned())));
            assert!(k.starts_with(&node_prefix(n)));
        }
        assert_eq!(parse_key("nodot"), None);
        assert_eq!(parse_key("a.b=ZZ"), None);
        assert_eq!(parse_key("a."), None);
    }

    #[test]
    fn tracks_users_per_node() {
        let p = PresenceMap::default();
        p.put("b", "u1");
        p.put("c", "u1");
        p.put("b", "u1");
        p.put("c", "u2");
        let by = p.by_node(["u1", "u9"].into_iter(), |_| true);
        assert_eq!(by.len(), 2);
        p.delete("c", "u1");
        p.delete("c", "u2");
        let by = p.by_node(["u1", "u2"].into_iter(), |_| true);
        assert_eq!(by.keys().cloned().collect::<Vec<_>>(), vec![Arc::from("b")]);
        assert_eq!(p.len(), 1);
        p.put("d", "u3");
        let by = p.by_node(["u1", "u3", "u4"].into_iter(), |n| n != "d");
        assert_eq!(by.len(), 1);
        assert_eq!(by[&Arc::<str>::from("b")], vec!["u1".to_owned()]);
    }

    #[test]
    fn counts_devices_per_node() {
        let p = PresenceMap::default();
        p.put_devices("b", "u1", devices_of(b"2"));
        p.put_devices("c", "u1", devices_of(b""));
        assert_eq!(p.devices("u1", |_| true), 3);
        assert_eq!(p.devices("u1", |n| n != "b"), 1);
        p.put_devices("b", "u1", 5);
        assert_eq!(p.devices("u1", |_| true), 6);
        p.delete("c", "u1");
        assert_eq!(p.devices("u1", |_| true), 5);
        assert_eq!(p.devices("u2", |_| true), 0);
        assert_eq!(devices_of(b"x"), 1);
    }
}
