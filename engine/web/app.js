// tandem web chat: streams answers from POST /v1/chat/completions (SSE over
// fetch + ReadableStream), shows the thinking part folded, and keeps a live
// panel (client-side tok/s, server metrics from GET /metrics).
'use strict';

const $ = (id) => document.getElementById(id);
const chatEl = $('chat');
const inputEl = $('input');
const sendEl = $('send');
const stopEl = $('stop');
const statusEl = $('status');
const keyEl = $('api-key');
const history = [];
let modelId = null;
let controller = null;

keyEl.value = localStorage.getItem('tandem-api-key') || '';
keyEl.addEventListener('change', () => {
  localStorage.setItem('tandem-api-key', keyEl.value);
  loadModel();
});

function headers(json) {
  const h = {};
  if (json) h['Content-Type'] = 'application/json';
  if (keyEl.value) h['Authorization'] = 'Bearer ' + keyEl.value;
  return h;
}

function setStatus(text) { statusEl.textContent = text; }

async function loadModel() {
  try {
    const r = await fetch('/v1/models', { headers: headers(false) });
    const j = await r.json();
    if (!r.ok) throw new Error(j.error ? j.error.message : r.statusText);
    modelId = j.data[0].id;
    $('model').textContent = modelId + (j.data[0].context_length ? ` · ${j.data[0].context_length} ctx` : '');
  } catch (e) {
    $('model').textContent = 'model unavailable: ' + e.message;
  }
}

