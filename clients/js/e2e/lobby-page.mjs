// Two people on the lobby page in real headless Chromium (Debian's /usr/bin/chromium driven by
// playwright-core; Playwright's own browser download is not used). The Python side of the
// scenario (tools/demo/web.py: two members on echo's UDP protocol, the servers) acts on what
// it sees in the lobby, and so does this script: nothing here waits on a clock, each step waits
// for what the page shows.
//
//   node e2e/lobby-page.mjs --page http://127.0.0.1:PORT/ --mode MODE --out DIR
//
// One JSON object a line on stdout: {"who": "web-bea", "saw": "...", ...}, a member's game
// address and ticket as soon as its page shows them ("saw": "game starting"). Screenshots of
// each page at each step go to DIR. Exit status 0 when both members got their game's address
// and ticket.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import { chromium } from 'playwright-core';

const { values: args } = parseArgs({
  options: {
    page: { type: 'string' },
    mode: { type: 'string', default: 'web' },
    out: { type: 'string', default: 'artifacts/web' },
    chromium: { type: 'string', default: '/usr/bin/chromium' },
    timeout: { type: 'string', default: '60000' },
    owner: { type: 'string', default: 'py-ann' },
  },
});
if (!args.page) {
  console.error('usage: lobby-page.mjs --page URL [--mode MODE] [--out DIR]');
  process.exit(2);
}
const TIMEOUT = Number(args.timeout);
const PEOPLE = ['web-bea', 'web-cal'];
// The flags the project runs Chromium with: no sandbox (root in a container), no GPU, no
// network of its own (QUIC, background fetches, component updates, sync), a first run skipped.
const FLAGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];

function say(who, saw, extra = {}) {
  console.log(JSON.stringify({ who, saw, ...extra }));
}

mkdirSync(args.out, { recursive: true });
let shots = 0;
async function shot(person, step) {
  shots += 1;
  await person.page.screenshot({ path: join(args.out, `${String(shots).padStart(2, '0')}-${person.name}-${step}.png`), fullPage: true });
}

const members = (page) => page.locator('[data-testid=member]');

async function memberIds(page) {
  return members(page).evaluateAll((items) => items.map((li) => li.dataset.member));
}

async function waitForText(page, testid, text) {
  await page.locator(`[data-testid=${testid}]`, { hasText: text }).first().waitFor({ timeout: TIMEOUT });
}

// until the page lists `count` members (all of them ready, with allReady)
async function waitMembers(page, count, allReady, what) {
  await page.waitForFunction(
    ([n, ready]) => {
      const items = [...document.querySelectorAll('[data-testid=member]')];
      return items.length === n && (!ready || items.every((li) => li.dataset.ready === 'true'));
    },
    [count, allReady],
    { timeout: TIMEOUT },
  ).catch((error) => { throw new Error(`waiting for ${what}: ${error.message}`); });
}

async function joinLobby(person) {
  const { page, name } = person;
  await page.goto(`${args.page}?trace`);
  await page.locator('body[data-loaded=true]').waitFor({ timeout: TIMEOUT });
  await page.getByTestId('member-name').fill(name);
  await page.getByTestId('connect-button').click();
  await waitForText(page, 'status', `as ${name}`);
  say(name, 'connected', { status: await page.getByTestId('status').textContent() });
  // filter by the scenario's mode until the Python owner's lobby is listed
  await page.getByTestId('filter-mode').fill(args.mode);
  const row = page.locator('[data-testid=listing]').first();
  const deadline = Date.now() + TIMEOUT;
  for (;;) {
    if (Date.now() > deadline) throw new Error(`${name}: no lobby of mode ${args.mode} was listed`);
    await page.getByTestId('search-button').click();
    try {
      // a search a second, the lobby's search rate: listings have no change event to await
      await row.waitFor({ timeout: 1100 });
      break;
    } catch {
      // not listed yet: search again (the listing reaches the search index within a second)
    }
  }
  say(name, 'listing', { name: await row.getAttribute('data-name'), lobby_id: await row.getAttribute('data-lobby-id') });
  await shot(person, 'search');
  await row.getByTestId('join-button').click();
  await page.getByTestId('lobby').waitFor({ timeout: TIMEOUT });
  say(name, 'joined', { members: await memberIds(page) });
}

