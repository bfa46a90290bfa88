// The client against a real echo-lobby --ws-port process. tests/web/test_js_client.py starts
// the server (ports from tests/ports.py) and runs `node --test` with ECHO_LOBBY_WS set; to run
// these by hand: `echo-lobby --ws-port 7680 &` then `ECHO_LOBBY_WS=ws://127.0.0.1:7680 npm test`.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { appendFileSync } from 'node:fs';
import WebSocket from 'ws';

import { LobbyClient, LobbyError, LobbyUnavailable, filters } from '../lobby.js';

const URL = process.env.ECHO_LOBBY_WS;
const skip = URL ? false : 'ECHO_LOBBY_WS is not set (tests/web/test_js_client.py sets it)';
let serial = 0;

function name(prefix) {
  serial += 1;
  return `${prefix}-${process.pid}-${serial}`;
}

// ECHO_WS_TRACE: every message of every client, one JSON line each, which the pytest runner
// validates against the protocol's JSON Schema (echo/lobby/web/schema.json)
const TRACE = process.env.ECHO_WS_TRACE;
const trace = TRACE ? (direction, message) => appendFileSync(TRACE, `${JSON.stringify({ direction, message })}\n`) : null;

async function member(prefix, options = {}) {
  return LobbyClient.connect(URL, { member: name(prefix), WebSocket, trace, ...options });
}

before(() => {
  if (!URL) console.log(`# skipped: ${skip}`);
});

test('without a WebSocket constructor the client says what to pass', { skip: typeof globalThis.WebSocket === 'function' }, () => {
  assert.throws(() => new LobbyClient('ws://127.0.0.1:1', { member: 'x' }), /options\.WebSocket/);
});

test('a server that is not there is LobbyUnavailable', { skip }, async () => {
  const port = new globalThis.URL(URL).port;
  const wrong = URL.replace(`:${port}`, ':1');
  await assert.rejects(LobbyClient.connect(wrong, { member: 'x', WebSocket }), LobbyUnavailable);
});

test('create, search with filters, join, chat both ways, attributes, ready, owner change', { skip }, async () => {
  const ann = await member('ann');
  const bob = await member('bob');
  const mode = name('mode');
  try {
    const lobbyId = await ann.create('js duel', 4, { metadata: { mode, skill: 7 } });
    assert.equal(typeof lobbyId, 'string', 'ids are 64-bit: decimal strings');
    assert.equal(ann.lobby.owner, ann.member);
    assert.ok(ann.isOwner);

    const found = await bob.search([filters.equals('mode', mode), filters.range('skill', 5, 9), filters.freeSlots(1)]);
    assert.deepEqual(found.listings.map((l) => l.lobby_id), [lobbyId]);
    assert.equal(found.listings[0].member_count, 1);
    const none = await bob.search([filters.equals('mode', mode), filters.range('skill', 8, 9)]);
    assert.deepEqual(none.listings, []);

    const annEvents = ann.events();
    const joined = ann.waitFor((e) => e.type === 'member_joined');
    assert.equal(await bob.join(lobbyId), lobbyId);
    assert.equal((await joined).member.member_id, bob.member);
    assert.deepEqual(bob.lobby.members.map((m) => m.member_id), [ann.member, bob.member]);

    const heard = bob.waitFor((e) => e.type === 'chat_line' && e.member_id === ann.member);
    await ann.chat('hello from ann');
    assert.equal((await heard).text, 'hello from ann');
    // the async iterator saw the same events, in order
    const seen = [];
    for await (const event of annEvents) {
      seen.push(event.type);
      if (event.type === 'chat_line') break;
    }
    assert.deepEqual(seen.filter((t) => t === 'member_joined' || t === 'chat_line'), ['member_joined', 'chat_line']);

    const coloured = ann.until(() => ann.lobby.members.find((m) => m.member_id === bob.member)?.attributes.colour === 'red');
    await bob.setAttributes({ colour: 'red' });
    await coloured;
    const readied = ann.waitFor((e) => e.type === 'ready_changed' && e.member_id === bob.member && e.ready);
    await bob.ready();
    await readied;

    // ann, the owner, leaves: the lobby passes to bob, who sees it
    const promoted = bob.waitFor((e) => e.type === 'owner_changed');
    await ann.leave();
    assert.equal(ann.lobby, null);
    const change = await promoted;
    assert.equal(change.owner, bob.member);
    assert.equal(change.previous, ann.member);
    assert.ok(bob.isOwner);
    assert.deepEqual(bob.lobby.members.map((m) => m.member_id), [bob.member]);
  } finally {
    ann.close();
    bob.close();
  }
});

