/**
 * Conversion between the generated protobuf types (src/gen) and the app-facing types
 * (types.ts), and frame encoding/decoding. The only module that builds or reads raw
 * frames' bodies besides the generated code.
 * @module
 */

import { create, fromBinary, toBinary } from "@bufbuild/protobuf";
import * as pb from "./gen/im/v1/im_pb.js";
import { ServerError, type ServerErrorCode } from "./errors.js";
import type {
  ConversationSummary,
  GroupEvent,
  GroupInfo,
  GroupKind,
  GroupOpName,
  GroupRole,
  Message,
  MessageState,
  MessageType,
  Presence,
  ReadReceipt,
  SendAck,
  Typing,
} from "./types.js";

/** A frame body, as the generated code types it. */
export type Body = pb.Frame["body"];

/** Encodes one frame. @param reqId - request id (0 for pushes/acks). @param body - the body. */
export function encodeFrame(reqId: bigint, body: Body): Uint8Array {
  return toBinary(pb.FrameSchema, create(pb.FrameSchema, { reqId, body }));
}

/**
 * Decodes one WebSocket message into frames (a Batch unwrapped, nested ones too).
 * Throws on undecodable bytes.
 * @param bytes - the message.
 */
export function decodeFrames(bytes: Uint8Array): pb.Frame[] {
  const f = fromBinary(pb.FrameSchema, bytes);
  if (f.body.case !== "batch") return [f];
  const out: pb.Frame[] = [];
  const walk = (frames: pb.Frame[]): void => {
    for (const inner of frames) {
      if (inner.body.case === "batch") walk(inner.body.value.frames);
      else out.push(inner);
    }
  };
  walk(f.body.value.frames);
  return out;
}

const decoder = new TextDecoder("utf-8", { fatal: false });

function name<T extends string>(e: Record<number, string>, n: number, fallback: T): T {
  return (e[n] as T | undefined) ?? fallback;
}

/** Enum name to number. @param e - the generated enum. @param n - the name. */
function num(e: object, n: string): number {
  const v = (e as Record<string, unknown>)[n];
  return typeof v === "number" ? v : 0;
}

/** The app's group op name as the wire number. @param op - the op. */
export const opNumber = (op: GroupOpName): pb.GroupOp_Op => num(pb.GroupOp_Op, op);
/** The app's group kind as the wire number. @param k - the kind. */
export const kindNumber = (k: GroupKind): pb.GroupOp_Kind => num(pb.GroupOp_Kind, k);
/** The app's role as the wire number. @param r - the role. */
export const roleNumber = (r: GroupRole): pb.GroupOp_Role => num(pb.GroupOp_Role, r);
/** The app's message type as the wire number. @param t - the type. */
export const typeNumber = (t: MessageType): pb.MessageType => num(pb.MessageType, t);

/** Decodes a SYSTEM payload as a GroupEvent; undefined when it is not one. @param payload - bytes. */
export function decodeGroupEvent(payload: Uint8Array): GroupEvent | undefined {
  try {
    const e = fromBinary(pb.GroupEventSchema, payload);
    return {
      op: name(pb.GroupOp_Op, e.op, "CREATE"),
      actor: e.actor,
      users: e.users,
      count: e.count,
      role: name(pb.GroupOp_Role, e.role, "NONE"),
      kind: name(pb.GroupOp_Kind, e.kind, "PRIVATE"),
    };
  } catch {
    return undefined;
  }
}

/** A wire ChatMessage as the app's Message. @param m - the wire message. */
export function toMessage(m: pb.ChatMessage): Message {
  const type = name<MessageType>(pb.MessageType, m.type, "TEXT");
  const out: Message = {
    conversationId: m.conversationId,
    sender: m.sender,
    payload: m.payload,
    text: type === "TEXT" || type === "EDIT" ? decoder.decode(m.payload) : "",
    sendTime: Number(m.sendTime),
    type,
    seq: Number(m.seq),
    msgId: m.msgId,
    clientMsgId: m.clientMsgId,
    refSeq: Number(m.refSeq),
    refMsgId: m.refMsgId,
    state: name<MessageState>(pb.MessageState, m.state, "ORIGINAL"),
    editTime: Number(m.editTime),
  };
  if (type === "SYSTEM" && m.conversationId.startsWith("g:")) {
    const ev = decodeGroupEvent(m.payload);
    if (ev) out.groupEvent = ev;
  }
  return out;
}

/** A wire SendAck as the app's. @param a - the wire ack. */
export function toSendAck(a: pb.SendAck): SendAck {
  return {
    clientMsgId: a.clientMsgId,
    msgId: a.msgId,
    conversationId: a.conversationId,
    seq: Number(a.seq),
    serverTime: Number(a.serverTime),
    duplicate: a.duplicate,
  };
}

/** A wire GroupOpOk as the app's GroupInfo. @param g - the wire answer. */
export function toGroupInfo(g: pb.GroupOpOk): GroupInfo {
  return {
    groupId: g.groupId,
    members: g.members,
    kind: name(pb.GroupOp_Kind, g.kind, "PRIVATE"),
    role: name(pb.GroupOp_Role, g.role, "NONE"),
    membersCanInvite: g.membersCanInvite,
    version: Number(g.version),
  };
}

/** A wire ConversationSummary as the app's. @param c - the wire summary. */
export function toSummary(c: pb.ConversationSummary): ConversationSummary {
  const out: ConversationSummary = {
    conversationId: c.conversationId,
    kind: c.kind === pb.ConversationKind.GROUP ? "GROUP" : "DIRECT",
    name: c.name,
    size: c.size,
    lastSeq: Number(c.lastSeq),
    lastTime: Number(c.lastTime),
    readSeq: Number(c.readSeq),
    unread: c.unread,
    muted: c.muted,
    pinned: c.pinned,
    peerReadSeq: Number(c.peerReadSeq),
  };
  if (c.lastMessage) out.lastMessage = toMessage(c.lastMessage);
  return out;
}

/** A wire ReadReceipt as the app's. @param r - the wire receipt. */
export function toReceipt(r: pb.ReadReceipt): ReadReceipt {
  return {
    conversationId: r.conversationId,
    userId: r.userId,
    seq: Number(r.seq),
    readCount: r.readCount,
    readTime: Number(r.readTime),
  };
}

/** A wire Presence as the app's. @param p - the wire presence. */
export function toPresence(p: pb.Presence): Presence {
  return { userId: p.userId, online: p.online, lastSeen: Number(p.lastSeen), devices: p.devices };
}

/** A wire Typing as the app's. @param t - the wire typing. */
export function toTyping(t: pb.Typing): Typing {
  return { conversationId: t.conversationId, typing: t.typing, userId: t.userId };
}

/** A wire Error as a {@link ServerError}. @param e - the wire error. */
export function toServerError(e: pb.Error): ServerError {
  return new ServerError(name<ServerErrorCode>(pb.ErrorCode, e.code, "UNSPECIFIED"), e.message, e.retryAfterMs);
}

/** The generated im.v1 module (schemas, enums, message types). */
export { pb };
