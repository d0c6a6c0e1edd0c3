// Starts `$BUILD/tandem serve` on a free port for a test file and stops it.
// BUILD (default "build") is relative to the repository root (TDM_ROOT or ../..).
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
export const root = process.env.TDM_ROOT || path.resolve(here, '../../..');
export const build = path.resolve(root, process.env.BUILD || 'build');

export async function startServer(args = [], { env = {}, timeoutMs = 60000 } = {}) {
  const bin = path.join(build, 'tandem');
  const proc = spawn(bin, ['serve', '--port', '0', ...args], {
    cwd: root,
    env: { OMP_WAIT_POLICY: 'PASSIVE', ...process.env, ...env },
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let log = '';
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log)), timeoutMs);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = /listening on http:\/\/[^\s]*:(\d+)/.exec(log);
      if (m) { clearTimeout(timer); resolve(Number(m[1])); }
    });
    proc.on('exit', (code) => { clearTimeout(timer); reject(new Error(`server exited (${code}):\n${log}`)); });
  });
  proc.stderr.on('data', (d) => { log += d.toString(); if (log.length > 1e6) log = log.slice(-5e5); });
  const url = `http://127.0.0.1:${port}`;
  // wait for /health
  const t0 = Date.now();
  for (;;) {
    try {
      const r = await fetch(url + '/health');
      if (r.ok) break;
    } catch (_) { /* not yet */ }
    if (Date.now() - t0 > timeoutMs) throw new Error('no /health:\n' + log);
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    port,
    proc,
    log: () => log,
    alive: () => proc.exitCode === null && proc.signalCode === null,
    // VmRSS in kB from /proc/PID/status
    rssKb() {
      const s = readFileSync(`/proc/${proc.pid}/status`, 'utf8');
      return Number(/VmRSS:\s+(\d+)/.exec(s)[1]);
    },
    async metrics() {
      const r = await fetch(url + '/metrics', { headers: args.includes('--api-key') ? { authorization: 'Bearer ' + args[args.indexOf('--api-key') + 1] } : {} });
      const out = {};
      for (const line of (await r.text()).split('\n')) {
        const m = /^([a-z_]+(?:\{[^}]*\})?) (\S+)$/.exec(line);
        if (m) out[m[1]] = Number(m[2]);
      }
      return out;
    },
    async stop() {
      if (!this.alive()) return;
      const done = new Promise((r) => proc.on('exit', r));
      proc.kill('SIGTERM');
      const t = setTimeout(() => proc.kill('SIGKILL'), 10000);
      await done;
      clearTimeout(t);
    },
  };
}

// Raw HTTP helper (lets a test set Host/Origin and send arbitrary bytes).
import http from 'node:http';
export function rawRequest(url, { method = 'GET', path: p = '/', headers = {}, body } = {}) {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.request({ host: u.hostname, port: u.port, method, path: p, headers }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let json = null;
        try { json = JSON.parse(text); } catch (_) { /* not JSON */ }
        resolve({ status: res.statusCode, headers: res.headers, text, json });
      });
    });
    req.on('error', reject);
    if (body !== undefined) req.write(body);
    req.end();
  });
}