test('refusals are LobbyErrors with the code\'s name', { skip }, async () => {
  const cy = await member('cy');
  const dee = await member('dee');
  try {
    await assert.rejects(cy.join('12345'), (error) => error instanceof LobbyError && error.code === 'no_such_lobby');
    await cy.create('mine', 2);
    await assert.rejects(cy.create('another', 2), (error) => error.code === 'already_in_lobby');
    // start without a game server (no --ticket-key here) is refused, not lost
    await cy.ready();
    await assert.rejects(cy.start(), (error) => error instanceof LobbyError && error.code === 'no_game_server');
    await dee.join(cy.lobby.lobby_id);
    await assert.rejects(dee.kick(cy.member), (error) => error.code === 'not_owner');
    // joining the lobby one is in again answers with it (and a fresh snapshot)
    assert.equal(await dee.join(cy.lobby.lobby_id), cy.lobby.lobby_id);
    await assert.rejects(dee.create('second', 2), (error) => error.code === 'already_in_lobby');
  } finally {
    cy.close();
    dee.close();
  }
});

test('the game loop and the matchmaker: start by tags, tickets, reports, queue and cancel', { skip }, async () => {
  const gus = await member('gus');
  const hal = await member('hal');
  try {
    // Two strangers in one mode and region: matched into one new lobby.
    const mode = name('duel');
    const matched = Promise.all([gus, hal].map((c) => c.until(() => c.lobby !== null)));
    assert.ok(await gus.queue(mode, 'eu', { skill: 1500 }));
    assert.ok(await hal.queue(mode, 'eu', { skill: 1520 }));
    await matched;
    assert.equal(String(gus.lobby.lobby_id), String(hal.lobby.lobby_id));
    // No game server here (no --ticket-key): a start with tags is refused, not lost, and so are
    // a ticket and a report for a game that is not running.
    const owner = gus.isOwner ? gus : hal;
    await gus.ready();
    await hal.ready();
    await assert.rejects(owner.start({ region: 'eu' }), (error) => error.code === 'no_game_server');
    await assert.rejects(gus.requestTicket(), (error) => error.code === 'no_game');
    await assert.rejects(hal.reportGameServer('g-1', 'refused'), (error) => error.code === 'no_game');
    // Out of the lobby, queued alone, then cancelled.
    await gus.leave();
    await gus.queue(name('solo'), 'eu');
    await gus.cancelQueue();
    await assert.rejects(gus.cancelQueue(), (error) => error.code === 'not_queued');
  } finally {
    gus.close();
    hal.close();
  }
});

test('a private lobby is joined by its code; quick-join finds a public one by filters', { skip }, async () => {
  const eve = await member('eve');
  const fay = await member('fay');
  const gus = await member('gus');
  const hal = await member('hal');
  const mode = name('quick');
  try {
    await eve.create('secret', 4, { private: true });
    const code = eve.lobby.join_code;
    assert.ok(code.length > 0);
    await assert.rejects(fay.join(eve.lobby.lobby_id), (error) => error.code === 'private_lobby');
    assert.equal(await fay.joinCode(code), eve.lobby.lobby_id);

    await gus.create('open', 4, { metadata: { mode } });
    assert.equal(await hal.quickJoin([filters.equals('mode', mode)]), gus.lobby.lobby_id);
    await assert.rejects(eve.quickJoin([filters.equals('mode', name('nothing'))]), (e) => e.code === 'already_in_lobby' || e.code === 'no_match');
  } finally {
    for (const c of [eve, fay, gus, hal]) c.close();
  }
});

