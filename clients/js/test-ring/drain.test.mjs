// The client follows its lobby when the lobby server drains: two real echo-lobby processes on
// one ring, each with a WebSocket door and the ring's door URLs (--lobby-ws-urls).
// tests/web/test_js_drain.py starts them and runs `node --test test-ring/` with ECHO_LOBBY_RING
// set: a JSON list of {ws, metrics} for each server, the first one the server to drain.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { appendFileSync } from 'node:fs';
import WebSocket from 'ws';

import { LobbyClient } from '../lobby.js';

const RING = process.env.ECHO_LOBBY_RING ? JSON.parse(process.env.ECHO_LOBBY_RING) : null;
const TRACE = process.env.ECHO_WS_TRACE;
const trace = TRACE ? (direction, message) => appendFileSync(TRACE, `${JSON.stringify({ direction, message })}\n`) : null;

test('a draining server sends its WebSocket members to the lobby\'s next server; they follow with their copy, nothing lost', { skip: RING ? false : 'ECHO_LOBBY_RING is not set (tests/web/test_js_drain.py sets it)' }, async () => {
  const [draining, next] = RING;
  const options = { WebSocket, trace, requestTimeout: 10000 };
  const ann = await LobbyClient.connect(draining.ws, { member: `ann-${process.pid}`, ...options });
  const bob = await LobbyClient.connect(draining.ws, { member: `bob-${process.pid}`, ...options });
  try {
    const lobbyId = await ann.create('moving house', 4, { metadata: { mode: 'duel' } });
    await bob.join(lobbyId);
    await bob.ready();
    assert.ok(bob.seat, 'the seat of lobby_joined is kept');
    const heardByAnn = [];
    const heardByBob = [];
    ann.on('chat_line', (e) => heardByAnn.push(e.text));
    bob.on('chat_line', (e) => heardByBob.push(e.text));
    await ann.chat('before');
    await bob.until(() => heardByBob.includes('before'));

    const movedAnn = ann.waitFor((e) => e.type === 'moved', 15000);
    const rehomedAnn = ann.waitFor((e) => e.type === 'rehomed', 15000);
    const rehomedBob = bob.waitFor((e) => e.type === 'rehomed', 15000);
    const drained = await fetch(`${draining.metrics}/drain`, { method: 'POST' });
    assert.equal(drained.status, 202);
    // Lines said while the server drains: each is carried out by the old server (answered
    // before its `moved`) or sent again on the new one; none is lost, none said twice.
    const said = [];
    for (let i = 0; i < 5; i += 1) {
      said.push(bob.chat(`during ${i}`));
    }
    const moved = await movedAnn;
    assert.deepEqual(
      { lobby_id: moved.lobby_id, url: moved.url },
      { lobby_id: lobbyId, url: next.ws },
    );
    const [toAnn, toBob] = await Promise.all([rehomedAnn, rehomedBob]);
    assert.equal(toAnn.url, next.ws);
    assert.equal(toBob.url, next.ws);
    assert.equal(ann.url, next.ws);
    await Promise.all(said);
    await ann.until(() => ann.lobby.members.length === 2
      && ann.lobby.members.every((m) => m.presence === 'connected'), 15000);
    assert.equal(ann.lobby.lobby_id, lobbyId);
    assert.equal(ann.lobby.metadata.mode, 'duel');
    assert.equal(ann.lobby.members.find((m) => m.member_id === bob.member).ready, true);

    await ann.chat('after');
    await bob.until(() => heardByBob.includes('after'));
    await ann.until(() => said.every((_, i) => heardByAnn.includes(`during ${i}`)), 15000);
    for (let i = 0; i < 5; i += 1) {
      assert.equal(heardByAnn.filter((t) => t === `during ${i}`).length, 1, `during ${i} once`);
    }
    assert.equal(ann.closed, false);
    assert.equal(bob.closed, false);
  } finally {
    ann.close();
    bob.close();
  }
});
