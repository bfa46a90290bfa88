// The lobby page: plain DOM code on the JavaScript client (lobby.js), no build step.
// The door is the server that served this page (same host and port), or ?ws=URL.
import { LobbyClient, LobbyError, filters } from './lobby.js';

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const WS_URL = params.get('ws') ?? `${location.protocol === 'https:' ? 'wss' : 'ws'}://${location.host}/`;
const RESUME_KEY = 'echo-lobby-resume:';
const MEMBER_KEY = 'echo-lobby-member';
// ?trace: every message sent and received kept in window.echoTrace (the tests check them all)
const trace = params.has('trace') ? (direction, message) => (window.echoTrace ??= []).push({ direction, message }) : undefined;

let client = null;

function status(text) { $('status').textContent = text; }

function showError(error) {
  const box = $('error');
  box.textContent = error instanceof LobbyError ? `Refused: ${error.code.replaceAll('_', ' ')} (${error.message.replace(/^[a-z_]+: /, '')})` : String(error.message ?? error);
  box.hidden = false;
}

function clearError() { $('error').hidden = true; }

// Run an action of the page: errors are shown, never thrown away.
async function act(fn) {
  clearError();
  try {
    await fn();
  } catch (error) {
    showError(error);
  }
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === 'class') node.className = value;
    else if (key.startsWith('data-')) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) node.append(child);
  return node;
}

function chatNotice(text) {
  const line = el('li', { class: 'notice', 'data-testid': 'notice' }, text);
  $('chat').append(line);
  line.scrollIntoView({ block: 'nearest' });
}

function render() {
  const lobby = client?.lobby ?? null;
  $('connect').hidden = client !== null;
  $('lobbies').hidden = client === null || lobby !== null;
  $('lobby').hidden = lobby === null;
  if (!lobby) return;
  $('lobby-name').textContent = lobby.name;
  $('owner').textContent = lobby.owner;
  $('you-own').hidden = !client.isOwner;
  $('code-line').hidden = !lobby.private;
  $('code').textContent = lobby.join_code;
  $('locked').hidden = !lobby.locked;
  $('start').hidden = !client.isOwner;
  const me = lobby.members.find((m) => m.member_id === client.member);
  $('ready').textContent = me?.ready ? 'Not ready' : 'Ready';
  $('members').replaceChildren(...lobby.members.map((m) => {
    const attrs = Object.entries(m.attributes).map(([k, v]) => `${k}=${v}`).join(', ');
    return el('li', { 'data-testid': 'member', 'data-member': m.member_id, 'data-ready': String(m.ready) },
      el('span', { class: 'name' }, m.member_id + (m.member_id === client.member ? ' (you)' : '')),
      el('span', { class: m.ready ? 'ready' : '' }, m.ready ? 'ready' : 'not ready'),
      el('span', { class: m.presence === 'connected' ? '' : 'away' }, m.presence === 'connected' ? '' : m.presence),
      el('span', { class: 'owner-mark' }, m.member_id === lobby.owner ? 'owner' : ''),
      el('span', { class: 'attrs', 'data-testid': 'member-attributes' }, attrs));
  }));
}

function onEvent(event) {
  switch (event.type) {
    case 'chat_line': {
      const line = el('li', { 'data-testid': 'chat-line', 'data-member': event.member_id },
        el('span', { class: 'who' }, event.member_id), event.text);
      $('chat').append(line);
      line.scrollIntoView({ block: 'nearest' });
      break;
    }
    case 'lobby_snapshot':
      $('chat').replaceChildren();
      chatNotice(`You are in ${event.name}.`);
      break;
    case 'member_joined':
      chatNotice(`${event.member.member_id} joined.`);
      break;
    case 'member_left':
      chatNotice(`${event.member_id} ${event.reason === 'left' ? 'left' : `left (${event.reason})`}.`);
      break;
    case 'owner_changed':
      chatNotice(event.owner === client.member ? 'You are the owner now.' : `${event.owner} is the owner now.`);
      break;
    case 'resume_token':
      sessionStorage.setItem(RESUME_KEY + client.member, event.token);
      break;
    case 'game_starting':
      $('game').hidden = false;
      $('game-address').textContent = event.address;
      $('game-server').textContent = event.server_id;
      $('ticket').value = event.ticket;
      status(`The game is on ${event.address}.`);
      break;
    case 'disconnected':
      status(`Connection lost (${event.code}); resuming...`);
      break;
    case 'resumed':
      status(`Connected to ${client.serverId} as ${client.member} (resumed).`);
      break;
    case 'resume_failed':
      status('Disconnected: the seat could not be resumed. Reload to connect again.');
      break;
    default:
      break;
  }
  render();
}

