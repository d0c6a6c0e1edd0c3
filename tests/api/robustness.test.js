// Bad input never crashes or hangs the server: malformed JSON, wrong types,
// huge bodies, unknown fields, empty messages, clients leaving mid-stream or
// while queued, 20 concurrent clients, and no memory growth over 200 requests.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import OpenAI from 'openai';
import { startServer, rawRequest } from './lib/server.js';

let srv, client;
const T = { timeout: 300000 };
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 280000 });
});
after(async () => {
  assert.ok(srv.alive(), 'the server survived every test');
  await srv.stop();
});

const post = (path, body, headers = {}) => rawRequest(srv.url, {
  method: 'POST', path, headers: { 'content-type': 'application/json', ...headers }, body,
});
const chat = (extra) => JSON.stringify({ messages: [{ role: 'user', content: 'What is 12 + 7?' }], max_tokens: 2, grace_tokens: 0, ...extra });

function assertOpenAIError(r, status, param) {
  assert.equal(r.status, status, r.text);
  assert.equal(typeof r.json.error.message, 'string');
  assert.equal(typeof r.json.error.type, 'string');
  assert.ok('param' in r.json.error && 'code' in r.json.error);
  if (param !== undefined) assert.equal(r.json.error.param, param);
}

async function waitIdle(ms = 20000) {
  const t0 = Date.now();
  for (;;) {
    const m = await srv.metrics();
    if (m.tandem_requests_running === 0 && m.tandem_queue_depth === 0) return m;
    if (Date.now() - t0 > ms) throw new Error('the server stayed busy: ' + JSON.stringify(m));
    await sleep(100);
  }
}

test('malformed JSON is 400 in each API shape', T, async () => {
  for (const body of ['{', '{"messages": [}', 'null', '[]', '"text"', '\u0000\u0001', '{"messages":[{"role":"user","content":"hi"}]} trailing'])
    assertOpenAIError(await post('/v1/chat/completions', body), 400);
  assertOpenAIError(await post('/v1/completions', '{'), 400);
  assertOpenAIError(await post('/v1/chat/completions', ''), 400);
  const a = await post('/v1/messages', '{"model":', { 'anthropic-version': '2023-06-01' });
  assert.equal(a.status, 400);
  assert.equal(a.json.type, 'error');
  assert.equal(a.json.error.type, 'invalid_request_error');
});

test('wrong types and values are 400 naming the field', T, async () => {
  const cases = [
    [{ temperature: 'hot' }, 'temperature'], [{ temperature: 9 }, 'temperature'], [{ top_p: -1 }, 'top_p'],
    [{ top_k: 1.5 }, 'top_k'], [{ max_tokens: 0 }, 'max_tokens'], [{ max_tokens: '5' }, 'max_tokens'],
    [{ stop: 5 }, 'stop'], [{ stop: ['a', 7] }, 'stop'], [{ stop: [''] }, 'stop'], [{ stop: Array(17).fill('x') }, 'stop'],
    [{ stream: 'yes' }, 'stream'], [{ seed: 'x' }, 'seed'], [{ n: 2 }, 'n'], [{ reasoning_effort: 'max' }, 'reasoning_effort'],
    [{ chat_template_kwargs: { enable_thinking: 'no' } }, 'chat_template_kwargs.enable_thinking'],
    [{ messages: 'hello' }, 'messages'], [{ messages: [{ role: 'wizard', content: 'x' }] }, 'messages[0]'],
    [{ messages: [{ role: 'user' }] }, 'messages[0]'], [{ messages: [{ role: 'user', content: 42 }] }, 'messages[0].content'],
    [{ messages: [{ role: 'user', content: [{ type: 'image_url', image_url: {} }] }] }, 'messages[0].content'],
    [{ messages: [7] }, 'messages[0]'], [{ max_thinking_tokens: -2 }, 'max_thinking_tokens'],
  ];
  for (const [extra, param] of cases) assertOpenAIError(await post('/v1/chat/completions', chat(extra)), 400, param);
  assertOpenAIError(await post('/v1/completions', JSON.stringify({ prompt: 5 })), 400, 'prompt');
  assertOpenAIError(await post('/v1/completions', JSON.stringify({})), 400, 'prompt');
  await assert.rejects(client.chat.completions.create({ model: 'demo', messages: [{ role: 'user', content: 'x' }], temperature: 'warm' }),
    (e) => e instanceof OpenAI.BadRequestError && e.param === 'temperature');
});

test('empty message list and missing messages are 400', T, async () => {
  assertOpenAIError(await post('/v1/chat/completions', JSON.stringify({ messages: [] })), 400, 'messages');
  assertOpenAIError(await post('/v1/chat/completions', JSON.stringify({ model: 'x' })), 400, 'messages');
  await assert.rejects(client.chat.completions.create({ model: 'demo', messages: [] }), (e) => e.status === 400);
});

