// The TypeScript declarations (lobby.d.ts) compile with a real use of the client, strictly.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

const here = dirname(fileURLToPath(import.meta.url));
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');

test('lobby.d.ts describes the client: a real use compiles, wrong uses are errors', () => {
  const out = execFileSync(process.execPath, [
    tsc, '--noEmit', '--strict', '--target', 'es2022', '--module', 'nodenext',
    '--moduleResolution', 'nodenext', '--lib', 'es2022,dom,dom.iterable', '--skipLibCheck', 'false',
    join(here, 'types', 'usage.ts'),
  ], { encoding: 'utf8' });
  assert.equal(out, '');
});
