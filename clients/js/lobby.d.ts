// TypeScript declarations of lobby.js: echo's lobby over its WebSocket door (docs/js-client.md).
// The message shapes are the JSON protocol's (docs/json-protocol.md; its JSON Schema is
// echo/lobby/web/schema.json): 64-bit ids and versions are decimal strings.

export declare const PROTOCOL_VERSION: 1;

/** A lobby id, a version or a search cursor: a 64-bit unsigned integer as a decimal string. */
export type U64 = string;
/** A metadata or attribute value. */
export type Value = string | number;
/** A change map: null deletes the key. */
export type Changes = Record<string, Value | null>;

export declare const CloseCodes: Readonly<{
  NORMAL: 1000; GOING_AWAY: 1001; UNSUPPORTED_DATA: 1003; POLICY_VIOLATION: 1008;
  MESSAGE_TOO_BIG: 1009; HELLO_REFUSED: 4000; TOO_SLOW: 4001; REPLACED: 4002; NO_HELLO: 4003;
  RESUME_REFUSED: 4004;
}>;

export type ErrorCode =
  | 'bad_request' | 'no_such_lobby' | 'not_member' | 'not_owner' | 'already_in_lobby'
  | 'lobby_full' | 'lobby_locked' | 'private_lobby' | 'no_such_code' | 'banned' | 'no_match'
  | 'rate_limited' | 'name_invalid' | 'metadata_limit' | 'attributes_limit' | 'chat_limit'
  | 'filter_invalid' | 'no_such_member' | 'other_member' | 'member_not_connected'
  | 'ban_list_full' | 'server_full' | 'recreate_refused' | 'not_ready' | 'no_game_server';

/** A request the lobby refused. */
export declare class LobbyError extends Error {
  readonly code: ErrorCode;
  /** The request that was refused (null for a check made by the client itself). */
  readonly request: Record<string, unknown> | null;
}

/** The lobby cannot be reached, the connection closed, or a reply did not come in time. */
export declare class LobbyUnavailable extends Error {
  /** The WebSocket close code, when the connection was closed (see CloseCodes). */
  readonly closeCode: number | undefined;
}

export type Filter =
  | { kind: 'string_equals'; key: string; value: string }
  | { kind: 'number_range'; key: string; low: number; high: number }
  | { kind: 'free_slots'; minimum: number };

export declare const filters: Readonly<{
  equals(key: string, value: string | number): Filter;
  range(key: string, low: number, high: number): Filter;
  freeSlots(minimum: number): Filter;
}>;

export type Presence = 'connected' | 'reconnecting';
export type LeaveReason = 'left' | 'kicked' | 'banned' | 'dropped' | 'displaced';

export interface MemberState {
  member_id: string;
  join_seq: number;
  ready: boolean;
  presence: Presence;
  attributes: Record<string, Value>;
}

/** A lobby's whole state as its members see it; members in join order. */
export interface Lobby {
  lobby_id: U64;
  version: U64;
  name: string;
  max_members: number;
  private: boolean;
  join_code: string;
  locked: boolean;
  owner: string;
  metadata: Record<string, Value>;
  bans: string[];
  members: MemberState[];
}

export interface Listing {
  lobby_id: U64;
  name: string;
  member_count: number;
  max_members: number;
  metadata: Record<string, Value>;
  home: string;
}

export interface SearchPage {
  listings: Listing[];
  next_cursor: U64 | null;
}

interface Versioned { lobby_id: U64; version: U64 }

/** What `events()` yields and `on()` is called with. */
export type LobbyEvent =
  | ({ type: 'lobby_snapshot' } & Lobby)
  | ({ type: 'member_joined'; member: MemberState } & Versioned)
  | ({ type: 'member_left'; member_id: string; reason: LeaveReason } & Versioned)
  | ({ type: 'owner_changed'; owner: string; previous?: string } & Versioned)
  | ({ type: 'metadata_changed'; changes: Changes } & Versioned)
  | ({ type: 'lock_changed'; locked: boolean } & Versioned)
  | ({ type: 'attributes_changed'; member_id: string; changes: Changes } & Versioned)
  | ({ type: 'ready_changed'; member_id: string; ready: boolean } & Versioned)
  | ({ type: 'presence_changed'; member_id: string; presence: Presence } & Versioned)
  | ({ type: 'member_banned'; member_id: string } & Versioned)
  | { type: 'chat_line'; lobby_id: U64; member_id: string; text: string }
  /** Go to this game server and show it this ticket (base64). */
  | { type: 'game_starting'; lobby_id: U64; server_id: string; address: string; ticket: string }
  | { type: 'resume_token'; lobby_id: U64; token: string }
  | { type: 'seat_tags'; lobby_id: U64; tags: { member_id: string; tag: string }[] }
  | { type: 'lobby_joined'; request_id: number; lobby_id: U64; seat?: string }
  | { type: 'disconnected'; code: number; reason: string }
  | { type: 'resumed'; lobby_id: U64 }
  | { type: 'resume_failed' }
  /** The server drains: this member's lobby (null: in none) goes to `server`, door `url`; the close (1001) follows. */
  | { type: 'moved'; lobby_id: U64 | null; server: string; url: string }
  /** Followed a `moved`: connected to `url`, in the lobby again (re-created from this client's copy, or joined). */
  | { type: 'rehomed'; lobby_id: U64 | null; server: string; url: string }
  /** A `moved` could not be followed within `resumeFor`: the client is closed. */
  | { type: 'rehome_failed'; url: string }
  | { type: 'protocol_error'; text: string };

