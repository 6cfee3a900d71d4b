//! `region` and `[[regions]]`: multi-region mode's settings (this node's region and every
//! region's public entry point, the same list in every region), with their validation.
//! With `region` empty (the default) the node runs as one region and nothing changes.

use serde::{Deserialize, Serialize};

use super::check::{invalid, name_chars};
use super::ConfigError;

/// Most regions listed.
pub const MAX_REGIONS: usize = 16;

/// One region of `[[regions]]`: its name and the entry point clients probe.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegionEntry {
    /// The region's name (1-64 of A-Z a-z 0-9 _ -), as in every region's `region`.
    pub name: String,
    /// `http://HOST:PORT` (or `https://`) where clients ask that region's `/v1/route`.
    pub route_url: String,
}

/// Checks `region` against `regions` and the list itself; `clustered`: `nats_url` is set.
pub fn validate(region: &str, regions: &[RegionEntry], clustered: bool) -> Result<(), ConfigError> {
    if region.is_empty() {
        if let Some(r) = regions.first() {
            return Err(invalid(
                "regions",
                &r.name,
                "regions are listed but `region` (this node's region) is not set",
            ));
        }
        return Ok(());
    }
    // It becomes a NATS subject token and part of KV bucket names: no `.` or `@`.
    name_chars("region", region)?;
    if !clustered {
        return Err(invalid(
            "region",
            region,
            "multi-region mode needs cluster mode (nats_url: the region's NATS cluster)",
        ));
    }
    if regions.len() > MAX_REGIONS {
        return Err(invalid(
            "regions",
            regions.len(),
            &format!("at most {MAX_REGIONS} regions"),
        ));
    }
    for (i, r) in regions.iter().enumerate() {
        name_chars("regions.name", &r.name)?;
        if regions[..i].iter().any(|o| o.name == r.name) {
            return Err(invalid("regions.name", &r.name, "listed twice"));
        }
        let host = r
            .route_url
            .strip_prefix("http://")
            .or(r.route_url.strip_prefix("https://"))
            .map(|h| h.trim_end_matches('/'));
        if host.is_none_or(|h| h.is_empty() || h.contains('/') || r.route_url.len() > 256) {
            return Err(invalid(
                "regions.route_url",
                &r.route_url,
                "use http://HOST:PORT or https://HOST:PORT (at most 256 bytes)",
            ));
        }
    }
    if !regions.iter().any(|r| r.name == region) {
        return Err(invalid(
            "region",
            region,
            "is not one of the listed [[regions]] (every region lists all, itself included)",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, url: &str) -> RegionEntry {
        RegionEntry {
            name: name.into(),
            route_url: url.into(),
        }
    }

    #[test]
    fn checks_the_region_list() {
        let list = vec![
            entry("eu", "http://eu.example:7070"),
            entry("us", "https://us.example"),
        ];
        assert!(validate("", &[], false).is_ok());
        assert!(validate("eu", &list, true).is_ok());
        let e = validate("eu", &list, false).unwrap_err().to_string();
        assert!(e.contains("`region` = eu"), "{e}");
        let e = validate("ap", &list, true).unwrap_err().to_string();
        assert!(e.contains("not one of the listed"), "{e}");
        let e = validate("", &list, true).unwrap_err().to_string();
        assert!(e.contains("`regions`"), "{e}");
        let dup = vec![entry("eu", "http://a:1"), entry("eu", "http://b:1")];
        let e = validate("eu", &dup, true).unwrap_err().to_string();
        assert!(e.contains("listed twice"), "{e}");
        let bad = vec![entry("eu", "ftp://a:1")];
        let e = validate("eu", &bad, true).unwrap_err().to_string();
        assert!(
            e.contains("regions.route_url") && e.contains("ftp://a:1"),
            "{e}"
        );
        let bad = vec![entry("e u", "http://a:1")];
        assert!(validate("eu", &bad, true).is_err());
        let dotted = vec![entry("e.u", "http://a:1")];
        let e = validate("e.u", &dotted, true).unwrap_err().to_string();
        assert!(e.contains("`region` = e.u"), "{e}");
    }
}
