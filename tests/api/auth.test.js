// API key (Bearer and x-api-key, both SDKs) and the DNS-rebinding guard
// (Host / Origin checks, --allow-host).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, rawRequest } from './lib/server.js';

let srv;
const KEY = 'sk-test-7f3a9c';
const T = { timeout: 120000 };

before(async () => { srv = await startServer(['--api-key', KEY, '--allow-host', 'chat.example.lan']); });
after(async () => { await srv.stop(); });

const chatBody = JSON.stringify({ messages: [{ role: 'user', content: 'What is 12 + 7?' }], max_tokens: 2, grace_tokens: 0 });

test('OpenAI SDK: the right key is accepted, a wrong one is 401', T, async () => {
  const ok = new OpenAI({ baseURL: srv.url + '/v1', apiKey: KEY, maxRetries: 0 });
  const r = await ok.chat.completions.create({ model: 'demo', messages: [{ role: 'user', content: 'What is 12 + 7?' }], max_tokens: 3 });
  assert.equal(r.object, 'chat.completion');
  assert.equal((await ok.models.list()).data.length, 1);
  const bad = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'sk-wrong', maxRetries: 0 });
  await assert.rejects(bad.chat.completions.create({ model: 'demo', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e instanceof OpenAI.AuthenticationError && e.status === 401 && e.code === 'invalid_api_key');
  await assert.rejects(bad.models.list(), (e) => e.status === 401);
});

test('Anthropic SDK (x-api-key): accepted and rejected', T, async () => {
  const ok = new Anthropic({ baseURL: srv.url, apiKey: KEY, maxRetries: 0 });
  const r = await ok.messages.create({ model: 'demo', max_tokens: 3, messages: [{ role: 'user', content: 'What is 12 + 7?' }] });
  assert.equal(r.type, 'message');
  const bad = new Anthropic({ baseURL: srv.url, apiKey: 'nope', maxRetries: 0 });
  await assert.rejects(bad.messages.create({ model: 'demo', max_tokens: 3, messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e instanceof Anthropic.AuthenticationError && e.status === 401 && e.error.error.type === 'authentication_error');
});

test('raw: no key, Bearer, x-api-key; /health and the page need none', T, async () => {
  const post = (headers) => rawRequest(srv.url, { method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json', ...headers }, body: chatBody });
  const none = await post({});
  assert.equal(none.status, 401);
  assert.deepEqual(Object.keys(none.json.error).sort(), ['code', 'message', 'param', 'type']);
  assert.equal((await post({ authorization: 'Bearer ' + KEY })).status, 200);
  assert.equal((await post({ authorization: 'bearer ' + KEY })).status, 200);
  assert.equal((await post({ 'x-api-key': KEY })).status, 200);
  assert.equal((await post({ authorization: 'Bearer ' + KEY + 'x' })).status, 401);
  assert.equal((await post({ authorization: KEY })).status, 401);
  assert.equal((await rawRequest(srv.url, { path: '/health' })).status, 200);
  assert.equal((await rawRequest(srv.url, { path: '/' })).status, 200);
  assert.equal((await rawRequest(srv.url, { path: '/metrics' })).status, 401);
  assert.equal((await rawRequest(srv.url, { path: '/metrics', headers: { authorization: 'Bearer ' + KEY } })).status, 200);
});

test('Host and Origin: loopback, IP literals and allowed names pass, others are 403', T, async () => {
  const get = (headers) => rawRequest(srv.url, { path: '/v1/models', headers: { authorization: 'Bearer ' + KEY, ...headers } });
  for (const host of [`localhost:${srv.port}`, `127.0.0.1:${srv.port}`, `[::1]:${srv.port}`, 'localhost', 'chat.example.lan:8080', '192.168.1.20:8080'])
    assert.equal((await get({ host })).status, 200, host);
  for (const host of ['evil.example', `attacker.com:${srv.port}`, 'localhost.evil.example'])
    assert.equal((await get({ host })).status, 403, host);
  assert.equal((await get({ origin: `http://localhost:${srv.port}` })).status, 200);
  assert.equal((await get({ origin: 'http://chat.example.lan' })).status, 200);
  const bad = await get({ origin: 'http://evil.example' });
  assert.equal(bad.status, 403);
  assert.equal(bad.json.error.type, 'permission_error');
  assert.equal((await get({ origin: 'null' })).status, 403);
  // the guard also covers the page and the generation endpoints (a rebinding attack needs no key)
  assert.equal((await rawRequest(srv.url, { path: '/', headers: { host: 'evil.example' } })).status, 403);
  const post = await rawRequest(srv.url, { method: 'POST', path: '/v1/messages', headers: { host: 'evil.example', 'x-api-key': KEY, 'content-type': 'application/json' }, body: '{}' });
  assert.equal(post.status, 403);
  assert.equal(post.json.type, 'error');
  assert.equal(post.json.error.type, 'permission_error');
});
