//! How secrets show in `Debug` output, logs and errors: a secret as `<redacted>`, a URL
//! with its password as `***`.

/// A secret as `Debug` shows it: empty, or `<redacted>`.
pub(super) fn redacted(s: &str) -> &'static str {
    if s.is_empty() {
        ""
    } else {
        "<redacted>"
    }
}

/// `url` with the password of its user-info part (`scheme://user:PASSWORD@host`)
/// replaced by `***`, for logs and error messages.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_owned();
    };
    let rest = &url[scheme_end + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].find(':') {
        Some(colon) => format!(
            "{}{}:***{}",
            &url[..scheme_end + 3],
            &rest[..colon],
            &rest[at..]
        ),
        None => url.to_owned(),
    }
}
