// A person reloads the lobby page while in a lobby: the tab takes its seat back by itself
// with the seat's resume token (kept in sessionStorage), attributes and all, and the lobby's
// other members see the seat come back. Headless Chromium as in lobby-page.mjs.
//
//   node e2e/page-reload.mjs --page http://127.0.0.1:PORT/ --out DIR
//
// Prints one JSON object: {"before": {...}, "after": {...}}; exit status 0 when the seat came back.
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { parseArgs } from 'node:util';

import { chromium } from 'playwright-core';

const { values: args } = parseArgs({
  options: {
    page: { type: 'string' },
    out: { type: 'string', default: 'artifacts/web' },
    chromium: { type: 'string', default: '/usr/bin/chromium' },
  },
});
const FLAGS = [
  '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
  '--disable-background-networking', '--disable-component-update', '--disable-sync',
];
const TIMEOUT = 30000;
mkdirSync(args.out, { recursive: true });
const profile = mkdtempSync(join(tmpdir(), 'echo-chromium-'));
const context = await chromium.launchPersistentContext(profile, {
  executablePath: args.chromium, headless: true, args: FLAGS, viewport: { width: 1000, height: 800 },
});
try {
  const page = context.pages()[0] ?? await context.newPage();
  const seen = async () => ({
    status: await page.getByTestId('status').textContent(),
    lobby: await page.getByTestId('lobby-name').textContent(),
    members: await page.locator('li[data-testid=member]').evaluateAll((l) => l.map((li) => li.dataset.member)),
    attributes: await page.getByTestId('member-attributes').first().textContent(),
  });
  await page.goto(`${args.page}?member=web-eve`);
  await page.locator('body[data-loaded=true]').waitFor({ timeout: TIMEOUT });
  await page.getByTestId('connect-button').click();
  await page.getByTestId('create-name').waitFor({ state: 'visible', timeout: TIMEOUT });
  await page.getByTestId('create-name').fill('Reload test');
  await page.getByTestId('create-button').click();
  await page.getByTestId('lobby').waitFor({ timeout: TIMEOUT });
  await page.getByTestId('attr-key').fill('hat');
  await page.getByTestId('attr-value').fill('green');
  await page.getByTestId('attr-button').click();
  await page.getByTestId('member-attributes', { hasText: 'hat=green' }).waitFor({ timeout: TIMEOUT });
  // the resume token has reached the page once the server sent it (after the seat was taken)
  await page.waitForFunction(() => sessionStorage.getItem('echo-lobby-resume:web-eve') !== null, null, { timeout: TIMEOUT });
  const before = await seen();
  await page.reload();
  await page.getByTestId('status').filter({ hasText: 'seat taken back' }).waitFor({ timeout: TIMEOUT });
  await page.getByTestId('lobby').waitFor({ timeout: TIMEOUT });
  await page.getByTestId('member-attributes', { hasText: 'hat=green' }).waitFor({ timeout: TIMEOUT });
  const after = await seen();
  await page.screenshot({ path: join(args.out, 'reload-after.png'), fullPage: true });
  console.log(JSON.stringify({ before, after }));
} catch (error) {
  console.log(JSON.stringify({ failed: String(error.message ?? error) }));
  process.exitCode = 1;
} finally {
  await context.close();
  rmSync(profile, { recursive: true, force: true });
}