test('unknown fields are ignored (200)', T, async () => {
  const r = await post('/v1/chat/completions', chat({
    foo: 1, bar: { nested: [1, 2, { x: null }] }, logit_bias: { 5: 1 }, user: 'u', metadata: { a: 'b' },
    response_format: { type: 'text' }, parallel_tool_calls: false, store: false, temperature: null,
  }));
  assert.equal(r.status, 200, r.text);
  assert.equal(r.json.object, 'chat.completion');
});

test('huge bodies are 413 (announced, and chunked without a length)', T, async () => {
  const big = JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(5 << 20) }] });
  const r = await post('/v1/chat/completions', big);
  assertOpenAIError(r, 413);
  const a = await post('/v1/messages', big);
  assert.equal(a.status, 413);
  assert.equal(a.json.error.type, 'request_too_large');
  // chunked transfer: the limit is enforced while reading
  const chunked = await new Promise((resolve, reject) => {
    const s = net.connect(srv.port, '127.0.0.1');
    let out = '';
    s.on('data', (d) => { out += d; });
    s.on('end', () => resolve(out));
    s.on('error', reject);
    s.write('POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n');
    const piece = 'y'.repeat(1 << 20);
    for (let i = 0; i < 6; i++) s.write(piece.length.toString(16) + '\r\n' + piece + '\r\n');
    s.end('0\r\n\r\n');
  });
  assert.match(chunked, /^HTTP\/1\.1 413/);
  // a body just under the limit is parsed normally (400 for the bad value, not 413)
  const under = JSON.stringify({ messages: [{ role: 'user', content: 'x' }], pad: 'p'.repeat(3 << 20), temperature: 'bad' });
  assertOpenAIError(await post('/v1/chat/completions', under), 400, 'temperature');
});

test('unknown routes are 404, wrong methods 405', T, async () => {
  assertOpenAIError(await rawRequest(srv.url, { path: '/v1/nothing' }), 404);
  const m = await rawRequest(srv.url, { path: '/v1/chat/completions' });
  assertOpenAIError(m, 405);
  assert.equal(m.headers.allow, 'POST');
  assertOpenAIError(await rawRequest(srv.url, { method: 'DELETE', path: '/v1/models' }), 405);
  assertOpenAIError(await rawRequest(srv.url, { method: 'POST', path: '/health', body: '{}' }), 405);
});

test('a prompt longer than the context is 400, also when streaming', T, async () => {
  const long = 'The jury said that the city of Atlanta was fine. '.repeat(600);
  const r = await post('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: long }] }));
  assertOpenAIError(r, 400);
  assert.match(r.json.error.message, /context/);
  const s = await post('/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: long }], stream: true }));
  assertOpenAIError(s, 400);
});

test('a client leaving mid-stream stops its generation; the server goes on', T, async () => {
  const before = await waitIdle();
  const ctl = new AbortController();
  const res = await fetch(srv.url + '/v1/completions', {
    method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'The jury said', max_tokens: 3000, ignore_eos: true, stream: true }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  let got = 0;
  while (got < 3) { const { done } = await reader.read(); assert.ok(!done); got++; }
  ctl.abort();
  const after = await waitIdle(20000);
  assert.equal(after.tandem_requests_cancelled_total, before.tandem_requests_cancelled_total + 1);
  const generated = after.tandem_generated_tokens_total - before.tandem_generated_tokens_total;
  assert.ok(generated < 3000, `generation stopped early (${generated} tokens)`);
  const r = await post('/v1/chat/completions', chat());
  assert.equal(r.status, 200);
});

test('a client leaving while queued is skipped', T, async () => {
  const before = await waitIdle();
  /* the job ahead streams until its client stops it, well after the server
   * (which checks a waiting client every 100 ms) has seen the queued one
   * leave: how fast the model runs does not matter */
  const ctlLong = new AbortController();
  const long = await fetch(srv.url + '/v1/completions', {
    method: 'POST', signal: ctlLong.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ prompt: 'The jury said', max_tokens: 3000, ignore_eos: true, stream: true }),
  });
  assert.equal(long.status, 200);
  const { done } = await long.body.getReader().read();
  assert.ok(!done);
  const ctl = new AbortController();
  const queued = fetch(srv.url + '/v1/chat/completions', {
    method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' }, body: chat({ stream: true }),
  }).catch((e) => e);
  await sleep(300);
  assert.equal((await srv.metrics()).tandem_queue_depth, 1);
  ctl.abort();
  assert.equal((await queued).name, 'AbortError');
  await sleep(500);
  ctlLong.abort();
  const after = await waitIdle();
  assert.equal(after.tandem_requests_cancelled_total, before.tandem_requests_cancelled_total + 2);
  assert.equal(after.tandem_generations_total, before.tandem_generations_total + 1, 'the queued job never ran');
});

test('400 mutated requests: only 200/400 answers, never a crash', T, async () => {
  let seed = 12345;
  const rnd = (n) => { seed = (seed * 1103515245 + 12345) >>> 0; return (seed >>> 8) % n; };
  const odd = [null, true, false, 0, -1, 2.5, 1e308, -1e308, '', 'str', '\u0000', [], {}, [1, 'a'], { a: {} }, 'x'.repeat(3000)];
  const bases = [
    ['/v1/chat/completions', { model: 'd', messages: [{ role: 'user', content: 'What is 12 + 7?' }], max_tokens: 2, grace_tokens: 0, temperature: 0.5, stop: ['x'], stream: false }],
    ['/v1/completions', { model: 'd', prompt: 'The jury said', max_tokens: 2, seed: 3 }],
    ['/v1/messages', { model: 'd', max_tokens: 2, grace_tokens: 0, system: 'be brief', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }], thinking: { type: 'enabled', budget_tokens: 1 } }],
  ];
  const mutate = (v, depth) => {
    if (depth > 3 || rnd(4) === 0) return odd[rnd(odd.length)];
    if (Array.isArray(v)) return v.map((x) => (rnd(3) ? mutate(x, depth + 1) : x));
    if (v && typeof v === 'object') {
      const o = {};
      for (const [k, x] of Object.entries(v)) {
        const r = rnd(6);
        if (r === 0) continue;                    // drop the field
        o[k] = r === 1 ? mutate(x, depth + 1) : x;
      }
      if (rnd(5) === 0) o['k' + rnd(100)] = odd[rnd(odd.length)];
      return o;
    }
    return v;
  };
  for (let i = 0; i < 400; i++) {
    const [path, base] = bases[i % bases.length];
    let body = JSON.stringify(mutate(base, 0));
    switch (rnd(8)) {
      case 0: body = body.slice(0, rnd(body.length + 1)); break;
      case 1: { const b = Buffer.from(body); b[rnd(b.length)] = rnd(256); body = b; break; }
      case 2: body = '['.repeat(2000 + rnd(3000)) + ']'.repeat(10); break;
      case 3: body = Buffer.concat([Buffer.from(body.slice(0, -2)), Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}')]); break;
      default: break;
    }
    const r = await post(path, body);
    assert.ok(r.status === 200 || r.status === 400, `${i} ${path}: ${r.status} for ${String(body).slice(0, 200)}`);
    if (r.status === 400) assert.ok(r.json && (r.json.error || r.json.type === 'error'), r.text);
  }
  assert.ok(srv.alive());
  assert.equal((await rawRequest(srv.url, { path: '/health' })).status, 200);
});

