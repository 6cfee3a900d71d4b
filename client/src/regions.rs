//! Regions: what the SDK knows of the regions a `/v1/route` answer lists (multi-region
//! mode): each region's probe (the time one `GET /v1/route` to its entry point took),
//! nearest first, in a book shared by a client's handle and its task. `route` probes
//! them once at start, connects through the nearest one that answers, skips one that
//! does not (so a lost region fails over to the next nearest), and probes again after
//! [`REPROBE_AFTER`]. With no regions listed nothing here is used.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One region listed by `/v1/route`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct RouteRegion {
    /// Its name.
    pub name: String,
    /// Where its `/v1/route` is asked (`http://HOST:PORT`).
    pub route_url: String,
}

/// How long a probe order is trusted before the regions are probed again.
pub const REPROBE_AFTER: Duration = Duration::from_secs(300);

/// Most regions probed (the rest of a longer list is ignored).
pub const MAX_PROBED: usize = 16;

/// One probed region: its name, its entry point and how long its probe took (`None`:
/// it did not answer).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The region's name.
    pub name: String,
    /// Its `/v1/route` base URL.
    pub route_url: String,
    /// The probe's round trip; `None` when it failed or timed out.
    pub rtt: Option<Duration>,
}

/// When the regions were probed, and the probes nearest first.
type Probed = Option<(Instant, Vec<Probe>)>;

/// The probed regions, nearest first, shared by a client's handle and its task.
#[derive(Debug, Clone, Default)]
pub struct RegionBook(Arc<Mutex<Probed>>);

impl RegionBook {
    /// The probed regions, nearest first (healthy ones before the ones that failed).
    pub fn order(&self) -> Vec<Probe> {
        self.0
            .lock()
            .map(|b| b.as_ref().map(|(_, p)| p.clone()).unwrap_or_default())
            .unwrap_or_default()
    }

    /// The probes, unless they are older than [`REPROBE_AFTER`].
    pub(crate) fn fresh(&self) -> Option<Vec<Probe>> {
        let b = self.0.lock().ok()?;
        let (at, probes) = b.as_ref()?;
        (at.elapsed() < REPROBE_AFTER).then(|| probes.clone())
    }

    /// Keeps `probes` (nearest first) as of now.
    pub(crate) fn store(&self, probes: Vec<Probe>) {
        if let Ok(mut b) = self.0.lock() {
            *b = Some((Instant::now(), probes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_book_keeps_the_order_and_goes_stale() {
        let book = RegionBook::default();
        assert!(book.order().is_empty() && book.fresh().is_none());
        let p = |n: &str, ms: Option<u64>| Probe {
            name: n.into(),
            route_url: format!("http://{n}:1"),
            rtt: ms.map(Duration::from_millis),
        };
        book.store(vec![p("b", Some(3)), p("a", None)]);
        assert_eq!(book.clone().order()[0].name, "b");
        assert_eq!(book.fresh().map(|o| o.len()), Some(2));
        if let Ok(mut b) = book.0.lock() {
            if let Some((at, _)) = b.as_mut() {
                *at -= REPROBE_AFTER;
            }
        }
        assert!(book.fresh().is_none(), "stale after REPROBE_AFTER");
    }
}
