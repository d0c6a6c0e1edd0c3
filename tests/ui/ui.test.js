// The web chat page in headless Chromium (Debian's /usr/bin/chromium driven by
// playwright-core): it loads from the binary, sends a message, shows the
// streamed answer with the thinking folded and the live panel filled.
// Screenshot: $BUILD/test-artifacts/ui.png.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, mkdirSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { chromium } from 'playwright-core';
import { startServer, build } from '../api/lib/server.js';

const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
let srv, ctx, profile;

before(async () => {
  srv = await startServer();
  profile = mkdtempSync(path.join(os.tmpdir(), 'tandem-ui-'));
  ctx = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync'],
    viewport: { width: 1100, height: 760 },
  });
});

after(async () => {
  if (ctx) await ctx.close();
  if (profile) rmSync(profile, { recursive: true, force: true });
  if (srv) await srv.stop();
});

test('the chat page streams an answer', { timeout: 240000 }, async () => {
  const page = ctx.pages()[0] || await ctx.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(e.message));
  page.on('console', (m) => { if (m.type() === 'error') errors.push(m.text()); });
  const resp = await page.goto(srv.url + '/');
  assert.equal(resp.status(), 200);
  assert.equal(await page.title(), 'tandem');
  await page.waitForFunction(() => document.getElementById('model').textContent.includes('demo-Q4_K_M'));

  await page.fill('#temperature', '0'); // greedy: the demo then thinks before it answers
  await page.fill('#input', 'What is 12 + 7?');
  await page.press('#input', 'Enter');
  await page.waitForSelector('.msg.assistant[data-done]', { timeout: 200000 });
  assert.equal(await page.getAttribute('.msg.assistant', 'data-done'), 'true');
  const answer = await page.textContent('.msg.assistant .answer');
  assert.ok(answer.trim().length > 0, 'an answer is shown');
  const deltas = Number(await page.getAttribute('.msg.assistant', 'data-deltas'));
  assert.ok(deltas > 1, `the answer was rendered from ${deltas} streamed deltas`);
  // thinking is folded
  const thinking = page.locator('.msg.assistant details.thinking');
  assert.equal(await thinking.isVisible(), true);
  assert.equal(await thinking.evaluate((d) => d.open), false);
  assert.ok((await page.textContent('.msg.assistant .thinking-text')).length > 0);
  // live panel
  assert.match(await page.textContent('#stat-tps'), /^\d+(\.\d+)?$/);
  await page.waitForFunction(() => /%/.test(document.getElementById('stat-hit').textContent));
  assert.match(await page.textContent('#stat-hit'), /^\d+(\.\d+)? %$/);
  assert.match(await page.textContent('#status'), /^done/);

  // a second turn (history is sent back; the code-block answer renders as <pre>)
  await page.fill('#input', 'List the numbers from 3 to 7 in a code block.');
  await page.click('#send');
  await page.waitForSelector('.msg.assistant:nth-of-type(4)[data-done]', { timeout: 200000 });
  assert.equal(await page.locator('.msg').count(), 4);

  const dir = path.join(build, 'test-artifacts');
  mkdirSync(dir, { recursive: true });
  const shot = path.join(dir, 'ui.png');
  await page.screenshot({ path: shot, fullPage: true });
  assert.ok(statSync(shot).size > 1000);
  assert.deepEqual(errors, []);
});
