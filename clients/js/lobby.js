// echo's lobby from JavaScript: the client of echo-lobby's WebSocket door (--ws-port).
//
// One ES module with no runtime dependencies, for browsers and Node 20 (which has no global
// WebSocket by default: pass the `ws` package's constructor as the `WebSocket` option, or run
// Node with --experimental-websocket). The messages are the door's JSON protocol
// (docs/json-protocol.md): one JSON object per text frame, a `type` and the fields of the lobby's
// binary messages. Every lobby call is a promise; the lobby's state is kept in `client.lobby`
// from the server's snapshot and updates (exactly the next version is applied; a gap asks for
// a snapshot again); events come as an async iterator (`client.events()`) or callbacks
// (`client.on(type, fn)`). A dropped connection is resumed automatically with the seat's resume
// token, as the Python client does over UDP. When the server drains it says where the lobby goes
// (`moved`, then the close 1001): the client follows, re-creates its lobby there from its copy
// (or joins it, if another member's copy got there first) and sends again the requests that had
// no reply, as the Python client does when its lobby server says goodbye.

export const PROTOCOL_VERSION = 1;

/** The door's close codes (RFC 6455's, then the application's 4000s). */
export const CloseCodes = Object.freeze({
  NORMAL: 1000, GOING_AWAY: 1001, UNSUPPORTED_DATA: 1003, POLICY_VIOLATION: 1008,
  MESSAGE_TOO_BIG: 1009, HELLO_REFUSED: 4000, TOO_SLOW: 4001, REPLACED: 4002, NO_HELLO: 4003,
  RESUME_REFUSED: 4004,
});

// Closes after which connecting again with the resume token cannot help (or must not happen:
// REPLACED means this member connected again elsewhere, and that connection has the seat).
const FINAL_CLOSES = new Set([
  CloseCodes.HELLO_REFUSED, CloseCodes.REPLACED, CloseCodes.RESUME_REFUSED,
  CloseCodes.UNSUPPORTED_DATA, CloseCodes.MESSAGE_TOO_BIG,
]);

/** A request the lobby refused: `code` is the refusal's name in lower case ("lobby_full"). */
export class LobbyError extends Error {
  constructor(code, message, request) {
    super(`${code}: ${message}`);
    this.name = 'LobbyError';
    this.code = code;
    this.request = request;
  }
}

/** The lobby cannot be reached, the connection was closed, or a reply did not come in time. */
export class LobbyUnavailable extends Error {
  constructor(message, closeCode) {
    super(message);
    this.name = 'LobbyUnavailable';
    this.closeCode = closeCode;
  }
}

/** Search and quick-join filters. */
export const filters = Object.freeze({
  equals: (key, value) => ({ kind: 'string_equals', key, value: String(value) }),
  range: (key, low, high) => ({ kind: 'number_range', key, low, high }),
  freeSlots: (minimum) => ({ kind: 'free_slots', minimum }),
});

const UPDATE_TYPES = new Set([
  'member_joined', 'member_left', 'owner_changed', 'metadata_changed', 'lock_changed',
  'attributes_changed', 'ready_changed', 'presence_changed', 'member_banned',
]);

function applyChanges(map, changes) {
  const out = { ...map };
  for (const [key, value] of Object.entries(changes)) {
    if (value === null) delete out[key];
    else out[key] = value;
  }
  return out;
}