async function connect(member) {
  const stored = sessionStorage.getItem(RESUME_KEY + member);
  let connected = null;
  if (stored) {
    // this tab sat in a lobby before a reload: take the seat back
    try {
      connected = await LobbyClient.connect(WS_URL, { member, resumeToken: stored, trace });
    } catch {
      sessionStorage.removeItem(RESUME_KEY + member);
    }
  }
  client = connected ?? await LobbyClient.connect(WS_URL, { member, trace });
  sessionStorage.setItem(MEMBER_KEY, member);
  client.on('*', onEvent);
  status(`Connected to ${client.serverId} as ${client.member}${connected ? ' (seat taken back)' : ''}.`);
  if (client.lobby) onEvent({ type: 'lobby_snapshot', ...client.lobby });
  render();
  if (!client.lobby) await search();
}

async function search() {
  const wanted = [];
  const mode = $('filter-mode').value.trim();
  const region = $('filter-region').value.trim();
  const free = Number($('filter-free').value || 0);
  if (mode) wanted.push(filters.equals('mode', mode));
  if (region) wanted.push(filters.equals('region', region));
  if (free > 0) wanted.push(filters.freeSlots(free));
  const { listings } = await client.search(wanted, { limit: 50 });
  $('no-listings').hidden = listings.length > 0;
  $('listings').replaceChildren(...listings.map((l) => {
    const join = el('button', { 'data-testid': 'join-button', type: 'button' }, 'Join');
    join.addEventListener('click', () => act(() => client.join(l.lobby_id)));
    return el('tr', { 'data-testid': 'listing', 'data-lobby-id': l.lobby_id, 'data-name': l.name },
      el('td', {}, l.name), el('td', {}, `${l.member_count}/${l.max_members}`),
      el('td', {}, String(l.metadata.mode ?? '')), el('td', {}, String(l.metadata.region ?? '')),
      el('td', {}, join));
  }));
}

$('connect-form').addEventListener('submit', (e) => {
  e.preventDefault();
  act(() => connect($('member').value.trim()));
});
$('search-form').addEventListener('submit', (e) => { e.preventDefault(); act(search); });
$('code-form').addEventListener('submit', (e) => {
  e.preventDefault();
  act(() => client.joinCode($('join-code').value.trim()));
});
$('create-form').addEventListener('submit', (e) => {
  e.preventDefault();
  const metadata = {};
  if ($('create-mode').value.trim()) metadata.mode = $('create-mode').value.trim();
  if ($('create-region').value.trim()) metadata.region = $('create-region').value.trim();
  act(() => client.create($('create-name').value.trim(), Number($('create-seats').value), {
    private: $('create-private').checked, metadata,
  }));
});
$('ready').addEventListener('click', () => act(() => {
  const me = client.lobby.members.find((m) => m.member_id === client.member);
  return client.ready(!me?.ready);
}));
$('start').addEventListener('click', () => act(() => client.start()));
$('leave').addEventListener('click', () => act(async () => {
  await client.leave();
  sessionStorage.removeItem(RESUME_KEY + client.member);
  render();
  await search();
}));
$('attr-form').addEventListener('submit', (e) => {
  e.preventDefault();
  const key = $('attr-key').value.trim();
  if (!key) return;
  const raw = $('attr-value').value;
  act(() => client.setAttributes({ [key]: raw === '' ? null : raw }));
});
$('chat-form').addEventListener('submit', (e) => {
  e.preventDefault();
  const text = $('chat-text').value;
  if (!text) return;
  act(async () => {
    await client.chat(text);
    $('chat-text').value = '';
  });
});

$('member').value = params.get('member') ?? `guest-${Math.floor(Math.random() * 9000 + 1000)}`;
// a reloaded tab that sat in a lobby connects again by itself and takes its seat back
const last = sessionStorage.getItem(MEMBER_KEY);
if (last && sessionStorage.getItem(RESUME_KEY + last)) {
  $('member').value = last;
  act(() => connect(last));
}
document.body.dataset.loaded = 'true';