async function main() {
  const profile = mkdtempSync(join(tmpdir(), 'echo-chromium-'));
  // one browser with a fresh profile (--user-data-dir), two isolated contexts: two people
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: args.chromium, headless: true, args: FLAGS, viewport: { width: 1000, height: 900 },
  });
  const people = [];
  try {
    for (const name of PEOPLE) {
      const page = name === PEOPLE[0] ? (context.pages()[0] ?? await context.newPage()) : await context.newPage();
      page.on('pageerror', (error) => say(name, 'page error', { error: String(error) }));
      page.on('console', (msg) => { if (msg.type() === 'error') say(name, 'console error', { text: msg.text() }); });
      people.push({ name, page });
    }
    // bea joins first, then cal: bea is next in line for the lobby when its owner leaves
    for (const person of people) await joinLobby(person);
    const [bea, cal] = people;

    // everyone is in: two on the page, two on UDP
    for (const person of people) {
      await waitMembers(person.page, 4, false, 'four members');
      say(person.name, 'four members', { members: await memberIds(person.page) });
    }
    await shot(bea, 'four-members');

    // chat both ways: the page speaks, then waits for a Python member's line
    await bea.page.getByTestId('chat-text').fill('hello from the browser');
    await bea.page.getByTestId('chat-button').click();
    for (const person of people) {
      await person.page.locator('[data-testid=chat-line][data-member^="py-"]').first().waitFor({ timeout: TIMEOUT });
      const line = await person.page.locator('[data-testid=chat-line][data-member^="py-"]').first().textContent();
      say(person.name, 'chat from python', { line });
    }

    // attributes, then ready
    for (const [person, colour] of [[bea, 'teal'], [cal, 'amber']]) {
      await person.page.getByTestId('attr-key').fill('colour');
      await person.page.getByTestId('attr-value').fill(colour);
      await person.page.getByTestId('attr-button').click();
      await waitForText(person.page, 'member-attributes', `colour=${colour}`);
      await person.page.getByTestId('ready-button').click();
      await person.page.locator(`[data-testid=member][data-member="${person.name}"][data-ready=true]`).waitFor({ timeout: TIMEOUT });
    }
    await shot(cal, 'ready');

    // the Python owner leaves: the lobby passes to bea, and both pages show it
    await bea.page.getByTestId('you-own').waitFor({ state: 'visible', timeout: TIMEOUT });
    await waitForText(cal.page, 'owner', bea.name);
    say(bea.name, 'owner changed', { owner: await bea.page.getByTestId('owner').textContent(), you_own: true });
    say(cal.name, 'owner changed', { owner: await cal.page.getByTestId('owner').textContent() });
    await shot(bea, 'owner');

    // the owner that left comes back and readies up; bea, the new owner, starts the game
    await waitMembers(bea.page, 4, true, 'four ready members');
    say(bea.name, 'everyone ready', { members: await memberIds(bea.page) });
    await bea.page.getByTestId('start-button').click();

    for (const person of people) {
      await person.page.getByTestId('game').waitFor({ state: 'visible', timeout: TIMEOUT });
      const address = await person.page.getByTestId('game-address').textContent();
      const ticket = await person.page.getByTestId('ticket').inputValue();
      // the ticket goes out at once: the game server takes it only within its time to live
      say(person.name, 'game starting', { address, ticket });
      await shot(person, 'game');
    }
    // every message each page sent and received, for the tests to check against the schema
    for (const person of people) {
      const messages = await person.page.evaluate(() => window.echoTrace ?? []);
      writeFileSync(join(args.out, `trace-${person.name}.jsonl`), messages.map((m) => JSON.stringify(m)).join('\n') + '\n');
    }
    say('browser', 'done');
  } catch (error) {
    for (const person of people) await shot(person, 'failure').catch(() => {});
    say('browser', 'failed', { error: String(error.message ?? error) });
    process.exitCode = 1;
  } finally {
    await context.close();
    rmSync(profile, { recursive: true, force: true });
  }
}

await main();
