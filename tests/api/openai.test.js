// tandem serve against the official OpenAI SDK: chat (plain + streamed),
// completions, models, stop, max_tokens + grace, seeds, thinking control and
// budget, fence repair, prefix reuse across turns.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { startServer } from './lib/server.js';

let srv, client;
const T = { timeout: 180000 };
const fences = (s) => (s.match(/^ {0,3}```/gm) || []).length;

before(async () => {
  srv = await startServer();
  client = new OpenAI({ baseURL: srv.url + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 170000 });
});
after(async () => { await srv.stop(); });

const ask = (content, extra = {}) => client.chat.completions.create({
  model: 'demo', messages: [{ role: 'user', content }], temperature: 0, ...extra,
});

test('models list names the served model', T, async () => {
  const page = await client.models.list();
  assert.equal(page.data.length, 1);
  assert.equal(page.data[0].id, 'demo-Q4_K_M');
  assert.equal(page.data[0].object, 'model');
  const one = await client.models.retrieve('demo-Q4_K_M');
  assert.equal(one.id, 'demo-Q4_K_M');
  await assert.rejects(client.models.retrieve('nope'), (e) => e.status === 404);
});

test('chat completion: answer, thinking, usage', T, async () => {
  const r = await ask('What is 12 + 7?', { max_tokens: 100 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  const c = r.choices[0];
  assert.equal(c.message.role, 'assistant');
  assert.equal(c.finish_reason, 'stop');
  assert.match(c.message.content, /\d/, 'an arithmetic answer');
  assert.ok(c.message.reasoning_content.length > 0, 'the demo thinks by default');
  assert.ok(!c.message.content.includes('<think>') && !c.message.content.includes('</think>'));
  const u = r.usage;
  assert.ok(u.prompt_tokens > 5);
  assert.ok(u.completion_tokens > u.completion_tokens_details.reasoning_tokens);
  assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);
});

test('streaming chat equals the plain answer and ends with a usage chunk', T, async () => {
  const plain = await ask('What is 12 + 7?', { max_tokens: 100 });
  const stream = await ask('What is 12 + 7?', { max_tokens: 100, stream: true, stream_options: { include_usage: true } });
  let content = '', reasoning = '', role = null, finish = null, usage = null, n = 0, afterUsage = 0;
  for await (const chunk of stream) {
    n++;
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (usage) afterUsage++;
    if (chunk.usage) usage = chunk.usage;
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.role) role = c.delta.role;
    content += c.delta.content || '';
    reasoning += c.delta.reasoning_content || '';
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.ok(n > 5, 'several chunks');
  assert.equal(role, 'assistant');
  assert.equal(finish, 'stop');
  assert.equal(content, plain.choices[0].message.content);
  assert.equal(reasoning, plain.choices[0].message.reasoning_content);
  assert.ok(usage && usage.completion_tokens === plain.usage.completion_tokens);
  assert.equal(afterUsage, 0, 'usage is the last chunk');
});

test('completions: plain and streamed, max_tokens counts exactly', T, async () => {
  const r = await client.completions.create({ model: 'demo', prompt: 'The jury said', max_tokens: 12, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 12);
  assert.ok(r.choices[0].text.length > 10);
  const s = await client.completions.create({ model: 'demo', prompt: 'The jury said', max_tokens: 12, temperature: 0, stream: true });
  let text = '';
  for await (const ch of s) text += ch.choices[0]?.text || '';
  assert.equal(text, r.choices[0].text);
});

test('stop strings end the answer before the match', T, async () => {
  const full = await ask('What is 12 + 7?', { max_tokens: 60, reasoning_effort: 'none' });
  assert.match(full.choices[0].message.content, /=/);
  const r = await ask('What is 12 + 7?', { max_tokens: 60, reasoning_effort: 'none', stop: ['='] });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].message.content, full.choices[0].message.content.split('=')[0].trimEnd());
  const s = await ask('What is 12 + 7?', { max_tokens: 60, reasoning_effort: 'none', stop: 'never-there' });
  assert.equal(s.choices[0].message.content, full.choices[0].message.content);
});

test('max_tokens: exact without grace, grace finishes the sentence', T, async () => {
  const cut = await ask('What is 3 times 4?', { max_tokens: 3, reasoning_effort: 'none', grace_tokens: 0 });
  assert.equal(cut.usage.completion_tokens, 3);
  assert.equal(cut.choices[0].finish_reason, 'length');
  assert.doesNotMatch(cut.choices[0].message.content, /[.!?]$/);
  const graced = await ask('What is 3 times 4?', { max_tokens: 3, reasoning_effort: 'none' });
  assert.equal(graced.choices[0].finish_reason, 'length');
  assert.ok(graced.usage.completion_tokens > 3 && graced.usage.completion_tokens <= 3 + 64);
  assert.match(graced.choices[0].message.content, /[.!?]$/);
  assert.ok(graced.choices[0].message.content.startsWith(cut.choices[0].message.content));
  const c2 = await ask('What is 3 times 4?', { max_completion_tokens: 2, reasoning_effort: 'none', grace_tokens: 0 });
  assert.equal(c2.usage.completion_tokens, 2);
});

test('same seed and temperature > 0 give the same text; other seeds differ', T, async () => {
  const gen = (seed) => client.completions.create({ model: 'demo', prompt: 'In the morning the', max_tokens: 16, temperature: 1.0, top_p: 1, top_k: 0, min_p: 0, seed })
    .then((r) => r.choices[0].text);
  const a = await gen(1234), b = await gen(1234);
  assert.equal(a, b);
  const others = new Set([a, await gen(1), await gen(2), await gen(3)]);
  assert.ok(others.size >= 3, 'different seeds sample different text: ' + [...others].join(' | '));
  const chatA = await ask('Tell me a story.', { temperature: 0.9, seed: 99, max_tokens: 30 });
  const chatB = await ask('Tell me a story.', { temperature: 0.9, seed: 99, max_tokens: 30 });
  assert.equal(chatA.choices[0].message.content, chatB.choices[0].message.content);
  assert.equal(chatA.choices[0].message.reasoning_content, chatB.choices[0].message.reasoning_content);
});

test('thinking off: reasoning_effort none and enable_thinking false', T, async () => {
  const a = await ask('What is 12 + 7?', { max_tokens: 60, reasoning_effort: 'none' });
  assert.equal(a.choices[0].message.reasoning_content, undefined);
  assert.equal(a.usage.completion_tokens_details.reasoning_tokens, 0);
  const b = await ask('What is 12 + 7?', { max_tokens: 60, chat_template_kwargs: { enable_thinking: false } });
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
});

test('a thinking budget forces </think> and the answer follows', T, async () => {
  const free = await ask('What is 12 + 7?', { max_tokens: 100 });
  const freeThinking = free.usage.completion_tokens_details.reasoning_tokens;
  assert.ok(freeThinking > 4);
  const r = await ask('What is 12 + 7?', { max_tokens: 100, max_thinking_tokens: 3 });
  assert.equal(r.tandem.thinking_forced, true);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens <= 5, JSON.stringify(r.usage));
  assert.ok(r.choices[0].message.reasoning_content.length < free.choices[0].message.reasoning_content.length);
  assert.ok(r.choices[0].message.content.length > 0, 'the answer begins after the forced </think>');
  const alt = await ask('What is 12 + 7?', { max_tokens: 100, reasoning: { max_tokens: 3 } });
  assert.equal(alt.tandem.thinking_forced, true);
  assert.equal(alt.choices[0].message.reasoning_content, r.choices[0].message.reasoning_content);
  const low = await ask('What is 12 + 7?', { max_tokens: 100, reasoning_effort: 'low' });
  assert.equal(low.tandem.thinking_forced, false, 'a large budget is not reached');
});

test('an unclosed code fence is closed (plain and streamed)', T, async () => {
  const q = 'List the numbers from 1 to 40 in a code block.';
  const r = await ask(q, { max_tokens: 12, reasoning_effort: 'none' });
  const text = r.choices[0].message.content;
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.match(text, /^```/);
  assert.match(text, /\n```$/);
  assert.equal(fences(text) % 2, 0);
  assert.equal(r.tandem.fence_closed, true);
  const s = await ask(q, { max_tokens: 12, reasoning_effort: 'none', stream: true });
  const deltas = [];
  for await (const ch of s) if (ch.choices[0]?.delta?.content) deltas.push(ch.choices[0].delta.content);
  assert.equal(deltas.join(''), text);
  assert.match(deltas[deltas.length - 1], /^\n?```$/, 'the closing fence is the last delta');
  const whole = await ask(q, { max_tokens: 200, reasoning_effort: 'none' });
  assert.equal(whole.tandem.fence_closed, false, 'a complete block is left alone');
  assert.equal(fences(whole.choices[0].message.content) % 2, 0);
});

