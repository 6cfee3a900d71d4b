//! Fuzz target: the admin API's JSON bodies. `PUT /admin/v1/log-filters/{uid}` and
//! `PUT /admin/v1/log-level` are the routes that parse a body (`admin::diag`); their
//! handlers' logic (`put_filter`, `put_level`) runs in-process on a real `LogFilters`.
//! Invariants: no panic; a refusal is a 400 or 409 naming what is wrong; an accepted
//! filter is listed with the level and TTL asked for; an accepted level is in force and
//! parses again; the filter table never grows past its cap.

#![no_main]

use std::sync::{Arc, OnceLock};

use axum::http::StatusCode;
use im_server::admin::diag::{put_filter, put_level, Refused};
use im_server::obs::logfilter::{LevelSpec, LogFilters};
use libfuzzer_sys::{arbitrary, fuzz_target};

const MAX_FILTERS: usize = 16;

fn filters() -> &'static Arc<LogFilters> {
    static F: OnceLock<Arc<LogFilters>> = OnceLock::new();
    F.get_or_init(|| {
        let spec = LevelSpec::parse("info").expect("info parses");
        LogFilters::new(spec, true, MAX_FILTERS)
    })
}

#[derive(arbitrary::Arbitrary, Debug)]
enum Req<'a> {
    Filter { uid: &'a str, body: &'a [u8] },
    Level { body: &'a [u8] },
    Remove { uid: &'a str },
}

fn refusal_ok(r: &Refused) {
    assert!(
        r.0 == StatusCode::BAD_REQUEST || r.0 == StatusCode::CONFLICT,
        "status {}",
        r.0
    );
    assert!(!r.1.is_empty(), "a refusal says why");
}

fuzz_target!(|reqs: Vec<Req>| {
    let f = filters();
    for req in reqs {
        match req {
            Req::Filter { uid, body } => match put_filter(f, uid, body) {
                Ok(info) => {
                    assert!(im_proto::valid_id(uid));
                    assert_eq!(info.uid, uid);
                    assert!((1..=86_400).contains(&info.ttl_secs));
                    let listed = f.list();
                    assert!(
                        listed.iter().any(|l| l.uid == uid && l.level == info.level),
                        "accepted filter for {uid:?} is listed"
                    );
                }
                Err(r) => refusal_ok(&r),
            },
            Req::Level { body } => match put_level(f, body) {
                Ok(shown) => {
                    assert_eq!(f.global_level(), shown);
                    assert!(LevelSpec::parse(&shown).is_ok(), "{shown:?} parses again");
                }
                Err(r) => {
                    refusal_ok(&r);
                    assert_eq!(r.0, StatusCode::BAD_REQUEST);
                }
            },
            Req::Remove { uid } => {
                let had = f.list().iter().any(|l| l.uid == uid);
                assert_eq!(f.remove(uid), had);
            }
        }
        assert!(f.active() <= MAX_FILTERS, "{} filters", f.active());
    }
});