test('20 concurrent clients are queued and all answered', T, async () => {
  let maxDepth = 0, polling = true;
  const poller = (async () => {
    while (polling) { maxDepth = Math.max(maxDepth, (await srv.metrics()).tandem_queue_depth); await sleep(50); }
  })();
  const jobs = Array.from({ length: 20 }, (_, i) => {
    const messages = [{ role: 'user', content: `What is ${i} + ${i + 1}?` }];
    if (i % 2) {
      return client.chat.completions.create({ model: 'demo', messages, max_tokens: 12, reasoning_effort: 'none', stream: true })
        .then(async (s) => { let t = ''; for await (const c of s) t += c.choices[0]?.delta?.content || ''; return t; });
    }
    return client.chat.completions.create({ model: 'demo', messages, max_tokens: 12, reasoning_effort: 'none' })
      .then((r) => r.choices[0].message.content);
  });
  const answers = await Promise.all(jobs);
  polling = false;
  await poller;
  assert.equal(answers.length, 20);
  for (const a of answers) assert.ok(typeof a === 'string' && a.length > 0);
  assert.ok(maxDepth >= 2, `requests waited in the queue (max depth ${maxDepth})`);
});

test('RSS does not grow over 200 requests', T, async () => {
  const mix = async (i) => {
    switch (i % 8) {
      case 0: return post('/v1/chat/completions', chat());
      case 1: return post('/v1/chat/completions', chat({ stream: true, stream_options: { include_usage: true } }));
      case 2: return post('/v1/messages', JSON.stringify({ model: 'd', max_tokens: 2, grace_tokens: 0, messages: [{ role: 'user', content: 'What is 12 + 7?' }], stream: i % 16 === 2 }));
      case 3: return post('/v1/completions', JSON.stringify({ prompt: 'The jury said', max_tokens: 2 }));
      case 4: return post('/v1/chat/completions', '{"messages": [');
      case 5: return post('/v1/chat/completions', chat({ temperature: 'x' }));
      case 6: return rawRequest(srv.url, { path: '/v1/models' });
      default: return rawRequest(srv.url, { path: i % 16 === 7 ? '/metrics' : '/' });
    }
  };
  for (let i = 0; i < 48; i++) await mix(i); // warm-up: every path, allocator pools settled
  await waitIdle();
  const rss0 = srv.rssKb();
  for (let i = 0; i < 200; i++) {
    const r = await mix(i);
    assert.ok(r.status === 200 || r.status === 400, `${i}: ${r.status}`);
  }
  await waitIdle();
  const rss1 = srv.rssKb();
  assert.ok(rss1 - rss0 < 2048, `VmRSS grew from ${rss0} kB to ${rss1} kB`);
});
