// The official OpenAI Node SDK against oasis-router on oasis-sim or
// llama-server engines. Run by sdk_test.go (NODE_PATH names the SDK's
// install): every check prints one JSON line {"name","ok","detail"}
// ("skipped": true for the checks OASIS_SKIP names, which do not apply to
// the engine); the Go test makes each a subtest.
'use strict';
const OpenAI = require('openai');

const base = process.env.OASIS_ROUTER_URL + '/v1';
const model = process.env.OASIS_MODEL;
const adapter = process.env.OASIS_ADAPTER;
const loadable = process.env.OASIS_LOADABLE;
const origin = process.env.OASIS_CORS_ORIGIN;
const skip = new Set(JSON.parse(process.env.OASIS_SKIP || '[]')); // check names
// A max_tokens the engine refuses (llama-server takes 0), and the metric
// (a line prefix) of the requests an engine is running.
const badMaxTokens = Number(process.env.OASIS_BAD_MAX_TOKENS || '0');
const runningMetric = process.env.OASIS_RUNNING_METRIC || 'vllm:num_requests_running{';

function report(name, ok, detail, skipped) {
  process.stdout.write(JSON.stringify({ name, ok: !!ok, detail: String(detail ?? ''), skipped: !!skipped }) + '\n');
}

async function check(name, fn) {
  if (skip.has(name)) {
    report(name, true, '', true);
    return;
  }
  try {
    const detail = await fn();
    report(name, true, detail);
  } catch (e) {
    report(name, false, (e && e.stack) || e);
  }
}

function assert(cond, msg) {
  if (!cond) throw new Error('assertion failed: ' + msg);
}

// countingFetch counts the HTTP requests the SDK makes (its retries included).
function countingFetch() {
  const f = async (...args) => { f.calls++; return fetch(...args); };
  f.calls = 0;
  return f;
}

const client = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 0, timeout: 30000 });

