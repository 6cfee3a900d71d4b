/**
 * Builders of the request bodies the SDK sends (generated message constructors with
 * the app's number seqs turned into the wire's bigints).
 * @module
 */

import { create } from "@bufbuild/protobuf";
import { kindNumber, opNumber, roleNumber, typeNumber, pb, type Body } from "./convert.js";
import type { OutboxEntry } from "./store.js";
import type { GroupKind, GroupOpName, GroupRole } from "./types.js";

/** Frame body builders. */
export const FrameOut = {
  /** A Login. @param l - token, device, resume. */
  login: (l: { token: string; deviceId: string; resume: boolean }) => create(pb.LoginSchema, l),
  /** A Ping. @param now - ms. */
  ping: (now: number) => create(pb.PingSchema, { clientTime: BigInt(now) }),
  /** A SyncRequest. @param cursors - (conversation, after seq). @param limit - page size. */
  sync: (cursors: Array<[string, number]>, limit: number) =>
    create(pb.SyncRequestSchema, {
      cursors: cursors.map(([conversationId, s]) => create(pb.CursorSchema, { conversationId, afterSeq: BigInt(s) })),
      limit,
    }),
  /** A DeliverAck. @param conversationId - conversation. @param seq - delivered up to. */
  deliverAck: (conversationId: string, seq: number) => create(pb.DeliverAckSchema, { conversationId, seq: BigInt(seq) }),
  /** A PresenceSubscribe. @param users - watched users. */
  presenceSubscribe: (users: string[]) => create(pb.PresenceSubscribeSchema, { users }),
  /** A SetPresence. @param hidden - hide. */
  setPresence: (hidden: boolean) => create(pb.SetPresenceSchema, { hidden }),
  /** A GroupOp. @param g - the operation. */
  groupOp: (g: {
    op: GroupOpName;
    groupId: string;
    members: string[];
    kind: GroupKind;
    role: GroupRole;
    membersCanInvite: boolean;
  }) =>
    create(pb.GroupOpSchema, {
      op: opNumber(g.op),
      groupId: g.groupId,
      members: g.members,
      kind: kindNumber(g.kind),
      role: roleNumber(g.role),
      membersCanInvite: g.membersCanInvite,
    }),
};

/** The frame body of an outbox entry (Send, Recall or Edit). @param e - the entry. */
export function wireEntry(e: OutboxEntry): Body {
  switch (e.op) {
    case "send":
      return {
        case: "send",
        value: create(pb.SendSchema, {
          target: "to" in e.target ? { case: "toUser", value: e.target.to } : { case: "groupId", value: e.target.group },
          type: typeNumber(e.type),
          payload: e.payload,
          clientMsgId: e.clientMsgId,
        }),
      };
    case "recall":
    case "edit": {
      const ref = { conversationId: e.conversationId, seq: BigInt(e.seq), msgId: e.msgId, clientMsgId: e.clientMsgId };
      return e.op === "recall"
        ? { case: "recall", value: create(pb.RecallSchema, ref) }
        : { case: "edit", value: create(pb.EditSchema, { ...ref, payload: e.payload }) };
    }
  }
}
