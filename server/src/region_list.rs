//! Multi-region agreement on the `regions` list (docs/multi-region.md, "Agreement"):
//! the digest of this region's list (names in order, not the entry points), which
//! every replication record and every forwarded request carries in the
//! [`DIGEST_HEADER`] header with the list itself in [`LIST_HEADER`], and [`ListCheck`],
//! which compares what another region announces with this region's own: a region whose
//! list differs is refused (no apply from it, no forward to it),
//! `im_region_config_mismatch{from}` is 1 and both lists are logged once (WARN). A
//! message without the header (a release before the digest) is taken as agreeing. A
//! difference not seen again for [`FORGET_AFTER`] is forgotten (the region may have been
//! fixed while sending nothing this node reads), so forwarding to it is tried again.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a difference stays known without being seen again. An applier sees it
/// on every redelivery (each 5 s) and keeps it.
pub const FORGET_AFTER: Duration = Duration::from_secs(60);

/// The header carrying the sender region's list digest (16 hex digits).
pub const DIGEST_HEADER: &str = "Im-Region-List-Digest";
/// The header carrying the sender region's list itself (names, comma-separated), for
/// the log line of a mismatch.
pub const LIST_HEADER: &str = "Im-Region-List";
/// The header naming the region a forwarded request comes from.
pub const FROM_HEADER: &str = "Im-Region-From";
/// Most bytes of a list header read from another region (longer ones are cut).
pub const MAX_LIST_BYTES: usize = 1024;

/// The digest of a `regions` list: SHA-256 of the names in order, each followed by a
/// newline, its first 8 bytes in hex. Order matters: two lists with the same names in
/// another order are a different configuration.
pub fn digest(names: &[String]) -> String {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    for n in names {
        ctx.update(n.as_bytes());
        ctx.update(b"\n");
    }
    ctx.finish().as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A different list another region announced.
#[derive(Debug)]
struct Seen {
    digest: String,
    list: String,
    at: Instant,
}

/// What another region announced, as [`ListCheck::check`] judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Its digest is this region's (or it sent none: an older release).
    Agrees,
    /// Its digest differs: refuse it.
    Differs,
}

/// This region's list and what each other region last announced.
#[derive(Debug)]
pub struct ListCheck {
    /// This region's name.
    pub local: String,
    /// This region's digest.
    pub digest: String,
    /// This region's list, comma-separated (the [`LIST_HEADER`] value).
    pub list: String,
    /// The regions whose last announced digest differed: their digest and list, and
    /// when that was last seen.
    differing: Mutex<BTreeMap<String, Seen>>,
}

impl ListCheck {
    /// The check of region `local` whose list is `names`; each other region starts
    /// agreeing (its `im_region_config_mismatch` series at 0).
    pub fn new(local: &str, names: &[String]) -> ListCheck {
        for p in names.iter().filter(|n| *n != local) {
            metrics::gauge!("im_region_config_mismatch", "from" => p.clone()).set(0.0);
        }
        ListCheck {
            local: local.to_owned(),
            digest: digest(names),
            list: names.join(","),
            differing: Mutex::new(BTreeMap::new()),
        }
    }

    /// Judges what region `from` announced (`digest`, `list`: its headers, `None`
    /// when absent). A change of verdict sets the gauge; a new difference is logged
    /// once with both digests and lists, a return to agreement once too.
    pub fn check(&self, from: &str, digest: Option<&str>, list: Option<&str>) -> Verdict {
        let Some(theirs) = digest else {
            return Verdict::Agrees;
        };
        let Ok(mut differing) = self.differing.lock() else {
            return Verdict::Agrees;
        };
        if theirs == self.digest {
            if differing.remove(from).is_some() {
                metrics::gauge!("im_region_config_mismatch", "from" => from.to_owned()).set(0.0);
                tracing::info!(from = %from, digest = %theirs, "region lists agree again");
            }
            return Verdict::Agrees;
        }
        let their_list = cut(list.unwrap_or_default(), MAX_LIST_BYTES);
        let theirs = cut(theirs, 64);
        let known = differing
            .get(from)
            .is_some_and(|s| s.digest == theirs && s.list == their_list);
        if !known {
            metrics::gauge!("im_region_config_mismatch", "from" => from.to_owned()).set(1.0);
            tracing::warn!(
                from = %from,
                their_digest = ?theirs,
                their_list = ?their_list,
                our_digest = %self.digest,
                our_list = ?self.list,
                "region lists disagree: nothing is applied from or forwarded to that region \
                 until they agree"
            );
        }
        let seen = Seen {
            digest: theirs,
            list: their_list,
            at: Instant::now(),
        };
        differing.insert(from.to_owned(), seen);
        Verdict::Differs
    }

