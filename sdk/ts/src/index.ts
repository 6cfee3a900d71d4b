/**
 * im-sdk: the TypeScript SDK of im-server. Import everything from here.
 * @packageDocumentation
 */

export { Client } from "./client.js";
export type { SendOptions, CreateGroupOptions, GroupOpRequest } from "./client.js";
export type { ClientEvents, ConnectionState } from "./events.js";
export type { ClientOptions, WebSocketConstructor, WebSocketLike } from "./options.js";
export type {
  ConversationKind,
  ConversationPage,
  ConversationSummary,
  GroupEvent,
  GroupInfo,
  GroupKind,
  GroupOpName,
  GroupRole,
  HistoryPage,
  Message,
  MessageState,
  MessageType,
  Pong,
  Presence,
  ReadReceipt,
  SendAck,
  Session,
  Target,
  Typing,
} from "./types.js";
export {
  ImError,
  InvalidArgumentError,
  ConfigError,
  ServerError,
  LoginRefusedError,
  KickedError,
  TokenExpiredError,
  DisconnectedError,
  TimeoutError,
  OutboxFullError,
  ClientClosedError,
  ProtocolError,
} from "./errors.js";
export type { AnyImError, ImErrorKind, ServerErrorCode } from "./errors.js";
export { MemoryOutboxStore, IndexedDbOutboxStore } from "./store.js";
export type { OutboxEntry, OutboxStore, IdbFactoryLike } from "./store.js";
export { directConversationId, groupConversationId, newClientMsgId } from "./ids.js";