test('owner operations: metadata, ban, lock, kick, transfer', { skip }, async () => {
  const ida = await member('ida');
  const jon = await member('jon');
  const kim = await member('kim');
  const lou = await member('lou');
  try {
    const id = await ida.create('ops', 4, { metadata: { mode: 'x' } });
    await jon.join(id);
    await kim.join(id);
    await lou.join(id);
    const banned = lou.waitFor((e) => e.type === 'member_left' && e.member_id === lou.member);
    await ida.ban(lou.member);
    assert.equal((await banned).reason, 'banned');
    await jon.until(() => jon.lobby.bans.includes(lou.member));
    await assert.rejects(lou.join(id), (error) => error.code === 'banned');
    const changed = jon.until(() => jon.lobby.metadata.map === 'dust' && !('mode' in jon.lobby.metadata));
    await ida.setMetadata({ map: 'dust', mode: null });
    await changed;
    await ida.lock();
    await jon.until(() => jon.lobby.locked);
    const kicked = kim.waitFor((e) => e.type === 'member_left' && e.member_id === kim.member);
    await ida.kick(kim.member);
    assert.equal((await kicked).reason, 'kicked');
    assert.equal(kim.lobby, null);
    await ida.transfer(jon.member);
    await jon.until(() => jon.isOwner);
  } finally {
    for (const c of [ida, jon, kim, lou]) c.close();
  }
});

test('a dropped connection comes back by itself (the same client secret): the seat, its state, the lobby', { skip }, async () => {
  const lee = await member('lee');
  const max = await member('max');
  try {
    const id = await lee.create('sticky', 4);
    await max.join(id);
    await max.until(() => max.resumeToken !== null);
    await max.ready();
    const resumed = max.waitFor((e) => e.type === 'resumed');
    max.drop();
    await resumed;
    assert.equal(max.lobby.lobby_id, id);
    const me = max.lobby.members.find((m) => m.member_id === max.member);
    assert.equal(me.ready, true, 'the seat came back with its ready state');
    await lee.until(() => lee.lobby.members.find((m) => m.member_id === max.member)?.presence === 'connected');
    const heard = lee.waitFor((e) => e.type === 'chat_line' && e.text === 'back again');
    await max.chat('back again');
    await heard;
  } finally {
    lee.close();
    max.close();
  }
});

test('a new client (a reloaded page) takes the seat back with the resume token; a forged one is refused', { skip }, async () => {
  const ned = await member('ned');
  const oz = await member('oz');
  try {
    const id = await ned.create('tokens', 4);
    await oz.join(id);
    await oz.until(() => oz.resumeToken !== null);
    await oz.setAttributes({ hat: 'blue' });
    const token = oz.resumeToken;
    oz.close(); // the old process is gone; its seat waits, reconnecting
    await ned.until(() => ned.lobby.members.find((m) => m.member_id === oz.member)?.presence === 'reconnecting');

    const forged = Buffer.from(token, 'base64');
    forged[forged.length - 1] ^= 1;
    await assert.rejects(
      LobbyClient.connect(URL, { member: oz.member, WebSocket, trace, resumeToken: forged.toString('base64') }),
      (error) => error instanceof LobbyUnavailable && error.closeCode === 4004,
    );

    const again = await LobbyClient.connect(URL, { member: oz.member, WebSocket, trace, resumeToken: token });
    try {
      assert.notEqual(again.secret, oz.secret);
      await again.until(() => again.lobby !== null);
      assert.equal(again.lobby.lobby_id, id);
      const me = again.lobby.members.find((m) => m.member_id === oz.member);
      assert.deepEqual(me.attributes, { hat: 'blue' });
      await ned.until(() => ned.lobby.members.find((m) => m.member_id === oz.member)?.presence === 'connected');
    } finally {
      again.close();
    }
  } finally {
    ned.close();
    oz.close();
  }
});