test('a follow-up turn reuses the conversation prefix', T, async () => {
  const messages = [{ role: 'user', content: 'What is 12 + 7?' }];
  const opts = { model: 'demo', temperature: 0, max_tokens: 60, reasoning_effort: 'none' };
  const first = await client.chat.completions.create({ ...opts, messages });
  // the same prompt again: everything before its generation header is reused
  const again = await client.chat.completions.create({ ...opts, messages });
  const turn = again.usage.prompt_tokens_details.cached_tokens;
  assert.ok(turn >= 10 && turn < first.usage.prompt_tokens, `cached ${turn} of ${first.usage.prompt_tokens}`);
  messages.push({ role: 'assistant', content: first.choices[0].message.content });
  messages.push({ role: 'user', content: 'What is 3 times 4?' });
  const second = await client.chat.completions.create({ ...opts, messages });
  const cached = second.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached >= turn, `the follow-up reuses the first turn: cached ${cached} of ${second.usage.prompt_tokens}`);
  assert.ok(cached < second.usage.prompt_tokens);
});

test('system and developer messages and content parts are accepted', T, async () => {
  const r = await client.chat.completions.create({
    model: 'demo', temperature: 0, max_tokens: 40, reasoning_effort: 'none',
    messages: [
      { role: 'system', content: 'You answer arithmetic.' },
      { role: 'developer', content: [{ type: 'text', text: 'Be brief.' }] },
      { role: 'user', content: [{ type: 'text', text: 'What is 12 + 7?' }] },
    ],
  });
  assert.ok(r.choices[0].message.content.length > 0);
});