/** A pure function: the lobby state after one update (or null if it does not apply). */
export function applyUpdate(lobby, update) {
  if (update.type === 'lobby_snapshot') {
    const { type, ...snapshot } = update;
    return { result: 'applied', lobby: snapshot };
  }
  if (lobby === null || String(update.lobby_id) !== String(lobby.lobby_id)) {
    return { result: 'other_lobby', lobby };
  }
  // versions are 64-bit: decimal strings in JSON, compared as BigInts
  const version = BigInt(update.version);
  const current = BigInt(lobby.version);
  if (version <= current) return { result: 'stale', lobby };
  if (version !== current + 1n) return { result: 'gap', lobby };
  const next = { ...lobby, version: update.version, members: lobby.members.slice() };
  const member = (id, fn) => {
    next.members = next.members.map((m) => (m.member_id === id ? fn({ ...m }) : m));
  };
  switch (update.type) {
    case 'member_joined':
      next.members.push(update.member);
      break;
    case 'member_left':
      next.members = next.members.filter((m) => m.member_id !== update.member_id);
      break;
    case 'owner_changed':
      next.owner = update.owner;
      break;
    case 'metadata_changed':
      next.metadata = applyChanges(lobby.metadata, update.changes);
      break;
    case 'lock_changed':
      next.locked = update.locked;
      break;
    case 'attributes_changed':
      member(update.member_id, (m) => ({ ...m, attributes: applyChanges(m.attributes, update.changes) }));
      break;
    case 'ready_changed':
      member(update.member_id, (m) => ({ ...m, ready: update.ready }));
      break;
    case 'presence_changed':
      member(update.member_id, (m) => ({ ...m, presence: update.presence }));
      break;
    case 'member_banned':
      next.bans = [...lobby.bans, update.member_id];
      break;
    default:
      return { result: 'unknown', lobby };
  }
  return { result: 'applied', lobby: next };
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

// 16 random bytes in base64: this client's secret, sent in every hello. A seat is bound to the
// secret of the client that took it, so the same client, connecting again after a drop, gets
// its seat back; a new client (a reloaded page) takes it back with the seat's resume token.
function newSecret() {
  const bytes = globalThis.crypto.getRandomValues(new Uint8Array(16));
  return btoa(String.fromCharCode(...bytes));
}

/**
 * A member's connection to echo-lobby's WebSocket door.
 *
 * `await LobbyClient.connect(url, {member})`, then `create`, `join`, `search`, `chat`, ... as
 * promises; `client.lobby` is the lobby's state; `for await (const e of client.events())`.
 */
export class LobbyClient {
  /** Open a connection and say hello; resolves when the server has welcomed the member. */
  static async connect(url, options = {}) {
    const client = new LobbyClient(url, options);
    await client.open(client.resumeToken); // with a token: take that seat back
    return client;
  }

  constructor(url, options = {}) {
    if (!options.member) throw new TypeError('a member id (options.member) is needed');
    this.url = url;
    this.member = options.member ?? null;
    this.identityToken = options.identityToken ?? null;
    this.WebSocket = options.WebSocket ?? globalThis.WebSocket;
    if (typeof this.WebSocket !== 'function') {
      throw new TypeError('no WebSocket here: pass one as options.WebSocket (Node 20: the ws package)');
    }
    this.requestTimeout = options.requestTimeout ?? 10000;
    this.autoResume = options.resume ?? true;
    this.resumeFor = options.resumeFor ?? 30000; // how long to keep trying to resume
    this.resumeToken = options.resumeToken ?? null;
    this.secret = options.secret ?? newSecret();
    // trace(direction, message): every message sent ('out') and received ('in'), for tests and logs
    this.trace = options.trace ?? null;
    /** The lobby's state as this member knows it (null when in no lobby). */
    this.lobby = null;
    this.closed = false;
    this._socket = null;
    this._nextRequest = 1;
    this._pending = new Map();
    this._listeners = new Map();
    this._queues = new Set();
    this._welcome = null;
    this._resuming = null;
    /** This member's seat in its lobby (from `lobby_joined`): re-creates the lobby elsewhere. */
    this.seat = null;
    this._moved = null; // the server's `moved`, until the connection closes
  }

  // ------------------------------------------------------------------ connection

  /** Open the WebSocket and say hello (with the resume token or the seat, if given). */
  async open(resumeToken = null, seat = null) {
    const socket = new this.WebSocket(this.url);
    this._socket = socket;
    await new Promise((resolve, reject) => {
      const failed = () => {
        if (this._socket === socket) this._socket = null;
        reject(new LobbyUnavailable(`cannot connect to ${this.url}`));
      };
      socket.onopen = () => { socket.onerror = null; resolve(); };
      socket.onerror = failed;
      socket.onclose = failed;
    });
    socket.onmessage = (event) => this._receive(socket, event.data);
    socket.onclose = (event) => this._closed(socket, event.code, event.reason);
    socket.onerror = () => {};
    const hello = { type: 'hello', v: PROTOCOL_VERSION, member_id: this.member, secret: this.secret };
    if (this.identityToken) hello.token = this.identityToken;
    if (resumeToken) hello.resume = resumeToken;
    else if (seat) hello.seat = seat;
    const welcome = new Promise((resolve, reject) => { this._welcome = { resolve, reject }; });
    this._send(hello);
    const timer = setTimeout(() => {
      this._welcome?.reject(new LobbyUnavailable('no welcome from the server'));
      this._welcome = null;
      socket.close(1000, 'no welcome');
    }, this.requestTimeout);
    try {
      const answer = await welcome;
      this.serverId = answer.server_id;
      return answer;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Close the connection for good (the seat is kept for the lobby's grace period). */
  close() {
    this.closed = true;
    this._failPending(new LobbyUnavailable('the client was closed'));
    if (this._socket) this._socket.close(1000, 'bye');
    this._endQueues();
  }

  /** Drop the connection as a network would (tests): the client resumes if it may. */
  drop() {
    if (this._socket) this._socket.close(4999, 'dropped by the client');
  }

  _send(message) {
    const socket = this._socket;
    if (!socket || socket.readyState !== 1) {
      throw new LobbyUnavailable('not connected');
    }
    this.trace?.('out', message);
    socket.send(JSON.stringify(message));
  }

  _receive(socket, data) {
    if (socket !== this._socket) return;
    let message;
    try {
      message = JSON.parse(typeof data === 'string' ? data : data.toString());
    } catch {
      this._emit({ type: 'protocol_error', text: String(data).slice(0, 200) });
      return;
    }
    this.trace?.('in', message);
    this._dispatch(message);
  }

  _dispatch(message) {
    const { type } = message;
    if (type === 'welcome') {
      this._welcome?.resolve(message);
      this._welcome = null;
      return;
    }
    if (type === 'lobby_joined' && message.seat) this.seat = message.seat;
    if (type === 'moved') {
      // The server drains. Closing from this side lets the server read all it was sent before
      // it closes (so nothing resets the connection); then the client moves (`_closed`).
      this._moved = message;
      this._emit(message);
      this._socket?.close(1000, 'moving');
      return;
    }
    if (message.request_id !== undefined && this._pending.has(message.request_id)) {
      const pending = this._pending.get(message.request_id);
      this._pending.delete(message.request_id);
      clearTimeout(pending.timer);
      if (type === 'refusal') {
        pending.reject(new LobbyError(message.code, message.message ?? '', pending.request));
      } else {
        pending.resolve(message);
      }
      return;
    }
    if (type === 'lobby_snapshot' || UPDATE_TYPES.has(type)) {
      this._update(message);
      return;
    }
    if (type === 'resume_token') this.resumeToken = message.token;
    this._emit(message);
  }

  _update(message) {
    const { result, lobby } = applyUpdate(this.lobby, message);
    if (result === 'gap') {
      // a version is missing: a join of the lobby one is in answers with a fresh snapshot
      this.request({ type: 'join_lobby', lobby_id: this.lobby.lobby_id }).catch(() => {});
      return;
    }
    if (result !== 'applied') return;
    const before = this.lobby;
    this.lobby = lobby;
    if (message.type === 'member_left' && message.member_id === this.member) {
      this.lobby = null;
      this.resumeToken = null;
    }
    if (message.type === 'owner_changed' && before && before.owner !== message.owner) {
      message = { ...message, previous: before.owner };
    }
    this._emit(message);
  }

  _closed(socket, code, reason) {
    if (socket !== this._socket) return;
    this._socket = null;
    const error = new LobbyUnavailable(`the connection closed (${code}${reason ? ` ${reason}` : ''})`, code);
    this._welcome?.reject(error);
    this._welcome = null;
    const moved = this._moved;
    this._moved = null;
    if (moved && !this.closed && !this._resuming && this.autoResume) {
      // The server drained: it carried out none of the requests still without a reply (it
      // answered what it carried out before its `moved`). They go again on the new server.
      const unanswered = [...this._pending.values()];
      for (const pending of unanswered) clearTimeout(pending.timer);
      this._pending.clear();
      this._emit({ type: 'disconnected', code, reason });
      this._resuming = this._rehome(moved, unanswered);
      return;
    }
    this._failPending(error);
    if (this.closed || this._resuming) return; // a resume in progress tries again itself
    this._emit({ type: 'disconnected', code, reason });
    if (this.autoResume && this.resumeToken && this.lobby && !FINAL_CLOSES.has(code)) {
      this._resuming = this._resume();
    } else {
      this.closed = true;
      this._endQueues();
    }
  }

  async _resume() {
    const deadline = Date.now() + this.resumeFor;
    const lobbyId = this.lobby.lobby_id;
    let delay = 100;
    while (!this.closed && Date.now() < deadline) {
      try {
        // the same secret: the server gives this client its seat back, then a snapshot
        const snapshot = this.waitFor(
          (e) => e.type === 'lobby_snapshot' && String(e.lobby_id) === String(lobbyId),
          this.requestTimeout,
        );
        snapshot.catch(() => {});
        await this.open();
        await snapshot;
        this._resuming = null;
        this._emit({ type: 'resumed', lobby_id: lobbyId });
        return;
      } catch (error) {
        if (FINAL_CLOSES.has(error.closeCode)) break; // refused: trying again cannot help
        if (this._socket !== null) break; // connected, but the seat did not come back
        await sleep(delay);
        delay = Math.min(delay * 2, 2000);
      }
    }
    this._resuming = null;
    this.lobby = null;
    this.resumeToken = null;
    this.closed = true;
    if (this._socket) this._socket.close(1000, 'the seat was not resumed');
    this._emit({ type: 'resume_failed' });
    this._endQueues();
  }

  async _rehome(moved, unanswered) {
    const deadline = Date.now() + this.resumeFor;
    const copy = this.lobby;
    this.url = moved.url;
    let delay = 100;
    let failure = null;
    while (!this.closed && Date.now() < deadline) {
      try {
        // With a lobby: the state there (after a re-creation from our copy, a join, or our
        // seat taken back by the hello itself if another member re-created it already).
        const snapshot = copy && this.waitFor(
          (e) => e.type === 'lobby_snapshot' && String(e.lobby_id) === String(copy.lobby_id),
          this.requestTimeout,
        );
        snapshot?.catch(() => {});
        await this.open(null, copy ? this.seat : null);
        if (copy) {
          try {
            await this._call({ type: 'recreate_lobby', snapshot: copy, seat: this.seat ?? '' });
          } catch (error) {
            if (!(error instanceof LobbyError) || error.code !== 'recreate_refused') throw error;
            await this._call({ type: 'join_lobby', lobby_id: copy.lobby_id }); // it lives there
          }
          await snapshot;
        }
        this._resuming = null;
        this._emit({ type: 'rehomed', lobby_id: copy ? copy.lobby_id : null, server: moved.server, url: moved.url });
        for (const pending of unanswered) this._again(pending);
        return;
      } catch (error) {
        failure = error;
        if (error instanceof LobbyError || FINAL_CLOSES.has(error.closeCode)) break;
        if (this._socket) this._socket.close(1000, 'moving again');
        this._socket = null;
        await sleep(delay);
        delay = Math.min(delay * 2, 2000);
      }
    }
    this._resuming = null;
    const error = new LobbyUnavailable(`could not follow the lobby to ${moved.url}: ${failure?.message ?? 'closed'}`);
    for (const pending of unanswered) pending.reject(error);
    this.lobby = null;
    this.resumeToken = null;
    this.closed = true;
    if (this._socket) this._socket.close(1000, 'the lobby was not followed');
    this._emit({ type: 'rehome_failed', url: moved.url });
    this._endQueues();
  }

  // A request the drained server did not carry out, sent on the new server: the caller's
  // promise settles with the new reply.
  _again(pending) {
    const { request_id: _, ...message } = pending.request;
    this._call(message).then(pending.resolve, pending.reject);
  }

  _failPending(error) {
    for (const pending of this._pending.values()) {
      clearTimeout(pending.timer);
      pending.reject(error);
    }
    this._pending.clear();
  }

  // ------------------------------------------------------------------ events

  _emit(event) {
    for (const fn of this._listeners.get(event.type) ?? []) fn(event, this);
    for (const fn of this._listeners.get('*') ?? []) fn(event, this);
    for (const queue of this._queues) queue.push(event);
  }

  /** Call `fn(event)` for each event of `type` ('*': all of them); returns the unsubscriber. */
  on(type, fn) {
    if (!this._listeners.has(type)) this._listeners.set(type, new Set());
    this._listeners.get(type).add(fn);
    return () => this._listeners.get(type).delete(fn);
  }

  /** Every event from now on, as an async iterator (ends when the client closes). */
  events() {
    const buffered = [];
    const waiting = [];
    const queue = {
      push: (event) => {
        if (waiting.length) waiting.shift()({ value: event, done: false });
        else buffered.push(event);
      },
      end: () => {
        while (waiting.length) waiting.shift()({ value: undefined, done: true });
        queue.ended = true;
      },
      ended: false,
    };
    this._queues.add(queue);
    const remove = () => { this._queues.delete(queue); queue.end(); };
    return {
      next: () => {
        if (buffered.length) return Promise.resolve({ value: buffered.shift(), done: false });
        if (queue.ended || this.closed) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => waiting.push(resolve));
      },
      return: () => { remove(); return Promise.resolve({ value: undefined, done: true }); },
      [Symbol.asyncIterator]() { return this; },
    };
  }

  /** The first event for which `predicate(event, client)` holds (rejects after `timeout` ms). */
  waitFor(predicate, timeout = this.requestTimeout) {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => { off(); reject(new Error('waitFor: timed out')); }, timeout);
      const off = this.on('*', (event) => {
        if (predicate(event, this)) {
          clearTimeout(timer);
          off();
          resolve(event);
        }
      });
    });
  }

  /** Resolves when `condition(client)` holds: now, or after one of the coming events. */
  async until(condition, timeout = this.requestTimeout) {
    if (condition(this)) return;
    await this.waitFor(() => condition(this), timeout);
  }

  _endQueues() {
    for (const queue of this._queues) queue.end();
    this._queues.clear();
  }

  // ------------------------------------------------------------------ requests

  /** Send one request (a JSON protocol message without its request_id); its reply. */
  async request(message) {
    if (this._resuming) await this._resuming;
    if (this.closed) throw new LobbyUnavailable('the client is closed');
    return this._call(message);
  }

  // One request on the connection as it is now (no wait for a resume or a move).
  _call(message) {
    const request_id = this._nextRequest++;
    const request = { ...message, request_id };
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this._pending.delete(request_id);
        reject(new LobbyUnavailable(`no reply to ${message.type} in ${this.requestTimeout} ms`));
      }, this.requestTimeout);
      this._pending.set(request_id, { resolve, reject, timer, request });
      try {
        this._send(request);
      } catch (error) {
        if (this._moved) return; // the server closes after its `moved`: sent on the new one
        clearTimeout(timer);
        this._pending.delete(request_id);
        reject(error);
      }
    });
  }

  async _joined(message) {
    const reply = await this.request(message);
    const lobbyId = reply.lobby_id;
    await this.until(() => this.lobby !== null && String(this.lobby.lobby_id) === String(lobbyId));
    return lobbyId;
  }

  _inLobby() {
    if (!this.lobby) throw new LobbyError('NOT_MEMBER', 'not in a lobby', null);
    return this.lobby.lobby_id;
  }

  /** Create a lobby and sit in it; its id. */
  create(name, maxMembers = 8, { private: isPrivate = false, metadata = {} } = {}) {
    return this._joined({ type: 'create_lobby', name, max_members: maxMembers, private: isPrivate, metadata });
  }

  /** Join a public lobby by its id; the id. */
  join(lobbyId) { return this._joined({ type: 'join_lobby', lobby_id: lobbyId }); }

  /** Join a lobby (private or not) by its join code; its id. */
  joinCode(code) { return this._joined({ type: 'join_by_code', code }); }

  /** Join the first lobby with room that matches every filter; its id. */
  quickJoin(filterList = []) { return this._joined({ type: 'quick_join', filters: filterList }); }

  /** One page of lobbies matching every filter: {listings, next_cursor}. */
  async search(filterList = [], { cursor = null, limit = 20 } = {}) {
    const reply = await this.request({ type: 'search_lobbies', filters: filterList, cursor, limit });
    return { listings: reply.listings, next_cursor: reply.next_cursor };
  }

  /** Leave the lobby one is in. */
  async leave() {
    const lobbyId = this._inLobby();
    await this.request({ type: 'leave_lobby', lobby_id: lobbyId });
    this.lobby = null;
    this.resumeToken = null;
  }

  /** Owner: change the lobby's metadata (a null value deletes the key). */
  async setMetadata(changes) { await this.request({ type: 'set_metadata', lobby_id: this._inLobby(), changes }); }

  /** Owner: lock or unlock the lobby (a locked lobby takes no new members). */
  async lock(locked = true) { await this.request({ type: 'set_locked', lobby_id: this._inLobby(), locked }); }

  /** Owner: remove a member. */
  async kick(member) { await this.request({ type: 'kick_member', lobby_id: this._inLobby(), member_id: member }); }

  /** Owner: remove a member and refuse them from now on. */
  async ban(member) { await this.request({ type: 'ban_member', lobby_id: this._inLobby(), member_id: member }); }

  /** Owner: hand the lobby to another (connected) member. */
  async transfer(member) { await this.request({ type: 'transfer_owner', lobby_id: this._inLobby(), member_id: member }); }

  /** Change this member's own attributes (a null value deletes the key). */
  async setAttributes(changes) {
    await this.request({ type: 'set_attributes', lobby_id: this._inLobby(), member_id: this.member, changes });
  }

  /** Say this member is ready (or not). */
  async ready(ready = true) {
    await this.request({ type: 'set_ready', lobby_id: this._inLobby(), member_id: this.member, ready });
  }

  /** Send a chat line to the lobby. */
  async chat(text) { await this.request({ type: 'send_chat', lobby_id: this._inLobby(), text }); }

  /**
   * Owner: start the game, on a game server that announces every tag of `tags` (region, mode,
   * version, ...); every connected member then gets a `game_starting` event.
   */
  async start(tags = {}) {
    const wanted = Object.entries(tags).map(([key, value]) => filters.equals(key, value));
    await this.request({
      type: 'start_game', lobby_id: this._inLobby(), ...(wanted.length ? { filters: wanted } : {}),
    });
  }

  /** While the lobby's game runs (after a crash, say): a fresh ticket, in a `game_starting` event. */
  async requestTicket() { await this.request({ type: 'request_ticket', lobby_id: this._inLobby() }); }

  /** The game server `serverId` refused this member's ticket: enough reports take it out of rotation. */
  async reportGameServer(serverId, reason) {
    await this.request({ type: 'report_game_server', lobby_id: this._inLobby(), server_id: serverId, reason });
  }

  /**
   * Ask the matchmaker for a match of `size` players in `mode` and `region`: the queue ticket's
   * id; a `matched` event follows (this member is then seated in the match's lobby), or
   * `queue_left`. `start`: the match's game starts at once.
   */
  async queue(mode, region, { skill = 0, size = 2, strictRegion = false, start = false } = {}) {
    const reply = await this.request({
      type: 'enqueue_match', mode, region, skill, size, party: '0', party_size: 1, party_seat: '',
      strict_region: strictRegion, start, waited_ms: 0,
    });
    return reply.ticket;
  }

  /** Leave the matchmaker's queue (`not_queued` if not in it). */
  async cancelQueue() { await this.request({ type: 'cancel_match' }); }

  /** Whether this member owns its lobby. */
  get isOwner() { return this.lobby !== null && this.lobby.owner === this.member; }
}

/** `LobbyClient.connect` as a function. */
export function connect(url, options) { return LobbyClient.connect(url, options); }