export type EventType = LobbyEvent['type'];

export interface ClientOptions {
  /** This member's id (1..64 printable bytes; with --auth-key, the token's subject). */
  member: string;
  /** The identity token (a JWT's text) when the lobby runs with --auth-key. */
  identityToken?: string;
  /** A WebSocket constructor: the browser's by default; in Node 20 the `ws` package's. */
  WebSocket?: new (url: string) => WebSocket;
  /** Milliseconds to wait for each reply (and the welcome). Default 10000. */
  requestTimeout?: number;
  /** Connect again by itself after a dropped connection. Default true. */
  resume?: boolean;
  /** Milliseconds to keep trying to connect again (or to follow a `moved`). Default 30000. */
  resumeFor?: number;
  /** A resume token kept by an earlier client of this member (a reloaded page): take that seat back. */
  resumeToken?: string;
  /** This client's secret (base64 of 16..64 bytes); a random one by default. */
  secret?: string;
  /** Called with every message sent ('out') and received ('in'). */
  trace?: (direction: 'in' | 'out', message: Record<string, unknown>) => void;
}

export declare class LobbyClient {
  /** Open a connection and say hello; resolves once the server has welcomed the member. */
  static connect(url: string, options: ClientOptions): Promise<LobbyClient>;
  constructor(url: string, options: ClientOptions);

  /** The door this client talks to (a `moved` changes it). */
  readonly url: string;
  readonly member: string;
  /** The id of the lobby server that welcomed this client. */
  readonly serverId: string | undefined;
  /** This client's secret (the seat is bound to it). */
  readonly secret: string;
  /** The lobby's state as this member knows it; null when in no lobby. */
  readonly lobby: Lobby | null;
  /** The latest resume token of this member's seat (null when not seated). */
  resumeToken: string | null;
  /** This member's seat in its lobby (base64, from `lobby_joined`): it re-creates the lobby elsewhere. */
  readonly seat: string | null;
  /** True once closed for good (by close(), a refused resume, or a final close code). */
  readonly closed: boolean;
  /** Whether this member owns its lobby. */
  readonly isOwner: boolean;

  open(resumeToken?: string | null, seat?: string | null): Promise<{ type: 'welcome'; v: 1; server_id: string }>;
  /** Close for good (the seat is kept for the lobby's reconnection grace period). */
  close(): void;
  /** Drop the connection as a network would (the client then connects again). */
  drop(): void;

  on<T extends EventType>(type: T | '*', fn: (event: Extract<LobbyEvent, { type: T }>, client: LobbyClient) => void): () => void;
  events(): AsyncIterableIterator<LobbyEvent>;
  waitFor(predicate: (event: LobbyEvent, client: LobbyClient) => boolean, timeout?: number): Promise<LobbyEvent>;
  until(condition: (client: LobbyClient) => boolean, timeout?: number): Promise<void>;

  /** Any request of the JSON protocol, without its request_id; its reply. */
  request(message: { type: string; [field: string]: unknown }): Promise<Record<string, unknown>>;
  create(name: string, maxMembers?: number, options?: { private?: boolean; metadata?: Record<string, Value> }): Promise<U64>;
  join(lobbyId: U64): Promise<U64>;
  joinCode(code: string): Promise<U64>;
  quickJoin(filters?: Filter[]): Promise<U64>;
  search(filters?: Filter[], options?: { cursor?: U64 | null; limit?: number }): Promise<SearchPage>;
  leave(): Promise<void>;
  setMetadata(changes: Changes): Promise<void>;
  lock(locked?: boolean): Promise<void>;
  kick(member: string): Promise<void>;
  ban(member: string): Promise<void>;
  transfer(member: string): Promise<void>;
  setAttributes(changes: Changes): Promise<void>;
  ready(ready?: boolean): Promise<void>;
  chat(text: string): Promise<void>;
  start(tags?: Record<string, string>): Promise<void>;
  requestTicket(): Promise<void>;
  reportGameServer(serverId: string, reason: string): Promise<void>;
  queue(
    mode: string,
    region: string,
    options?: { skill?: number; size?: number; strictRegion?: boolean; start?: boolean },
  ): Promise<U64>;
  cancelQueue(): Promise<void>;
}

export declare function connect(url: string, options: ClientOptions): Promise<LobbyClient>;

/** The lobby state after one update (pure): 'applied', 'stale', 'gap', 'other_lobby' or 'unknown'. */
export declare function applyUpdate(
  lobby: Lobby | null,
  update: LobbyEvent,
): { result: 'applied' | 'stale' | 'gap' | 'other_lobby' | 'unknown'; lobby: Lobby | null };