    /// Whether region `from` last announced a different list, within
    /// [`FORGET_AFTER`]; an older difference is forgotten here (the gauge back to 0).
    pub fn differs(&self, from: &str) -> bool {
        self.differs_at(from, Instant::now())
    }

    fn differs_at(&self, from: &str, now: Instant) -> bool {
        let Ok(mut differing) = self.differing.lock() else {
            return false;
        };
        let Some(seen) = differing.get(from) else {
            return false;
        };
        if now.saturating_duration_since(seen.at) < FORGET_AFTER {
            return true;
        }
        differing.remove(from);
        metrics::gauge!("im_region_config_mismatch", "from" => from.to_owned()).set(0.0);
        tracing::info!(from = %from, "no different regions list seen from that region for a \
            minute; forwarding to it again");
        false
    }

    /// The headers every replication record and forwarded request carries.
    pub fn headers(&self, headers: &mut async_nats::HeaderMap) {
        headers.insert(FROM_HEADER, self.local.as_str());
        headers.insert(DIGEST_HEADER, self.digest.as_str());
        headers.insert(LIST_HEADER, self.list.as_str());
    }

    /// Judges the headers of a message from region `from`.
    pub fn check_headers(&self, from: &str, headers: Option<&async_nats::HeaderMap>) -> Verdict {
        let get = |name: &str| headers.and_then(|h| h.get(name)).map(|v| v.as_str());
        self.check(from, get(DIGEST_HEADER), get(LIST_HEADER))
    }
}

/// `s` cut to at most `max` bytes, on a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_digest_covers_names_and_order() {
        let ab = digest(&names(&["a", "b"]));
        assert_eq!(ab.len(), 16);
        assert_eq!(ab, digest(&names(&["a", "b"])));
        assert_ne!(ab, digest(&names(&["b", "a"])), "order");
        assert_ne!(ab, digest(&names(&["a", "b", "c"])), "a new region");
        assert_ne!(ab, digest(&names(&["ab"])), "names are separated");
    }

    #[test]
    fn a_different_list_is_refused_until_it_agrees_again() {
        let check = ListCheck::new("a", &names(&["a", "b"]));
        assert_eq!(
            check.check("b", None, None),
            Verdict::Agrees,
            "older release"
        );
        let ours = check.digest.clone();
        assert_eq!(check.check("b", Some(&ours), Some("a,b")), Verdict::Agrees);
        assert!(!check.differs("b"));
        let theirs = digest(&names(&["a", "b", "c"]));
        assert_eq!(
            check.check("b", Some(&theirs), Some("a,b,c")),
            Verdict::Differs
        );
        assert!(check.differs("b") && !check.differs("c"));
        // Logged once: a second record with the same list changes nothing.
        assert_eq!(
            check.check("b", Some(&theirs), Some("a,b,c")),
            Verdict::Differs
        );
        let later = Instant::now() + FORGET_AFTER;
        assert!(check.differs_at("b", later - Duration::from_secs(1)));
        assert!(
            !check.differs_at("b", later),
            "forgotten when not seen again"
        );
        assert!(!check.differs("b"));
        check.check("b", Some(&theirs), Some("a,b,c"));
        assert_eq!(check.check("b", Some(&ours), Some("a,b")), Verdict::Agrees);
        assert!(!check.differs("b"));
        let mut h = async_nats::HeaderMap::new();
        check.headers(&mut h);
        assert_eq!(check.check_headers("b", Some(&h)), Verdict::Agrees);
        assert_eq!(cut("héllo", 2), "h");
    }
}
