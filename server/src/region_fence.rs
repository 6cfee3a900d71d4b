//! Multi-region fencing of home moves (docs/multi-region.md "Fencing"): the epoch the
//! publisher stamps on each record ([`stamp`]: the epoch this region committed its seq
//! under), the rule the applier asks before applying a record ([`admit`]: a record of
//! epoch e applies when its region is e's home and its seq is at most the next epoch's
//! fence), the apply of a replicated move ([`apply_move`]: the row, and what this
//! region holds above the fence set aside) and the check that sets aside a message a
//! node here committed before it learnt a move ([`recheck_fence`]).

use crate::region::{RegionMap, Term};
use crate::store::homes::{HomeMove, HomeStore, MoveReq, Moved};
use crate::store::repl::Record;

/// The home of `conversation` in epoch `epoch` (an index of `map.names`).
fn home_in(map: &RegionMap, conversation: &str, terms: &[Term], epoch: u64) -> Option<usize> {
    if epoch == 0 {
        let home = crate::region::home_of(conversation, &map.names)?;
        return map.names.iter().position(|n| n == home);
    }
    terms.iter().find(|t| t.epoch == epoch).map(|t| t.region)
}

/// The epoch this region commits `seq` of `conversation` under: the latest term homed
/// here that starts at or before `seq` (0: the hash rule's).
fn epoch_for(map: &RegionMap, conversation: &str, seq: u64) -> u64 {
    let terms = map.homes.terms(conversation);
    let local = map.names.iter().position(|n| *n == map.local);
    terms
        .iter()
        .rev()
        .find(|t| Some(t.region) == local && t.fence < seq)
        .map(|t| t.epoch)
        .unwrap_or(0)
}

/// Stamps each record about to be published with the epoch it was committed under; a
/// move in the batch is learnt first, so the records after it carry its epoch.
pub fn stamp(map: &RegionMap, records: &mut [Record]) {
    for rec in records.iter_mut() {
        match &rec.home {
            Some(m) => map.homes.learn(&map.names, &rec.conversation_id, m),
            None => rec.epoch = epoch_for(map, &rec.conversation_id, rec.seq),
        }
    }
}

/// What the applier does with a record from region `from` ([`admit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admit {
    /// Apply it as usual.
    Apply,
    /// A home move: [`apply_move`].
    Move(HomeMove),
    /// Of an older epoch and above the next epoch's fence: dropped (its region sets
    /// it aside and re-sends it to the new home).
    Fenced,
    /// Of an epoch this region has not learnt yet: redelivered later.
    Wait,
    /// Not `from`'s to publish (region lists that disagree): dropped, loudly.
    Foreign,
}

/// The fencing rule: a record of epoch `e` is applied when `from` is the home of `e`
/// and, if a later epoch exists, its seq is at most that epoch's fence.
pub fn admit(map: &RegionMap, rec: &Record, from: &str) -> Admit {
    if let Some(m) = &rec.home {
        return if rec.region == from && m.region == from {
            Admit::Move(m.clone())
        } else {
            Admit::Foreign
        };
    }
    let terms = map.homes.terms(&rec.conversation_id);
    if terms.last().is_some_and(|t| rec.epoch > t.epoch) || (terms.is_empty() && rec.epoch > 0) {
        return Admit::Wait;
    }
    let from_i = map.names.iter().position(|n| n == from);
    if rec.region != from || from_i.is_none() {
        return Admit::Foreign;
    }
    match home_in(map, &rec.conversation_id, &terms, rec.epoch) {
        Some(h) if Some(h) == from_i => {}
        None if rec.epoch > 0 => return Admit::Wait,
        _ => return Admit::Foreign,
    }
    match terms.iter().find(|t| t.epoch > rec.epoch) {
        Some(next) if rec.seq > next.fence => Admit::Fenced,
        _ => Admit::Apply,
    }
}

/// Records a replicated move in this region's store and map; messages this region
/// holds above its fence are set aside (and re-sent, when this region committed them
/// as the home of the epoch before).
pub async fn apply_move(
    map: &RegionMap,
    homes: &dyn HomeStore,
    conversation: &str,
    m: &HomeMove,
) -> Result<(), crate::store::StoreError> {
    let terms = map.homes.terms(conversation);
    let before = terms
        .iter()
        .rev()
        .find(|t| t.epoch < m.epoch)
        .map(|t| t.region)
        .or_else(|| home_in(map, conversation, &terms, 0));
    let resend = before.is_some_and(|i| map.names[i] == map.local);
    let req = MoveReq {
        epoch: m.epoch,
        region: &m.region,
        fence: Some(m.fence),
        resend,
        publish: false,
        local: &map.local,
    };
    match homes.record_move(conversation, req).await? {
        Moved::Done(row, aside) => {
            map.homes.learn(&map.names, conversation, &row.moved);
            tracing::info!(conversation = ?conversation, epoch = m.epoch, home = %m.region,
                fence = m.fence, "learnt a home move");
            if aside > 0 {
                tracing::warn!(conversation = ?conversation, epoch = m.epoch, fence = m.fence,
                    messages = aside, resend,
                    "messages above a home move's fence set aside for reconciliation");
            }
        }
        Moved::Stale(newest) => {
            tracing::debug!(conversation = ?conversation, epoch = m.epoch, newest,
                "an older home move; a newer one is known");
        }
        Moved::Behind(_) => {}
    }
    Ok(())
}

