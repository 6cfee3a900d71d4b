//! Multi-region: which region is a conversation's home, the one writer that assigns its
//! seqs and commits it (docs/multi-region.md). The default home is the rendezvous
//! (highest random weight) choice among the configured region names, computed with a
//! hash fixed here (FNV-1a 64 with a splitmix64 finish), so every region and every
//! release agrees without asking anyone. A Send homed elsewhere is forwarded to its
//! home over NATS (`forward`, a request on [`send_subject`] across the gateway) and
//! answered with the home's reply. An operator's moves override the hash rule
//! ([`Homes`], kept current by `region_home`). Built only when `region` is set: with it
//! off the message path holds `None` and does nothing else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use crate::store::repl::HomeMove;

/// How long a forwarded Send waits for its home's answer (the home acks after its
/// durable commit).
pub const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// Most bytes of a forwarded request or answer.
pub const MAX_FORWARD_BYTES: usize = 256 * 1024;

/// The NATS subject where the nodes of region `home` take forwarded Sends (a queue
/// group: one node of the region answers each).
pub fn send_subject(home: &str) -> String {
    format!("im-region.{home}.send")
}

/// Why a forwarded Send got no answer from its home.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// This node has no NATS connection to forward with.
    #[error("no NATS connection to forward with")]
    NoLink,
    /// The request failed or timed out (the home region is unreachable).
    #[error("region {home} did not answer: {reason}")]
    Unanswered {
        /// The home region.
        home: String,
        /// The NATS error or "timed out".
        reason: String,
    },
    /// The home region announced a different `regions` list (`region_list`): nothing
    /// is forwarded to it until the lists agree.
    #[error("region {home}'s regions list differs from this region's")]
    ListsDiffer {
        /// The home region.
        home: String,
    },
}

/// This node's region and the list every region shares.
#[derive(Debug)]
pub struct RegionMap {
    /// This node's region.
    pub local: String,
    /// Every region's name, in config order.
    pub names: Vec<String>,
    /// Every region's public entry point (`route_url`), by the index of `names`.
    pub route_urls: Vec<String>,
    /// The NATS connection Sends are forwarded over (set once cluster mode is up).
    pub nats: OnceLock<async_nats::Client>,
    /// `cluster.key`'s HMAC key: with one, every forwarded request carries its signature
    /// in the [`SIG_HEADER`] header and the home drops a request without a valid one, so
    /// a NATS writer without the key cannot send as any user (without a key NATS is
    /// trusted, as for the cluster's own traffic).
    pub key: Option<ring::hmac::Key>,
    /// The replication lag into this region per source region, as this node's applier
    /// last saw it (`region_repl`; the admin overview reads it).
    pub lags: std::sync::Mutex<std::collections::BTreeMap<String, Lag>>,
    /// This region's list digest and what the other regions announced (`region_list`).
    pub lists: crate::region_list::ListCheck,
    /// The conversations whose home an operator moved (`region_home`), and whether this
    /// node may serve its own homes yet.
    pub homes: Homes,
}

/// The replication from one region into this one, as this node's applier sees it.
#[derive(Debug, Clone, Default)]
pub struct Lag {
    /// Messages in the source's stream not yet applied here, as last known.
    pub messages: u64,
    /// When this region was last known caught up (`None`: never yet).
    pub caught_up_at: Option<std::time::Instant>,
    /// Whether it is caught up now.
    pub caught_up: bool,
    /// Messages applied since this node started applying.
    pub applied: u64,
    /// Whether the last pull round reached the source's stream and its consumer's
    /// counts (false while the link is cut or the stream is not reachable).
    pub link_up: bool,
}

impl Lag {
    /// Seconds since this region was last caught up (0 while it is).
    pub fn seconds(&self, started: std::time::Instant) -> f64 {
        if self.caught_up {
            return 0.0;
        }
        self.caught_up_at.unwrap_or(started).elapsed().as_secs_f64()
    }
}

