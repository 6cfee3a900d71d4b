/**
 * The SDK's data as the app's state takes it: messages (text, placeholders for other
 * kinds, group events as sentences; recall and edit events left out) and conversation
 * list entries.
 */
import type { ConversationSummary, GroupEvent, Message } from "im-sdk";
import type { IncomingMsg, SummaryIn } from "./state.js";

/** The text a message shows, or null for events that are not shown as messages. */
export function messageText(m: Message): string | null {
  switch (m.type) {
    case "TEXT":
      return m.text;
    case "IMAGE":
      return "[image]";
    case "FILE":
      return "[file]";
    case "SYSTEM":
      return m.groupEvent ? groupEventText(m.groupEvent) : "";
    default:
      return null;
  }
}

/** A group membership change as a sentence. */
export function groupEventText(e: GroupEvent): string {
  const who = e.users.join(", ") + (e.count > e.users.length ? ` and ${e.count - e.users.length} more` : "");
  const did: Record<GroupEvent["op"], string> = {
    CREATE: "created the group",
    JOIN: "joined",
    LEAVE: "left",
    ADD: `added ${who}`,
    REMOVE: `removed ${who}`,
    BAN: `banned ${who}`,
    UNBAN: `let ${who} back`,
    SET_ROLE: `made ${who} ${e.role.toLowerCase()}`,
    TRANSFER: `gave the group to ${who}`,
    DISSOLVE: "dissolved the group",
    INFO: "looked the group up",
  };
  return `${e.actor} ${did[e.op]}`;
}

/** A stored message for the state, or null when it is not shown. */
export function incoming(m: Message): IncomingMsg | null {
  if (m.state === "RECALLED" || m.state === "HIDDEN") return null;
  const text = messageText(m);
  if (text === null) return null;
  return { conversationId: m.conversationId, seq: m.seq, sender: m.sender, text, time: m.sendTime, clientMsgId: m.clientMsgId };
}

/** A conversation list entry for the state. */
export function summary(c: ConversationSummary): SummaryIn {
  const last = c.lastMessage ? incoming(c.lastMessage) : null;
  return {
    id: c.conversationId,
    kind: c.kind === "GROUP" ? "group" : "direct",
    name: c.name,
    unread: c.unread,
    lastSeq: c.lastSeq,
    lastText: last?.text ?? "",
    lastTime: c.lastTime,
    peerReadSeq: c.peerReadSeq,
  };
}
