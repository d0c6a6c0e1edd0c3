// tandem serve against the official Anthropic SDK: messages (plain and
// streamed events), thinking blocks and budget, stop sequences, errors.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import Anthropic from '@anthropic-ai/sdk';
import { startServer } from './lib/server.js';

let srv, client;
const T = { timeout: 180000 };

before(async () => {
  srv = await startServer();
  client = new Anthropic({ baseURL: srv.url, apiKey: 'unused', maxRetries: 0, timeout: 170000 });
});
after(async () => { await srv.stop(); });

const msg = (content, extra = {}) => client.messages.create({
  model: 'demo', max_tokens: 100, temperature: 0, messages: [{ role: 'user', content }], ...extra,
});

test('message: a text block, end_turn, usage', T, async () => {
  const r = await msg('What is 12 + 7?');
  assert.equal(r.type, 'message');
  assert.equal(r.role, 'assistant');
  assert.match(r.id, /^msg_/);
  assert.equal(r.stop_reason, 'end_turn');
  assert.equal(r.stop_sequence, null);
  assert.equal(r.content.length, 1, 'no thinking unless asked (the API default)');
  assert.equal(r.content[0].type, 'text');
  assert.ok(r.content[0].text.length > 0);
  assert.ok(r.usage.input_tokens > 5);
  assert.ok(r.usage.output_tokens > 0);
});

test('system prompt (string and blocks) and multi-turn', T, async () => {
  const r = await client.messages.create({
    model: 'demo', max_tokens: 60, temperature: 0,
    system: [{ type: 'text', text: 'You answer arithmetic.' }],
    messages: [
      { role: 'user', content: 'What is 12 + 7?' },
      { role: 'assistant', content: [{ type: 'text', text: '12 + 7 = 19.' }] },
      { role: 'user', content: [{ type: 'text', text: 'What is 3 times 4?' }] },
    ],
  });
  assert.equal(r.content[0].type, 'text');
  const s = await msg('What is 12 + 7?', { system: 'You answer arithmetic.' });
  assert.ok(s.content[0].text.length > 0);
});

test('thinking enabled: a thinking block before the text', T, async () => {
  const r = await msg('What is 12 + 7?', { thinking: { type: 'enabled', budget_tokens: 60 } });
  assert.equal(r.content[0].type, 'thinking');
  assert.ok(r.content[0].thinking.length > 0);
  assert.equal(typeof r.content[0].signature, 'string');
  assert.equal(r.content[1].type, 'text');
  assert.match(r.content[1].text, /\d/);
  assert.equal(r.tandem.thinking_forced, false);
});

test('budget_tokens forces the end of thinking', T, async () => {
  const r = await msg('What is 12 + 7?', { thinking: { type: 'enabled', budget_tokens: 2 } });
  assert.equal(r.tandem.thinking_forced, true);
  assert.equal(r.content[0].type, 'thinking');
  assert.equal(r.content[r.content.length - 1].type, 'text');
  assert.ok(r.content[r.content.length - 1].text.length > 0);
});

test('streaming: event order, deltas, final message equals the plain one', T, async () => {
  const params = { thinking: { type: 'enabled', budget_tokens: 60 } };
  const plain = await msg('What is 12 + 7?', params);
  const stream = await msg('What is 12 + 7?', { ...params, stream: true });
  const types = [];
  let thinking = '', text = '', stopReason = null, outTokens = 0;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'content_block_delta' && ev.delta.type === 'thinking_delta') thinking += ev.delta.thinking;
    if (ev.type === 'content_block_delta' && ev.delta.type === 'text_delta') text += ev.delta.text;
    if (ev.type === 'message_delta') { stopReason = ev.delta.stop_reason; outTokens = ev.usage.output_tokens; }
  }
  assert.equal(types[0], 'message_start');
  assert.equal(types[types.length - 1], 'message_stop');
  assert.equal(types[types.length - 2], 'message_delta');
  const blocks = types.filter((t) => t === 'content_block_start').length;
  assert.equal(blocks, 2);
  assert.equal(types.filter((t) => t === 'content_block_stop').length, 2);
  assert.equal(thinking, plain.content[0].thinking);
  assert.equal(text, plain.content[1].text);
  assert.equal(stopReason, 'end_turn');
  assert.equal(outTokens, plain.usage.output_tokens);
  // the SDK's own accumulator agrees
  const final = await client.messages.stream({
    model: 'demo', max_tokens: 100, temperature: 0, messages: [{ role: 'user', content: 'What is 12 + 7?' }], ...params,
  }).finalMessage();
  assert.deepEqual(final.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(final.content[1].text, plain.content[1].text);
});

test('stop_sequences: stop_reason and stop_sequence', T, async () => {
  const full = await msg('What is 12 + 7?');
  assert.match(full.content[0].text, /=/);
  const r = await msg('What is 12 + 7?', { stop_sequences: ['=', 'zzz'] });
  assert.equal(r.stop_reason, 'stop_sequence');
  assert.equal(r.stop_sequence, '=');
  assert.equal(r.content[0].text, full.content[0].text.split('=')[0].trimEnd());
});

test('max_tokens: stop_reason max_tokens', T, async () => {
  const r = await msg('What is 3 times 4?', { max_tokens: 2, grace_tokens: 0 });
  assert.equal(r.stop_reason, 'max_tokens');
  assert.equal(r.usage.output_tokens, 2);
});

test('errors come in the Anthropic shape', T, async () => {
  await assert.rejects(client.messages.create({ model: 'demo', messages: [{ role: 'user', content: 'hi' }] }),
    (e) => e.status === 400 && e.error.type === 'error' && e.error.error.type === 'invalid_request_error' &&
      /max_tokens/.test(e.error.error.message));
  await assert.rejects(msg('hi', { messages: [] }), (e) => e.status === 400 && e.error.error.type === 'invalid_request_error');
  await assert.rejects(msg('hi', { thinking: { type: 'enabled', budget_tokens: 500 } }),
    (e) => e.status === 400 && /budget_tokens/.test(e.error.error.message));
  await assert.rejects(client.messages.create({ model: 'demo', max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }),
    (e) => e.status === 400 && /image/.test(e.error.error.message));
  await assert.rejects(msg('hi', { temperature: 3 }), (e) => e.status === 400 && /temperature/.test(e.error.error.message));
});

test('models list in the Anthropic shape', T, async () => {
  const page = await client.models.list();
  assert.equal(page.data.length, 1);
  assert.equal(page.data[0].type, 'model');
  assert.equal(page.data[0].id, 'demo-Q4_K_M');
  const one = await client.models.retrieve('demo-Q4_K_M');
  assert.equal(one.type, 'model');
  await assert.rejects(client.models.retrieve('other'), (e) => e.status === 404 && e.error.error.type === 'not_found_error');
});

test('count_tokens matches the prompt the message request uses', T, async () => {
  const params = { model: 'demo', system: 'You answer arithmetic.', messages: [{ role: 'user', content: 'What is 12 + 7?' }] };
  const count = await client.messages.countTokens(params);
  const r = await client.messages.create({ ...params, max_tokens: 2 });
  assert.equal(count.input_tokens, r.usage.input_tokens + r.usage.cache_read_input_tokens);
  const withThinking = await client.messages.countTokens({ ...params, thinking: { type: 'enabled', budget_tokens: 100 } });
  assert.ok(withThinking.input_tokens < count.input_tokens, 'no empty think block when thinking is on');
  await assert.rejects(client.messages.countTokens({ model: 'demo', messages: [] }), (e) => e.status === 400);
});