impl RegionMap {
    /// The overview's region pairs: the lag into this region from each other one.
    pub fn lag_view(&self, started: std::time::Instant) -> Vec<im_admin_api::RegionLag> {
        let Ok(lags) = self.lags.lock() else {
            return Vec::new();
        };
        lags.iter()
            .map(|(from, l)| im_admin_api::RegionLag {
                from: from.clone(),
                to: self.local.clone(),
                lag_messages: l.messages,
                lag_seconds: l.seconds(started),
                applied_total: l.applied,
                link_up: Some(l.link_up),
                config_mismatch: Some(self.lists.differs(from)),
            })
            .collect()
    }
}

/// The NATS header carrying a forwarded request's HMAC (hex), with `cluster.key` set.
pub const SIG_HEADER: &str = "Im-Region-Sig";

/// The domain tag signed before a forwarded request's payload.
const SIG_DOMAIN: &[u8] = b"im-region-forward\n";

impl RegionMap {
    /// The signature header value of a forwarded `payload` (`None` without a key).
    pub fn sign(&self, payload: &[u8]) -> Option<String> {
        let key = self.key.as_ref()?;
        let mut ctx = ring::hmac::Context::with_key(key);
        ctx.update(SIG_DOMAIN);
        ctx.update(payload);
        Some(
            ctx.sign()
                .as_ref()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect(),
        )
    }

    /// Whether a forwarded `payload` with signature header `sig` may be served: always
    /// without a key; with one, only when `sig` is its valid signature.
    pub fn verify(&self, payload: &[u8], sig: Option<&str>) -> bool {
        let Some(key) = &self.key else {
            return true;
        };
        let Some(tag) = sig.and_then(decode_hex) else {
            return false;
        };
        let mut msg = Vec::with_capacity(SIG_DOMAIN.len() + payload.len());
        msg.extend_from_slice(SIG_DOMAIN);
        msg.extend_from_slice(payload);
        ring::hmac::verify(key, &msg, &tag).is_ok()
    }
}

/// The NATS header carrying a traced forwarded request's trace context: the forwarding
/// region and node, `<region>/<node>` (at most [`MAX_TRACE_HEADER`] bytes). The home
/// traces the request whatever its own sampling says.
pub const TRACE_HEADER: &str = "Im-Region-Trace";
/// With [`TRACE_HEADER`] and `cluster.key`: the HMAC (hex) of the request's signature
/// and the trace header, apart from [`SIG_HEADER`], which a home of an older release
/// checks as before.
pub const TRACE_SIG_HEADER: &str = "Im-Region-Trace-Sig";
/// Most bytes of a [`TRACE_HEADER`] value.
pub const MAX_TRACE_HEADER: usize = 200;

/// The domain tag signed before a trace header.
const TRACE_SIG_DOMAIN: &[u8] = b"im-region-trace\n";

