//! The inbound task: envelopes from the other nodes on this node's subject and the
//! all-nodes subject, checked against the cluster key, then delivered to local sessions
//! in arrival order, or applied as notices (resync: every session here syncs and the
//! group cache is dropped; group change: that group's cache entry goes; revocation;
//! presence hidden).

use std::sync::Arc;

use futures_util::StreamExt;
use prost::Message as _;

use super::relay::Envelope;
use super::trust::ClusterKey;
use super::RevokedFn;
use crate::route::Router;
use crate::store::membership::Relations;

/// local sessions in arrival order; resync notices hint every session here.
pub(super) async fn inbound(
    mut subs: impl futures_util::Stream<Item = async_nats::Message> + Unpin,
    router: Arc<Router>,
    relations: Arc<Relations>,
    revoked: RevokedFn,
    me: String,
    key: ClusterKey,
) {
    let received = metrics::counter!("im_cluster_received_total");
    let bad = metrics::counter!("im_cluster_bad_envelopes_total");
    received.absolute(0);
    bad.absolute(0);
    while let Some(msg) = subs.next().await {
        let env = match Envelope::decode(msg.payload) {
            Ok(e) => e,
            Err(e) => {
                bad.increment(1);
                tracing::warn!(error = %e, "undecodable cluster envelope");
                continue;
            }
        };
        if !key.check_envelope(&env) {
            bad.increment(1);
            tracing::debug!(from = %env.from, "ignoring an unsigned or badly signed envelope");
            continue;
        }
        received.increment(1);
        if env.resync {
            if env.from != me {
                relations.evict_all();
                let hinted = router.hint_all();
                tracing::info!(from = %env.from, hinted, "resync notice: every session here syncs");
            }
            continue;
        }
        if !env.group_changed.is_empty() {
            relations.evict(&env.group_changed, env.group_version);
            continue;
        }
        if !env.revoked_user.is_empty() {
            revoked(&env.revoked_user, env.revoked_at);
            continue;
        }
        if !env.presence_user.is_empty() {
            router.presence_hidden(&env.presence_user, env.presence_hidden);
            continue;
        }
        if env.ephemeral {
            router.deliver_ephemeral_remote(&env.users, &env.frame);
            continue;
        }
        if env.notify && !env.frame.is_empty() && key.check_notify(&env) {
            router.notify_remote(&env.users, &env.frame);
            continue;
        }
        let trace = if key.check_trace(&env) {
            env.trace.map(crate::obs::trace::TraceContext::from)
        } else {
            tracing::debug!(from = %env.from, "ignoring a badly signed trace context");
            None
        };
        router.deliver_remote(&env.users, &env.frame, env.direct, trace.as_ref());
    }
}
