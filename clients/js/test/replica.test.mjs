// The client's pure part: the lobby state after each update (no server needed).
import { test } from 'node:test';
import assert from 'node:assert/strict';

import { applyUpdate, filters } from '../lobby.js';

const snapshot = {
  type: 'lobby_snapshot', lobby_id: '9007199254740993', version: '9007199254740993', name: 'duel',
  max_members: 4, private: false, join_code: '', locked: false, owner: 'ann',
  metadata: { mode: 'duel' }, bans: [],
  members: [
    { member_id: 'ann', join_seq: 1, ready: false, presence: 'connected', attributes: {} },
    { member_id: 'bob', join_seq: 2, ready: false, presence: 'connected', attributes: { hat: 'red' } },
  ],
};

function start() {
  const { result, lobby } = applyUpdate(null, snapshot);
  assert.equal(result, 'applied');
  assert.equal(lobby.type, undefined, 'the snapshot is kept without its message type');
  return lobby;
}

// 2^53 + 1 and 2^53 + 2 are the same JavaScript number: the versions must be BigInts
const NEXT = '9007199254740994';

test('the next version applies; 64-bit versions beyond 2^53 stay exact', () => {
  const lobby = start();
  const { result, lobby: after } = applyUpdate(lobby, {
    type: 'ready_changed', lobby_id: snapshot.lobby_id, version: NEXT, member_id: 'bob', ready: true,
  });
  assert.equal(result, 'applied');
  assert.equal(after.version, NEXT);
  assert.deepEqual(after.members.map((m) => m.ready), [false, true]);
  assert.equal(lobby.members[1].ready, false, 'the state before is not changed in place');
});

test('an older version is stale and a skipped one is a gap; both leave the state alone', () => {
  const lobby = start();
  const stale = applyUpdate(lobby, { type: 'lock_changed', lobby_id: snapshot.lobby_id, version: snapshot.version, locked: true });
  assert.equal(stale.result, 'stale');
  const gap = applyUpdate(lobby, { type: 'lock_changed', lobby_id: snapshot.lobby_id, version: '9007199254740995', locked: true });
  assert.equal(gap.result, 'gap');
  assert.equal(gap.lobby.locked, false);
  const other = applyUpdate(lobby, { type: 'lock_changed', lobby_id: '5', version: NEXT, locked: true });
  assert.equal(other.result, 'other_lobby');
});

test('members join and leave, owners change, changes delete keys with null, bans grow', () => {
  let lobby = start();
  const steps = [
    { type: 'member_joined', member: { member_id: 'cy', join_seq: 3, ready: false, presence: 'connected', attributes: {} } },
    { type: 'member_left', member_id: 'ann', reason: 'left' },
    { type: 'owner_changed', owner: 'bob' },
    { type: 'metadata_changed', changes: { mode: null, map: 'dust' } },
    { type: 'attributes_changed', member_id: 'bob', changes: { hat: null, team: 2 } },
    { type: 'presence_changed', member_id: 'cy', presence: 'reconnecting' },
    { type: 'member_banned', member_id: 'ann' },
  ];
  let version = BigInt(snapshot.version);
  for (const step of steps) {
    version += 1n;
    const { result, lobby: next } = applyUpdate(lobby, { ...step, lobby_id: snapshot.lobby_id, version: String(version) });
    assert.equal(result, 'applied', step.type);
    lobby = next;
  }
  assert.deepEqual(lobby.members.map((m) => m.member_id), ['bob', 'cy']);
  assert.equal(lobby.owner, 'bob');
  assert.deepEqual(lobby.metadata, { map: 'dust' });
  assert.deepEqual(lobby.members[0].attributes, { team: 2 });
  assert.equal(lobby.members[1].presence, 'reconnecting');
  assert.deepEqual(lobby.bans, ['ann']);
});

test('filters are the protocol\'s union members', () => {
  assert.deepEqual(filters.equals('mode', 'duel'), { kind: 'string_equals', key: 'mode', value: 'duel' });
  assert.deepEqual(filters.range('skill', 1, 9), { kind: 'number_range', key: 'skill', low: 1, high: 9 });
  assert.deepEqual(filters.freeSlots(2), { kind: 'free_slots', minimum: 2 });
});