// Renders text with ``` fences as <pre><code>; everything else as plain text.
function renderText(el, text) {
  el.replaceChildren();
  const parts = text.split(/^```[^\n]*\n?/m);
  parts.forEach((part, i) => {
    if (i % 2 === 1) {
      const pre = document.createElement('pre');
      const code = document.createElement('code');
      code.textContent = part.replace(/\n$/, '');
      pre.appendChild(code);
      el.appendChild(pre);
    } else if (part) {
      const p = document.createElement('div');
      p.className = 'text';
      p.textContent = part;
      el.appendChild(p);
    }
  });
}

function addMessage(role, text) {
  const div = document.createElement('div');
  div.className = 'msg ' + role;
  const who = document.createElement('div');
  who.className = 'who';
  who.textContent = role === 'user' ? 'You' : 'tandem';
  div.appendChild(who);
  const body = document.createElement('div');
  body.className = 'answer';
  renderText(body, text || '');
  div.appendChild(body);
  chatEl.appendChild(div);
  chatEl.scrollTop = chatEl.scrollHeight;
  return div;
}

function addAssistant() {
  const div = addMessage('assistant', '');
  const details = document.createElement('details');
  details.className = 'thinking';
  details.hidden = true;
  const summary = document.createElement('summary');
  summary.textContent = 'Thinking…';
  const pre = document.createElement('div');
  pre.className = 'thinking-text';
  details.append(summary, pre);
  div.insertBefore(details, div.querySelector('.answer'));
  return { div, details, summary, thinkEl: pre, answerEl: div.querySelector('.answer') };
}

// Splits an SSE byte stream into events; calls onData(dataString) per event.
async function readSSE(body, onData) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += decoder.decode(value, { stream: true });
    let idx;
    while ((idx = buf.search(/\r?\n\r?\n/)) >= 0) {
      const raw = buf.slice(0, idx);
      buf = buf.slice(idx).replace(/^\r?\n\r?\n/, '');
      const data = raw.split(/\r?\n/).filter((l) => l.startsWith('data:'))
        .map((l) => l.slice(5).replace(/^ /, '')).join('\n');
      if (data && onData(data) === false) return;
    }
  }
}

async function send(text) {
  history.push({ role: 'user', content: text });
  addMessage('user', text);
  const ui = addAssistant();
  let thinking = '', answer = '', tokens = 0, first = 0, finish = null, usage = null;
  const t0 = performance.now();
  controller = new AbortController();
  sendEl.disabled = true;
  stopEl.disabled = false;
  setStatus('waiting for the server…');
  const maxTokens = parseInt($('max-tokens').value, 10);
  const req = {
    model: modelId || 'tandem',
    messages: history,
    stream: true,
    stream_options: { include_usage: true },
    chat_template_kwargs: { enable_thinking: $('thinking').checked },
  };
  if (maxTokens > 0) req.max_tokens = maxTokens;
  const temperature = parseFloat($('temperature').value);
  if (temperature >= 0 && temperature <= 2) req.temperature = temperature;
  try {
    const r = await fetch('/v1/chat/completions', {
      method: 'POST', headers: headers(true), body: JSON.stringify(req), signal: controller.signal,
    });
    if (!r.ok) {
      let msg = r.statusText;
      try { msg = (await r.json()).error.message; } catch (_) { /* not JSON */ }
      throw new Error(`${r.status}: ${msg}`);
    }
    await readSSE(r.body, (data) => {
      if (data === '[DONE]') return false;
      const j = JSON.parse(data);
      if (j.error) throw new Error(j.error.message);
      if (j.usage) usage = j.usage;
      // the final chunk carries the server's own measurement
      if (j.tandem) $('stat-tps').textContent = j.tandem.tokens_per_second.toFixed(1);
      const c = j.choices && j.choices[0];
      if (!c) return true;
      const d = c.delta || {};
      if (d.reasoning_content || d.content) {
        tokens++;
        if (!first) first = performance.now();
      }
      if (d.reasoning_content) {
        thinking += d.reasoning_content;
        ui.details.hidden = false;
        ui.thinkEl.textContent = thinking;
        setStatus('thinking…');
      }
      if (d.content) {
        answer += d.content;
        ui.div.dataset.deltas = String(Number(ui.div.dataset.deltas || 0) + 1);
        renderText(ui.answerEl, answer);
        setStatus('answering…');
      }
      if (c.finish_reason) finish = c.finish_reason;
      const secs = (performance.now() - first) / 1000;
      if (first && secs > 0.05) $('stat-tps').textContent = (tokens / secs).toFixed(1);
      $('stat-tokens').textContent = String(tokens);
      chatEl.scrollTop = chatEl.scrollHeight;
      return true;
    });
    const secs = ((performance.now() - t0) / 1000).toFixed(1);
    ui.summary.textContent = `Thought (${usage ? usage.completion_tokens_details.reasoning_tokens : '?'} tokens)`;
    if (usage) $('stat-tokens').textContent = `${usage.prompt_tokens} in (${usage.prompt_tokens_details.cached_tokens} cached) · ${usage.completion_tokens} out`;
    setStatus(`done in ${secs} s (${finish || 'stop'})`);
    ui.div.dataset.done = 'true';
    history.push({ role: 'assistant', content: answer });
  } catch (e) {
    const err = document.createElement('div');
    err.className = 'error';
    err.textContent = e.name === 'AbortError' ? 'stopped' : 'error: ' + e.message;
    ui.div.appendChild(err);
    ui.div.dataset.done = 'error';
    setStatus(e.name === 'AbortError' ? 'stopped' : 'error');
    if (answer) history.push({ role: 'assistant', content: answer });
    else history.pop();
  } finally {
    controller = null;
    sendEl.disabled = false;
    stopEl.disabled = true;
    refreshMetrics();
  }
}

// Prometheus text -> { name: value } for the unlabelled samples.
function parseMetrics(text) {
  const out = {};
  for (const line of text.split('\n')) {
    const m = /^([a-z_]+) ([-+0-9.eE]+|NaN)$/.exec(line);
    if (m) out[m[1]] = parseFloat(m[2]);
  }
  return out;
}

async function refreshMetrics() {
  try {
    const r = await fetch('/metrics', { headers: headers(false) });
    if (!r.ok) return;
    const m = parseMetrics(await r.text());
    $('stat-hit').textContent = (100 * (m.tandem_expert_cache_hit_rate || 0)).toFixed(1) + ' %';
    $('stat-queue').textContent = `${m.tandem_queue_depth || 0} waiting, ${m.tandem_requests_running || 0} running`;
    if (m.tandem_last_tokens_per_second) $('stat-server-tps').textContent = m.tandem_last_tokens_per_second.toFixed(1);
  } catch (_) { /* the server may be restarting */ }
}

$('composer').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const text = inputEl.value.trim();
  if (!text || controller) return;
  inputEl.value = '';
  send(text);
});
inputEl.addEventListener('keydown', (ev) => {
  if (ev.key === 'Enter' && !ev.shiftKey) {
    ev.preventDefault();
    $('composer').requestSubmit();
  }
});
stopEl.addEventListener('click', () => { if (controller) controller.abort(); });
$('clear').addEventListener('click', () => {
  if (controller) controller.abort();
  history.length = 0;
  chatEl.replaceChildren();
  setStatus('idle');
});

loadModel();
refreshMetrics();
setInterval(refreshMetrics, 2000);