async function main() {
  await check('models list', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m);
    const base = ids.find((m) => m.id === model);
    const lora = ids.find((m) => m.id === adapter);
    assert(base && base.object === 'model', 'base model listed: ' + JSON.stringify(ids));
    assert(!adapter || (lora && lora.parent === model), 'adapter listed with parent: ' + JSON.stringify(lora));
    return ids.map((m) => m.id).join(',');
  });

  await check('models retrieve', async () => {
    const m = await client.models.retrieve(model);
    assert(m.id === model && m.max_model_len > 0, JSON.stringify(m));
  });

  await check('chat completion', async () => {
    const r = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hello' }], max_tokens: 8 });
    assert(r.object === 'chat.completion' && r.choices[0].message.content.length > 0, JSON.stringify(r));
    assert(r.usage && r.usage.completion_tokens > 0, 'usage: ' + JSON.stringify(r.usage));
  });

  await check('completion', async () => {
    const r = await client.completions.create({ model, prompt: 'once upon', max_tokens: 5 });
    assert(r.object === 'text_completion' && r.choices[0].text.length > 0, JSON.stringify(r));
  });

  await check('chat stream without usage', async () => {
    const s = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 6, stream: true });
    let text = '', usage = 0;
    for await (const c of s) {
      if (c.usage) usage++;
      if (c.choices.length) text += c.choices[0].delta.content || '';
    }
    assert(text.length > 0, 'no text');
    assert(usage === 0, 'a usage chunk reached a client that did not ask for it');
  });

  await check('chat stream with usage', async () => {
    const s = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'hi' }], max_tokens: 6,
      stream: true, stream_options: { include_usage: true } });
    let last;
    for await (const c of s) last = c;
    assert(last && last.choices.length === 0 && last.usage.completion_tokens > 0, 'last chunk: ' + JSON.stringify(last));
  });

  await check('responses create, retrieve, previous_response_id, cancel', async () => {
    const r = await client.responses.create({ model, input: 'tell me a story', max_output_tokens: 8 });
    assert(r.object === 'response' && r.status && r.output_text.length > 0, JSON.stringify(r));
    const got = await client.responses.retrieve(r.id);
    assert(got.id === r.id && got.output_text === r.output_text, 'retrieved: ' + JSON.stringify(got));
    const next = await client.responses.create({ model, input: 'and then?', previous_response_id: r.id, max_output_tokens: 4 });
    assert(next.previous_response_id === r.id, JSON.stringify(next));
    assert(next.usage.input_tokens > r.usage.input_tokens + r.usage.output_tokens, 'the conversation was not continued on the engine holding it');
    try {
      await client.responses.cancel(r.id);
      throw new Error('cancel of a finished response succeeded');
    } catch (e) {
      assert(e instanceof OpenAI.BadRequestError, 'cancel: ' + e);
    }
    return r.id;
  });

  await check('responses create, stateless', async () => {
    const r = await client.responses.create({ model, input: 'hello there', max_output_tokens: 6, store: false });
    assert(r.object === 'response' && r.output_text.length > 0, JSON.stringify(r));
    assert(r.usage && r.usage.output_tokens > 0, 'usage: ' + JSON.stringify(r.usage));
  });

  await check('responses stream', async () => {
    const s = await client.responses.create({ model, input: 'stream', max_output_tokens: 6, stream: true });
    let text = '', done;
    for await (const ev of s) {
      if (ev.type === 'response.output_text.delta') text += ev.delta;
      if (ev.type === 'response.completed') done = ev.response;
    }
    assert(done && text === done.output[0].content[0].text && text.length > 0, 'deltas ' + JSON.stringify(text));
    if (process.env.OASIS_RESPONSES_STATELESS) return 'not stored: the engine keeps no responses';
    const got = await client.responses.retrieve(done.id);
    assert(got.id === done.id, 'stored');
  });

  await check('unknown response id is NotFoundError', async () => {
    try {
      await client.responses.retrieve('resp_forged');
      throw new Error('no error');
    } catch (e) {
      assert(e instanceof OpenAI.NotFoundError && e.code === 'response_not_found', String(e));
    }
  });

  await check('unknown model is NotFoundError with OpenAI fields', async () => {
    try {
      await client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: 'x' }] });
      throw new Error('no error');
    } catch (e) {
      assert(e instanceof OpenAI.NotFoundError, String(e));
      assert(e.code === 'model_not_found' && e.param === 'model' && e.type === 'invalid_request_error', JSON.stringify(e.error));
      assert(e.requestID || e.headers.get('x-request-id'), 'request id');
    }
  });

  await check('engine error keeps its status and message', async () => {
    try {
      await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'x' }], max_tokens: badMaxTokens });
      throw new Error('no error');
    } catch (e) {
      assert(e instanceof OpenAI.BadRequestError && /max_tokens/.test(e.message), String(e));
    }
  });

  await check('retries honour 503 and Retry-After', async () => {
    const f = countingFetch();
    const c = new OpenAI({ baseURL: base, apiKey: 'unused', maxRetries: 2, fetch: f });
    const t0 = Date.now();
    try {
      await c.chat.completions.create({ model: process.env.OASIS_DOWN_MODEL, messages: [{ role: 'user', content: 'x' }] });
      throw new Error('no error');
    } catch (e) {
      assert(e instanceof OpenAI.InternalServerError && e.status === 503, String(e));
      assert(e.code === 'no_healthy_worker', 'code ' + e.code);
    }
    assert(f.calls === 3, 'requests made: ' + f.calls);
    assert(Date.now() - t0 >= 1800, 'Retry-After: 1 not waited: ' + (Date.now() - t0) + ' ms');
    return f.calls + ' requests';
  });

  await check('abort mid-stream reaches the engine', async () => {
    const ac = new AbortController();
    const s = await client.chat.completions.create({ model, messages: [{ role: 'user', content: 'a long one' }],
      max_tokens: 2000, stream: true, seed: 1 }, { signal: ac.signal });
    let n = 0, finished = false;
    try {
      for await (const c of s) {
        if (c.choices.length && c.choices[0].finish_reason) finished = true;
        if (++n === 2) ac.abort();
      }
    } catch (e) {
      // The SDK ends the iteration quietly on abort; a throw must be the abort's.
      assert(e instanceof OpenAI.APIUserAbortError || e.name === 'AbortError', String(e));
    }
    assert(!finished && n < 50, 'the stream ran on after abort: ' + n + ' chunks');
    // The router cancels the engine's request: no engine runs one afterwards.
    const deadline = Date.now() + 10000;
    for (;;) {
      let running = 0;
      for (const e of process.env.OASIS_ENGINES.split(',')) {
        const m = await (await fetch('http://' + e + '/metrics')).text();
        for (const line of m.split('\n')) {
          if (line.startsWith(runningMetric)) running += Number(line.split(' ').pop());
        }
      }
      if (running === 0) break;
      assert(Date.now() < deadline, running + ' requests still running on the engines 10 s after the abort');
      await new Promise((r) => setTimeout(r, 50));
    }
    return n + ' chunks before the abort';
  });

  await check('adapter by name', async () => {
    const r = await client.chat.completions.create({ model: adapter, messages: [{ role: 'user', content: 'select' }], max_tokens: 4 });
    // llama-server answers with its own model name (-a), not the adapter's.
    const answered = process.env.OASIS_ADAPTER_ANSWER_MODEL || adapter;
    assert(r.model === answered && r.choices[0].message.content.length > 0, JSON.stringify(r));
  });

  await check('adapter loaded on demand', async () => {
    const rs = await Promise.all([1, 2, 3].map(() =>
      client.chat.completions.create({ model: loadable, messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 })));
    for (const r of rs) assert(r.model === loadable && r.choices[0].message.content.length > 0, JSON.stringify(r));
    const m = await client.models.retrieve(loadable);
    assert(m.parent === model, 'listed with parent: ' + JSON.stringify(m));
  });

  await check('CORS preflight', async () => {
    // What a browser asks before the SDK's POST (dangerouslyAllowBrowser): the SDK's own headers.
    const asked = ['authorization', 'content-type', 'x-stainless-arch', 'x-stainless-lang', 'x-stainless-os',
      'x-stainless-package-version', 'x-stainless-retry-count', 'x-stainless-runtime', 'x-stainless-runtime-version',
      'x-stainless-timeout'];
    const r = await fetch(base + '/chat/completions', { method: 'OPTIONS', headers: { Origin: origin,
      'Access-Control-Request-Method': 'POST', 'Access-Control-Request-Headers': asked.join(', ') } });
    assert(r.status === 204, 'status ' + r.status);
    assert(r.headers.get('access-control-allow-origin') === origin, 'allow-origin ' + r.headers.get('access-control-allow-origin'));
    assert(/POST/.test(r.headers.get('access-control-allow-methods') || ''), 'methods');
    const h = (r.headers.get('access-control-allow-headers') || '').toLowerCase();
    const allowed = h.split(',').map((x) => x.trim());
    for (const a of asked) assert(allowed.includes(a), 'header ' + a + ' not allowed: ' + h);
  });
}

main().then(() => process.exit(0), (e) => { report('script', false, e && e.stack); process.exit(1); });