impl RegionMap {
    /// The signature of trace header `trace` on a request signed `sig` (`None`
    /// without a key).
    pub fn sign_trace(&self, sig: &str, trace: &str) -> Option<String> {
        let key = self.key.as_ref()?;
        let tag = ring::hmac::sign(key, &trace_signed(sig, trace));
        Some(tag.as_ref().iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Whether a forwarded request signed `sig` carries a valid trace context: `trace`
    /// present, at most [`MAX_TRACE_HEADER`] bytes, and with a key, `trace_sig` its
    /// valid signature. An invalid one only leaves the request untraced.
    pub fn verify_trace(
        &self,
        sig: Option<&str>,
        trace: Option<&str>,
        trace_sig: Option<&str>,
    ) -> bool {
        let Some(trace) = trace.filter(|t| t.len() <= MAX_TRACE_HEADER) else {
            return false;
        };
        let Some(key) = &self.key else {
            return true;
        };
        let Some(tag) = trace_sig.and_then(decode_hex) else {
            return false;
        };
        ring::hmac::verify(key, &trace_signed(sig.unwrap_or_default(), trace), &tag).is_ok()
    }
}

/// The bytes a trace header's signature covers: the domain, the request's signature
/// (so the context cannot be moved onto another request) and the header.
fn trace_signed(sig: &str, trace: &str) -> Vec<u8> {
    let mut msg = Vec::with_capacity(TRACE_SIG_DOMAIN.len() + sig.len() + 1 + trace.len());
    msg.extend_from_slice(TRACE_SIG_DOMAIN);
    msg.extend_from_slice(sig.as_bytes());
    msg.push(b'\n');
    msg.extend_from_slice(trace.as_bytes());
    msg
}

/// Decodes a 64-digit lowercase or uppercase hex tag.
fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if s.len() != 64 {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl RegionMap {
    /// The map of `config`'s regions; `None` when `region` is not set.
    pub fn from_config(config: &crate::config::Config) -> Option<Arc<RegionMap>> {
        if config.region.is_empty() {
            return None;
        }
        let names: Vec<String> = config.regions.iter().map(|r| r.name.clone()).collect();
        let lists = crate::region_list::ListCheck::new(&config.region, &names);
        Some(Arc::new(RegionMap {
            local: config.region.clone(),
            names,
            route_urls: config.regions.iter().map(|r| r.route_url.clone()).collect(),
            nats: OnceLock::new(),
            key: (!config.cluster.key.is_empty()).then(|| {
                ring::hmac::Key::new(ring::hmac::HMAC_SHA256, config.cluster.key.as_bytes())
            }),
            lags: Default::default(),
            lists,
            homes: Default::default(),
        }))
    }

    /// Forwards an encoded Send `frame` of `user` to region `home` and returns the home's
    /// answer: an encoded frame (SendAck after its durable commit, or Error). A traced
    /// request carries `trace` (`<region>/<node>`) in [`TRACE_HEADER`].
    pub async fn forward(
        &self,
        home: &str,
        user: &str,
        frame: bytes::Bytes,
        trace: Option<&str>,
    ) -> Result<bytes::Bytes, ForwardError> {
        if self.lists.differs(home) {
            return Err(ForwardError::ListsDiffer {
                home: home.to_owned(),
            });
        }
        let client = self.nats.get().ok_or(ForwardError::NoLink)?;
        let mut payload = Vec::with_capacity(user.len() + 1 + frame.len());
        payload.extend_from_slice(user.as_bytes());
        payload.push(b'\n');
        payload.extend_from_slice(&frame);
        let unanswered = |reason: String| ForwardError::Unanswered {
            home: home.to_owned(),
            reason,
        };
        let headers = self.forward_headers(&payload, trace);
        match tokio::time::timeout(
            FORWARD_TIMEOUT,
            client.request_with_headers(send_subject(home), headers, payload.into()),
        )
        .await
        {
            Ok(Ok(m)) if m.payload.len() <= MAX_FORWARD_BYTES => Ok(m.payload),
            Ok(Ok(m)) => Err(unanswered(format!("answer of {} bytes", m.payload.len()))),
            Ok(Err(e)) => Err(unanswered(e.to_string())),
            Err(_) => Err(unanswered("timed out".into())),
        }
    }
}

impl RegionMap {
    /// A forwarded request's headers: its signature, the list digest, and a traced
    /// one's trace context with its own signature.
    fn forward_headers(&self, payload: &[u8], trace: Option<&str>) -> async_nats::HeaderMap {
        let mut headers = async_nats::HeaderMap::new();
        let sig = self.sign(payload);
        if let Some(sig) = &sig {
            headers.insert(SIG_HEADER, sig.as_str());
        }
        self.lists.headers(&mut headers);
        if let Some(t) = trace.filter(|t| t.len() <= MAX_TRACE_HEADER) {
            headers.insert(TRACE_HEADER, t);
            if let Some(ts) = self.sign_trace(sig.as_deref().unwrap_or_default(), t) {
                headers.insert(TRACE_SIG_HEADER, ts.as_str());
            }
        }
        headers
    }
}

/// The conversation a Send of `sender` to `target` belongs to.
pub fn conversation_of(sender: &str, target: &im_proto::send::Target) -> String {
    match target {
        im_proto::send::Target::ToUser(to) => im_proto::direct_conversation(sender, to),
        im_proto::send::Target::GroupId(g) => im_proto::group_conversation(g),
    }
}

/// Splits a forwarded request into the user and the encoded frame (`None`: malformed).
pub fn parse_forwarded(payload: &[u8]) -> Option<(&str, &[u8])> {
    if payload.len() > MAX_FORWARD_BYTES {
        return None;
    }
    let nl = payload.iter().position(|b| *b == b'\n')?;
    let user = std::str::from_utf8(&payload[..nl]).ok()?;
    im_proto::valid_id(user).then_some((user, &payload[nl + 1..]))
}

impl RegionMap {
    /// The home region of `conversation_id`: its latest move's, else the hash rule's.
    pub fn home(&self, conversation_id: &str) -> &str {
        if let Some(i) = self.homes.current(conversation_id) {
            return &self.names[i];
        }
        home_of(conversation_id, &self.names).unwrap_or(&self.local)
    }

    /// The home of `conversation_id` when it is not this region, with its entry point.
    pub fn elsewhere(&self, conversation_id: &str) -> Option<(&str, &str)> {
        let home = self.home(conversation_id);
        if home == self.local {
            return None;
        }
        let i = self.names.iter().position(|n| n == home)?;
        Some((home, self.route_urls[i].as_str()))
    }
}

/// The rendezvous choice for `conversation_id` among `regions` (`None`: no regions):
/// the highest [`weight`], the smaller name on a tie.
pub fn home_of<'a>(conversation_id: &str, regions: &'a [String]) -> Option<&'a str> {
    regions
        .iter()
        .max_by(|a, b| {
            weight(a, conversation_id)
                .cmp(&weight(b, conversation_id))
                .then_with(|| b.cmp(a))
        })
        .map(String::as_str)
}

/// The weight of `region` for `conversation_id`: FNV-1a 64 of `region`, a 0 byte and
/// `conversation_id`, then the splitmix64 finaliser. Fixed: changing it moves homes.
pub fn weight(region: &str, conversation_id: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let bytes = region
        .bytes()
        .chain(std::iter::once(0))
        .chain(conversation_id.bytes());
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h = (h ^ (h >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h = (h ^ (h >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

/// One epoch of a moved conversation: its home from `epoch` on, and the last seq of
/// the epoch before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Term {
    /// The epoch.
    pub epoch: u64,
    /// The home, as an index of `RegionMap::names`.
    pub region: usize,
    /// The last seq of the epoch before.
    pub fence: u64,
}

/// The moved homes a node knows, and whether it may serve its own homes yet.
#[derive(Debug, Default)]
pub struct Homes {
    /// Set once any conversation has moved: `home()` looks nothing up before.
    any: AtomicBool,
    /// Each moved conversation's terms, by epoch (epoch 0, the hash rule's, is left out).
    moves: RwLock<HashMap<String, Vec<Term>>>,
    /// The last `conversation_homes` id read.
    cursor: AtomicI64,
    /// Whether this node has read every other region's stream to its end since it
    /// started (until then it refuses Sends of its own homes).
    ready: AtomicBool,
}

impl Homes {
    /// The current home of `conversation` (an index of the names) when it has moved.
    pub fn current(&self, conversation: &str) -> Option<usize> {
        if !self.any.load(Ordering::Relaxed) {
            return None;
        }
        let moves = self.moves.read().ok()?;
        moves.get(conversation)?.last().map(|t| t.region)
    }

    /// The terms of `conversation` (empty: never moved).
    pub fn terms(&self, conversation: &str) -> Vec<Term> {
        if !self.any.load(Ordering::Relaxed) {
            return Vec::new();
        }
        let Ok(moves) = self.moves.read() else {
            return Vec::new();
        };
        moves.get(conversation).cloned().unwrap_or_default()
    }

    /// Conversations with a move.
    pub fn moved(&self) -> usize {
        self.moves.read().map(|m| m.len()).unwrap_or(0)
    }

    /// Whether this node may serve Sends of its own homes.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Marks the node ready (the gate passed, or no replication runs).
    pub fn set_ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Adds move `m` of `conversation` (a region not in `names` is logged and skipped).
    pub fn learn(&self, names: &[String], conversation: &str, m: &HomeMove) {
        let Some(region) = names.iter().position(|n| *n == m.region) else {
            tracing::warn!(conversation = ?conversation, region = ?m.region,
                "a home move names a region this node does not know; ignored");
            return;
        };
        let Ok(mut moves) = self.moves.write() else {
            return;
        };
        let terms = moves.entry(conversation.to_owned()).or_default();
        if terms.iter().any(|t| t.epoch == m.epoch) {
            return;
        }
        terms.push(Term {
            epoch: m.epoch,
            region,
            fence: m.fence,
        });
        terms.sort_by_key(|t| t.epoch);
        self.any.store(true, Ordering::Relaxed);
    }
}

impl Homes {
    /// The last `conversation_homes` id read (`region_home`'s poll).
    pub fn cursor(&self) -> i64 {
        self.cursor.load(Ordering::Relaxed)
    }

    /// Moves the cursor forward to `id`.
    pub fn advance(&self, id: i64) {
        self.cursor.fetch_max(id, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<String> {
        n.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_home_is_fixed_and_order_free() {
        // Pinned values: every release must agree with every other.
        assert_eq!(weight("a", "u:alice:bob"), weight("a", "u:alice:bob"));
        assert_ne!(weight("a", "u:alice:bob"), weight("b", "u:alice:bob"));
        let ab = names(&["a", "b"]);
        let ba = names(&["b", "a"]);
        for i in 0..200 {
            let c = format!("g:group{i}");
            assert_eq!(home_of(&c, &ab), home_of(&c, &ba), "{c}");
        }
        assert_eq!(home_of("g:x", &[]), None);
        assert_eq!(home_of("g:x", &names(&["only"])), Some("only"));
    }

    #[test]
    fn homes_spread_and_a_new_region_moves_few() {
        let two = names(&["eu", "us"]);
        let three = names(&["eu", "us", "ap"]);
        let (mut eu, mut moved) = (0, 0);
        for i in 0..3000 {
            let c = format!("u:user{i}:peer{i}");
            let before = home_of(&c, &two).unwrap();
            if before == "eu" {
                eu += 1;
            }
            let after = home_of(&c, &three).unwrap();
            // Rendezvous: a conversation moves only to the new region.
            assert!(after == before || after == "ap", "{c}: {before} -> {after}");
            if after != before {
                moved += 1;
            }
        }
        assert!((1200..1800).contains(&eu), "eu homes {eu} of 3000");
        assert!((700..1300).contains(&moved), "moved {moved} of 3000");
    }

    #[test]
    fn elsewhere_names_the_home_and_its_entry() {
        let map = RegionMap {
            local: "a".into(),
            names: names(&["a", "b"]),
            route_urls: names(&["http://a:1", "http://b:1"]),
            nats: OnceLock::new(),
            key: None,
            lags: Default::default(),
            lists: crate::region_list::ListCheck::new("a", &names(&["a", "b"])),
            homes: Default::default(),
        };
        assert_eq!(parse_forwarded(b"alice\nxyz"), Some(("alice", &b"xyz"[..])));
        assert_eq!(parse_forwarded(b"al ice\nxyz"), None);
        assert_eq!(parse_forwarded(b"alice"), None);
        let (mut here, mut there) = (0, 0);
        for i in 0..100 {
            match map.elsewhere(&format!("g:{i}")) {
                None => here += 1,
                Some(home) => {
                    assert_eq!(home, ("b", "http://b:1"));
                    there += 1;
                }
            }
        }
        assert!(here > 0 && there > 0);
    }

    #[test]
    fn forwarded_requests_are_signed_and_checked_with_the_cluster_key() {
        let keyed = |k: &str| RegionMap {
            local: "a".into(),
            names: names(&["a", "b"]),
            route_urls: names(&["http://a:1", "http://b:1"]),
            nats: OnceLock::new(),
            key: Some(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, k.as_bytes())),
            lags: Default::default(),
            lists: crate::region_list::ListCheck::new("a", &names(&["a", "b"])),
            homes: Default::default(),
        };
        let map = keyed("a cluster key of at least 32 bytes!!");
        let sig = map.sign(b"alice\nframe").expect("signed with a key");
        assert!(map.verify(b"alice\nframe", Some(&sig)));
        assert!(
            !map.verify(b"mallory\nframe", Some(&sig)),
            "another payload"
        );
        assert!(!map.verify(b"alice\nframe", None), "unsigned");
        assert!(!map.verify(b"alice\nframe", Some("zz")), "malformed");
        let other = keyed("another cluster key of 32 bytes!!!!");
        assert!(!other.verify(b"alice\nframe", Some(&sig)), "another key");
        let open = RegionMap {
            key: None,
            ..keyed("x")
        };
        assert_eq!(open.sign(b"p"), None);
        assert!(open.verify(b"p", None), "no key: NATS is trusted");
        assert!(open.verify_trace(None, Some("b/b0"), None));
        assert!(
            !open.verify_trace(None, None, None),
            "no header: not traced"
        );
    }

    #[test]
    fn a_trace_header_is_signed_apart_and_tied_to_its_request() {
        let map = RegionMap {
            local: "b".into(),
            names: names(&["a", "b"]),
            route_urls: names(&["http://a:1", "http://b:1"]),
            nats: OnceLock::new(),
            key: Some(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"k")),
            lags: Default::default(),
            lists: crate::region_list::ListCheck::new("a", &names(&["a", "b"])),
            homes: Default::default(),
        };
        let h = map.forward_headers(b"alice\nframe", Some("b/b0"));
        let get = |n: &str| h.get(n).map(|v| v.as_str().to_owned());
        let (sig, trace, ts) = (get(SIG_HEADER), get(TRACE_HEADER), get(TRACE_SIG_HEADER));
        assert!(
            map.verify(b"alice\nframe", sig.as_deref()),
            "the request's own signature"
        );
        assert!(map.verify_trace(sig.as_deref(), trace.as_deref(), ts.as_deref()));
        assert!(
            !map.verify_trace(sig.as_deref(), Some("b/b1"), ts.as_deref()),
            "forged"
        );
        let other = map.sign(b"mallory\nframe");
        assert!(
            !map.verify_trace(other.as_deref(), trace.as_deref(), ts.as_deref()),
            "moved"
        );
        assert!(
            !map.verify_trace(sig.as_deref(), trace.as_deref(), None),
            "unsigned"
        );
        let long = "x".repeat(MAX_TRACE_HEADER + 1);
        assert!(map
            .forward_headers(b"p", Some(&long))
            .get(TRACE_HEADER)
            .is_none());
        assert_eq!(
            get(crate::region_list::DIGEST_HEADER),
            Some(map.lists.digest.clone())
        );
        let plain = map.forward_headers(b"p", None);
        assert!(plain.get(TRACE_HEADER).is_none() && plain.get(TRACE_SIG_HEADER).is_none());
    }
}
