//! Groups set up over a raw connection before a run: [`create_group`] makes a group of
//! any size with `CREATE` and `ADD`s, each frame under the server's frame limit, waiting
//! out `RATE_LIMITED` refusals. The broadcast scenario and the peer scenarios use it.

use std::time::Duration;

use anyhow::{bail, Context};
use im_client::{ClientError, RawConn, RawEvent};
use im_proto::{group_op, Body, GroupOp};
use tokio::time::Instant;

/// How long group creation may take.
const GROUP_OP_TIMEOUT: Duration = Duration::from_secs(60);
/// req_id of the GroupOps.
const GROUP_OP_REQ: u64 = 1 << 40;

/// Member ids per GroupOp, in bytes: one frame must stay under the server's
/// `limits.max_frame_bytes` (64 KiB by default).
const GROUP_OP_BYTES: usize = 32 * 1024;

/// Creates group `id` with `members` from the sender's connection (its owner): `CREATE`
/// with the first members, then `ADD`s with the rest, each frame well under the frame
/// limit. Returns the group's version (the seq of its last membership event).
pub async fn create_group(
    conn: &mut RawConn,
    id: &str,
    members: Vec<String>,
) -> anyhow::Result<u64> {
    let want = members.len();
    let mut chunks: Vec<Vec<String>> = vec![Vec::new()];
    let mut bytes = 0;
    for m in members {
        if bytes + m.len() + 3 > GROUP_OP_BYTES {
            chunks.push(Vec::new());
            bytes = 0;
        }
        bytes += m.len() + 3;
        if let Some(last) = chunks.last_mut() {
            last.push(m);
        }
    }
    let (mut have, mut version) = (0, 0);
    for (k, chunk) in chunks.into_iter().enumerate() {
        let op = if k == 0 {
            group_op::Op::Create
        } else {
            group_op::Op::Add
        };
        (have, version) = group_op(conn, id, op, chunk).await?;
    }
    if (have as usize) < want {
        bail!("group {id} has {have} members, {want} asked for");
    }
    Ok(version)
}

/// Sends one GroupOp and waits for its GroupOpOk (again after RATE_LIMITED, once the
/// server's retry_after_ms has passed); returns the member count and the version.
async fn group_op(
    conn: &mut RawConn,
    id: &str,
    op: group_op::Op,
    members: Vec<String>,
) -> anyhow::Result<(u32, u64)> {
    let deadline = Instant::now() + GROUP_OP_TIMEOUT;
    'again: loop {
        conn.send(&im_proto::frame(
            GROUP_OP_REQ,
            Body::GroupOp(GroupOp {
                op: op as i32,
                group_id: id.to_owned(),
                members: members.clone(),
                ..Default::default()
            }),
        ))
        .await
        .with_context(|| format!("sending GroupOp {op:?} {id}"))?;
        loop {
            let ev = tokio::time::timeout_at(deadline, conn.recv())
                .await
                .with_context(|| format!("no GroupOpOk for {id} within {GROUP_OP_TIMEOUT:?}"))?
                .with_context(|| format!("GroupOp {op:?} {id}"))?;
            let f = match ev {
                RawEvent::Frame(f) => f,
                RawEvent::WsPong(_) => continue,
                RawEvent::Closed { code, reason } => {
                    bail!("connection closed during GroupOp {op:?} {id}: {code:?} {reason}")
                }
            };
            match f.body {
                Some(Body::GroupOpOk(ok)) if f.req_id == GROUP_OP_REQ => {
                    return Ok((ok.members, ok.version))
                }
                Some(Body::Error(e))
                    if f.req_id == GROUP_OP_REQ
                        && e.code == im_proto::ErrorCode::RateLimited as i32 =>
                {
                    tokio::time::sleep(Duration::from_millis(e.retry_after_ms.max(1) as u64)).await;
                    continue 'again;
                }
                Some(Body::Error(e)) if f.req_id == GROUP_OP_REQ || f.req_id == 0 => {
                    bail!("GroupOp {op:?} {id}: {}", ClientError::from_server(e))
                }
                _ => {}
            }
        }
    }
}