/// Before a record of a moved conversation (epoch above 0) is applied: when this
/// region holds another message at its seq (a node here committed one before it learnt
/// the move), the move is recorded again, which sets aside everything above its fence
/// (re-sent when this region committed it), so the record applies in order.
pub async fn recheck_fence(
    map: &RegionMap,
    homes: &dyn HomeStore,
    rec: &Record,
) -> Result<(), crate::store::StoreError> {
    if rec.epoch == 0 || rec.hole {
        return Ok(());
    }
    match homes.msg_at(&rec.conversation_id, rec.seq).await? {
        Some(id) if id != rec.msg_id => {}
        _ => return Ok(()),
    }
    let terms = map.homes.terms(&rec.conversation_id);
    let Some(t) = terms.iter().find(|t| t.epoch == rec.epoch) else {
        return Ok(());
    };
    let m = HomeMove {
        epoch: t.epoch,
        region: map.names[t.region].clone(),
        fence: t.fence,
    };
    tracing::warn!(conversation = ?rec.conversation_id, seq = rec.seq,
        "a message committed here after a home move collides with the new home's; set aside");
    apply_move(map, homes, &rec.conversation_id, &m).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(local: &str) -> RegionMap {
        RegionMap {
            local: local.into(),
            names: vec!["a".into(), "b".into()],
            route_urls: vec!["http://a:1".into(), "http://b:1".into()],
            nats: Default::default(),
            key: None,
            lags: Default::default(),
            lists: crate::region_list::ListCheck::new(local, &["a".to_owned(), "b".to_owned()]),
            homes: Default::default(),
        }
    }

    /// A conversation the hash rule homes in `home`.
    fn homed(home: &str) -> String {
        let names = ["a".to_owned(), "b".to_owned()];
        (0..100)
            .map(|i| format!("g:c{i}"))
            .find(|c| crate::region::home_of(c, &names) == Some(home))
            .expect("a conversation per home")
    }

    fn rec(region: &str, conv: &str, seq: u64, epoch: u64) -> Record {
        Record {
            region: region.into(),
            conversation_id: conv.into(),
            seq,
            epoch,
            ..Default::default()
        }
    }

    #[test]
    fn records_above_the_fence_of_an_older_epoch_are_fenced() {
        let b = map("b");
        let conv = homed("a");
        assert_eq!(admit(&b, &rec("a", &conv, 9, 0), "a"), Admit::Apply);
        assert_eq!(admit(&b, &rec("b", &conv, 9, 0), "b"), Admit::Foreign);
        assert_eq!(admit(&b, &rec("a", &conv, 9, 1), "a"), Admit::Wait);
        let moved = HomeMove {
            epoch: 1,
            region: "b".into(),
            fence: 6,
        };
        b.homes.learn(&b.names, &conv, &moved);
        assert_eq!(b.home(&conv), "b");
        assert_eq!(admit(&b, &rec("a", &conv, 6, 0), "a"), Admit::Apply);
        assert_eq!(admit(&b, &rec("a", &conv, 7, 0), "a"), Admit::Fenced);
        assert_eq!(admit(&b, &rec("b", &conv, 7, 1), "b"), Admit::Apply);
        assert_eq!(admit(&b, &rec("a", &conv, 7, 1), "a"), Admit::Foreign);
        // Moved back to a at 20: b's epoch ends at its fence.
        let back = HomeMove {
            epoch: 2,
            region: "a".into(),
            fence: 20,
        };
        b.homes.learn(&b.names, &conv, &back);
        assert_eq!(admit(&b, &rec("b", &conv, 20, 1), "b"), Admit::Apply);
        assert_eq!(admit(&b, &rec("b", &conv, 21, 1), "b"), Admit::Fenced);
        assert_eq!(admit(&b, &rec("a", &conv, 7, 0), "a"), Admit::Fenced);
        assert_eq!(admit(&b, &rec("a", &conv, 21, 2), "a"), Admit::Apply);
        let mut m = rec("b", &conv, 0, 1);
        m.home = Some(moved);
        assert!(matches!(admit(&b, &m, "b"), Admit::Move(_)));
        assert_eq!(admit(&b, &m, "a"), Admit::Foreign);
    }

    #[test]
    fn published_records_carry_the_epoch_they_were_committed_under() {
        let a = map("a");
        let conv = homed("a");
        let mut recs = vec![rec("a", &conv, 7, 9)];
        stamp(&a, &mut recs);
        assert_eq!(recs[0].epoch, 0, "never moved");
        let b = map("b");
        let mut m = rec("b", &conv, 0, 1);
        m.home = Some(HomeMove {
            epoch: 1,
            region: "b".into(),
            fence: 6,
        });
        let mut recs = vec![m, rec("b", &conv, 7, 0)];
        assert_eq!(b.homes.current(&conv), None);
        stamp(&b, &mut recs);
        assert_eq!(recs[1].epoch, 1, "the move in the batch is learnt first");
        assert_eq!(b.homes.moved(), 1);
        // The old home, having learnt it, still stamps its own seqs with epoch 0.
        a.homes
            .learn(&a.names, &conv, recs[0].home.as_ref().unwrap());
        let mut old = vec![rec("a", &conv, 8, 0)];
        stamp(&a, &mut old);
        assert_eq!(old[0].epoch, 0);
    }
}
