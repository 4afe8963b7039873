// Headless-browser test of onebit's chat page (crates/server/assets/index.html), against a
// running `onebit serve`. Run by scripts/test-webui.sh:
//   node test.mjs --url http://127.0.0.1:PORT --chrome /usr/bin/chromium-headless-shell [--api-key KEY]
// Without --api-key: streaming, the speed line, an error answer, Stop, Markdown, localStorage
// across a reload, new and deleted conversations. With --api-key (a server started with it):
// the page asks for the key, refuses a wrong one, and works with the right one.
import puppeteer from 'puppeteer-core';

const opts = {};
for (let i = 2; i < process.argv.length; i += 2) opts[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
if (!opts.url || !opts.chrome) {
  console.error('usage: node test.mjs --url URL --chrome PATH [--api-key KEY]');
  process.exit(2);
}
const BASE = opts.url.replace(/\/$/, '');
const LIMIT_S = Number(process.env.WEBUI_TEST_LIMIT_S || 150);
const SPEED = /^prompt: \d+ tok, \d+\.\d tok\/s · generation: (\d+) tok, \d+\.\d tok\/s/;

let passed = 0;
let failed = 0;
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
function check(cond, message) {
  if (!cond) throw new Error(message);
}

// One step of the scenario; the steps build on each other, so the first failure ends the run.
async function step(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    passed++;
    console.log(`ok ${passed + failed} - ${name} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  } catch (e) {
    failed++;
    console.log(`not ok ${passed + failed} - ${name}: ${e.message}`);
    throw e;
  }
}

const browser = await puppeteer.launch({
  executablePath: opts.chrome,
  headless: /headless[-_]shell/.test(opts.chrome) ? 'shell' : true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--disable-quic', '--disable-background-networking'],
});
const watchdog = setTimeout(() => {
  console.log(`not ok - the test took longer than ${LIMIT_S} s`);
  console.log(`webui: ${passed} passed, ${failed + 1} failed`);
  browser.process()?.kill('SIGKILL');
  process.exit(1);
}, LIMIT_S * 1000);

const page = await browser.newPage();
await page.setViewport({ width: 1100, height: 800 });
const pageErrors = [];
const foreign = [];
const chatBodies = [];
page.on('pageerror', (e) => pageErrors.push(e.message));
page.on('console', (m) => {
  // The browser logs every 4xx it is given; the steps that expect one check it themselves.
  if (m.type() === 'error' && !m.text().startsWith('Failed to load resource')) console.log(`  [page console] ${m.text()}`);
});
const isChat = (r) => r.method() === 'POST' && r.url().endsWith('/v1/chat/completions');
page.on('request', (r) => {
  const url = r.url();
  if (!url.startsWith(BASE + '/') && !/^(data|about|blob):/.test(url)) foreign.push(url);
  if (isChat(r)) chatBodies.push(JSON.parse(r.postData()));
});

// Run `body` with the page's chat completion requests handed to `handle` (which answers or
// continues each one) and every other request let through; the page is left as it was.
async function withChatRequests(handle, body) {
  const route = (r) => (isChat(r) ? handle(r) : r.continue());
  await page.setRequestInterception(true);
  page.on('request', route);
  try {
    await body();
  } finally {
    page.off('request', route);
    await page.setRequestInterception(false);
  }
}

// ---------- helpers, each reading the page as a person would see it ----------

const state = () => page.$eval('body', (b) => b.dataset.state);
const visible = (sel) => page.$eval(sel, (e) => !e.hidden && e.offsetParent !== null).catch(() => false);
const lastAnswer = () => page.evaluate(() => {
  const all = document.querySelectorAll('.message.assistant');
  const el = all[all.length - 1];
  if (!el) return null;
  return {
    text: el.querySelector('.content').textContent,
    speed: el.querySelector('.speed')?.textContent ?? null,
    error: el.querySelector('.error')?.textContent ?? null,
    stopped: !!el.querySelector('.stopped'),
  };
});

async function setField(sel, value) {
  // Select all and type over it, as a person would (so the page sees input events).
  await page.focus(sel);
  await page.keyboard.down('Control');
  await page.keyboard.press('KeyA');
  await page.keyboard.up('Control');
  await page.keyboard.press('Backspace');
  if (value !== '') await page.type(sel, String(value));
  check((await page.$eval(sel, (e) => e.value)) === String(value), `${sel} did not take the value ${value}`);
}

async function openSettings() {
  if (!(await visible('#settings'))) await page.click('#settings-toggle');
  check(await visible('#settings'), 'the settings panel did not open');
}

// Records the last answer's length at every change of the page, with whether it was streaming.
async function watchAnswer() {
  await page.evaluate(() => {
    window.__seen = [];
    window.__observer?.disconnect();
    window.__observer = new MutationObserver(() => {
      const all = document.querySelectorAll('.message.assistant .content');
      const last = all[all.length - 1];
      if (last) window.__seen.push({ len: last.textContent.length, busy: document.body.dataset.state === 'busy' });
    });
    window.__observer.observe(document.querySelector('#messages'), { subtree: true, childList: true, characterData: true });
  });
}

// Types a message and presses Enter; returns once it shows in the conversation.
async function sendMessage(text) {
  const before = await page.$$eval('.message.user', (m) => m.length);
  await page.click('#input');
  await page.type('#input', text);
  await page.keyboard.press('Enter');
  await page.waitForFunction((n) => document.querySelectorAll('.message.user').length > n, { timeout: 5000 }, before);
  check((await page.$eval('#input', (e) => e.value)) === '', 'the input was not cleared after sending');
}

// Waits for the answer to finish; returns it.
async function waitAnswer(timeout = 60000) {
  await page.waitForFunction(() => document.body.dataset.state === 'idle', { timeout });
  return lastAnswer();
}

async function ready() {
  await page.waitForFunction(() => !['connecting…', 'loading the model…', ''].includes(document.querySelector('#model').textContent), { timeout: 15000 });
}

// ---------- the scenarios ----------

async function mainScenario() {
  let stoppedText = '';
  let messagesBefore = 0;

  await step('the page loads and names the model', async () => {
    const res = await page.goto(BASE + '/', { waitUntil: 'load' });
    check(res.ok(), `GET / answered ${res.status()}`);
    await ready();
    const props = await (await fetch(BASE + '/props')).json();
    const model = await page.$eval('#model', (e) => e.textContent);
    check(model === props.model_alias, `the header shows "${model}", not the model's name "${props.model_alias}"`);
    check(!(await visible('#auth')), 'the API-key field is shown although the server needs no key');
    check(await visible('#send') && !(await visible('#stop')), 'Send should show and Stop hide while idle');
  });

  await step('Markdown is rendered safely; <think> is folded', async () => {
    const r = await page.evaluate(() => {
      const md = window.onebit.markdown;
      const host = document.createElement('div');
      host.innerHTML = md('# Title\n\nSome **bold**, *it*, `a<b>` and [x](javascript:alert(1)) [ok](https://example.com)\n\n- one\n- two\n\n1. first\n2. second\n\n```js\nif (a < b) { x(); }\n```\n<img src=x onerror=alert(1)><script>alert(2)</script>');
      const think = document.createElement('div');
      think.innerHTML = window.onebit.renderAnswer('<think>hmm, let me see</think>The answer is 4.');
      return {
        h1: host.querySelector('h1')?.textContent, strong: host.querySelector('strong')?.textContent,
        em: host.querySelector('em')?.textContent, code: host.querySelector('p code')?.textContent,
        links: [...host.querySelectorAll('a')].map((a) => a.getAttribute('href')),
        ul: host.querySelectorAll('ul li').length, ol: host.querySelectorAll('ol li').length,
        pre: host.querySelector('pre code')?.textContent, lang: host.querySelector('pre code')?.className,
        unsafe: host.querySelectorAll('img, script, [onerror]').length,
        details: think.querySelector('details.think') ? { open: think.querySelector('details').open, text: think.querySelector('details').textContent } : null,
        after: think.querySelector(':scope > p')?.textContent,
      };
    });
    check(r.h1 === 'Title' && r.strong === 'bold' && r.em === 'it' && r.code === 'a<b>', `inline markup wrong: ${JSON.stringify(r)}`);
    check(r.links.length === 1 && r.links[0] === 'https://example.com', `links wrong (javascript: must not link): ${r.links}`);
    check(r.ul === 2 && r.ol === 2, `lists wrong: ${r.ul} and ${r.ol} items`);
    check(r.pre === 'if (a < b) { x(); }' && r.lang === 'language-js', `code block wrong: ${r.pre} ${r.lang}`);
    check(r.unsafe === 0, 'raw HTML from the model became elements');
    check(r.details && !r.details.open && r.details.text.includes('hmm, let me see'), `thinking not folded: ${JSON.stringify(r.details)}`);
    check(r.after === 'The answer is 4.', `text after </think> wrong: ${r.after}`);
  });

  await step('an answer streams in, finishes, and shows its speed', async () => {
    await openSettings();
    await setField('#max_tokens', 32);
    await watchAnswer();
    await sendMessage('Write three sentences about the sea.');
    const a = await waitAnswer();
    const seen = await page.evaluate(() => window.__seen);
    const growing = [...new Set(seen.filter((s) => s.busy && s.len > 0).map((s) => s.len))];
    check(growing.length >= 2, `the answer did not grow while streaming (lengths seen while busy: ${growing.join(', ') || 'none'})`);
    check(a.text.trim().length > 0 && a.text.length >= Math.max(...growing), `the final answer is shorter than what streamed: "${a.text}"`);
    check(a.error === null, `the answer shows an error: ${a.error}`);
    check(a.speed && SPEED.test(a.speed), `no speed line in the right form under the answer: ${a.speed}`);
    const n = Number(a.speed.match(SPEED)[1]);
    check(n > 0 && n <= 32, `the speed line says ${n} generated tokens, max_tokens was 32`);
    const body = chatBodies.at(-1);
    check(body.stream === true && body.max_tokens === 32, `the request did not carry stream and max_tokens: ${JSON.stringify(body)}`);
    check(body.messages.at(-1).content === 'Write three sentences about the sea.', 'the request did not carry the message');
    console.log(`  answer (${growing.length} updates): ${JSON.stringify(a.text.slice(0, 100))}… | ${a.speed}`);
  });

  await step('an error answer is shown in the conversation', async () => {
    await setField('#temperature', 50);
    await sendMessage('Hello?');
    const a = await waitAnswer(10000);
    check(a.error && /temperature/.test(a.error), `no error about the temperature shown: ${JSON.stringify(a)}`);
    await setField('#temperature', '');
  });

  await step('an error in the middle of a stream is shown with what came before it', async () => {
    // A canned stream in the server's shapes: a role chunk, some text, then llama-server's error event.
    const chunk = (delta) => `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta, finish_reason: null }] })}\n\n`;
    const sse = chunk({ role: 'assistant', content: '' }) + ': ping\n\n' + chunk({ content: 'Partial ' }) + chunk({ content: 'answer' })
      + `data: ${JSON.stringify({ error: { code: 500, message: 'the engine failed', type: 'server_error' } })}\n\n`;
    await withChatRequests((r) => r.respond({ status: 200, contentType: 'text/event-stream', body: sse }), async () => {
      await sendMessage('Break, please.');
      const a = await waitAnswer(10000);
      check(a.text === 'Partial answer', `the text before the error is not shown: "${a.text}"`);
      check(a.error && a.error.includes('the engine failed'), `the stream's error is not shown: ${a.error}`);
    });
  });

  await step('Stop ends a long answer and the page is ready again', async () => {
    await setField('#max_tokens', 2000);
    await watchAnswer();
    // A small model may end even a "very long story" after a few dozen tokens (CI saw 33), before
    // Stop can be clicked; the request that reaches the server asks it to ignore end-of-text, so
    // the answer runs until Stop. chatBodies keeps what the page itself sent.
    const endless = (r) => r.continue({ postData: JSON.stringify({ ...JSON.parse(r.postData()), ignore_eos: true }) });
    await withChatRequests(endless, stopLongAnswer);
  });

  async function stopLongAnswer() {
    await sendMessage('Write a very long story, with many chapters, about a dragon who learns to fly.');
    await page.waitForFunction(() => {
      const s = window.__seen.filter((x) => x.busy && x.len > 0).map((x) => x.len);
      return new Set(s).size >= 3 && Math.max(...s) > 40;
    }, { timeout: 30000 });
    check((await state()) === 'busy', 'the long answer finished before Stop could be clicked');
    check(await visible('#stop'), 'the Stop button is not shown while streaming');
    // Leave the conversation and come back: the answer goes on streaming into the page.
    await page.click('#new-chat');
    check((await page.$$eval('.message', (m) => m.length)) === 0 && (await state()) === 'busy', 'New chat while streaming went wrong');
    await page.click('#conversations .conv .conv-open');
    const back = (await lastAnswer()).text.length;
    await page.waitForFunction((n) => {
      const all = document.querySelectorAll('.message.assistant .content');
      return all[all.length - 1].textContent.length > n;
    }, { timeout: 15000 }, back);
    await page.click('#stop');
    await page.waitForFunction(() => document.body.dataset.state === 'idle', { timeout: 5000 });
    const a1 = await lastAnswer();
    await sleep(1500);
    const a2 = await lastAnswer();
    check(a1.text === a2.text, `the answer kept growing after Stop (${a1.text.length} -> ${a2.text.length} characters)`);
    check(a2.stopped, 'the answer is not marked as stopped');
    check(a2.error === null, `the stopped answer shows an error: ${a2.error}`);
    check(await visible('#send') && !(await visible('#stop')), 'after Stop, Send should show and Stop hide');
    check(!(await page.$eval('#send', (b) => b.disabled)), 'the Send button is disabled after Stop');
    const body = chatBodies.at(-1);
    check(body.max_tokens === 2000 && body.temperature === undefined, `wrong settings sent: ${JSON.stringify(body)}`);
    check(!body.messages.some((m) => ['Hello?', 'Break, please.', 'Partial answer'].includes(m.content)), 'a turn that failed was sent again');
    check(body.messages.length === 3, `expected the first turn and the new question in the request, got ${body.messages.length} messages`);
    // The server stops generating too (the engine cancels when the stream is dropped).
    let busySlots;
    for (let i = 0; i < 20; i++) {
      busySlots = await page.evaluate(async () => (await (await fetch('slots')).json()).filter((s) => s.is_processing).length);
      if (busySlots === 0) break;
      await sleep(200);
    }
    check(busySlots === 0, 'the server still generates after Stop');
    stoppedText = a2.text;
    messagesBefore = await page.$$eval('.message', (m) => m.length);
    console.log(`  stopped after ${a2.text.length} characters`);
  }

  await step('the conversation survives a reload (localStorage)', async () => {
    await page.reload({ waitUntil: 'load' });
    await ready();
    const convs = await page.$$eval('#conversations .conv', (l) => l.map((c) => ({ title: c.textContent, active: c.classList.contains('active') })));
    check(convs.length === 1 && convs[0].active && convs[0].title.includes('Write three sentences'), `conversation list after reload: ${JSON.stringify(convs)}`);
    const count = await page.$$eval('.message', (m) => m.length);
    check(count === messagesBefore, `${count} messages after reload, ${messagesBefore} before`);
    const a = await lastAnswer();
    check(a.text === stoppedText && a.stopped, 'the stopped answer changed across the reload');
    const speeds = await page.$$eval('.speed', (s) => s.length);
    check(speeds === 1, `expected the first answer's speed line after reload, found ${speeds}`);
    check((await page.$eval('#max_tokens', (e) => e.value)) === '2000', 'settings were not kept across the reload');
  });

  await step('new chat, switch between conversations, delete one', async () => {
    await page.click('#new-chat');
    check((await page.$$eval('.message', (m) => m.length)) === 0, 'a new chat is not empty');
    await openSettings();
    await setField('#max_tokens', 8);
    await sendMessage('Say hello.');
    const a = await waitAnswer();
    check(a.speed, 'no answer in the new conversation');
    let convs = await page.$$('#conversations .conv');
    check(convs.length === 2, `${convs.length} conversations, expected 2`);
    const body = chatBodies.at(-1);
    check(body.messages.length === 1, `the new conversation sent ${body.messages.length} messages`);
    await page.click('#conversations .conv:not(.active) .conv-open');
    check((await page.$$eval('.message', (m) => m.length)) === messagesBefore, 'switching back did not show the first conversation');
    await page.click('#conversations .conv:not(.active) .conv-delete');
    convs = await page.$$('#conversations .conv');
    check(convs.length === 1, `${convs.length} conversations after deleting one`);
    const stored = await page.evaluate(() => JSON.parse(localStorage.getItem('onebit.conversations')).length);
    check(stored === 1, `localStorage holds ${stored} conversations after deleting one`);
  });
}

async function keyScenario(key) {
  await step('with --api-key, the page asks for the key', async () => {
    await page.goto(BASE + '/', { waitUntil: 'load' });
    await page.waitForFunction(() => !document.querySelector('#auth').hidden, { timeout: 10000 });
    const msg = await page.$eval('#auth-msg', (e) => e.textContent);
    check(/API key/i.test(msg), `the key prompt says "${msg}"`);
  });

  await step('a wrong key is refused', async () => {
    await setField('#api-key', 'not-the-key');
    await page.click('#api-key-save');
    await page.waitForFunction(() => /refused/i.test(document.querySelector('#auth-msg').textContent), { timeout: 5000 });
  });

  await step('the right key works and is kept', async () => {
    await setField('#api-key', key);
    await page.click('#api-key-save');
    await page.waitForFunction(() => document.querySelector('#auth-msg').textContent.includes('accepted'), { timeout: 5000 });
    await ready();
    await openSettings();
    await setField('#max_tokens', 12);
    await sendMessage('Say hi.');
    const a = await waitAnswer();
    check(a.error === null && a.speed && SPEED.test(a.speed), `no answer with the key: ${JSON.stringify(a)}`);
    await page.reload({ waitUntil: 'load' });
    await page.waitForFunction(() => document.querySelector('#auth-msg').textContent.includes('accepted'), { timeout: 5000 });
    check((await page.$$eval('.message', (m) => m.length)) === 2, 'the conversation is gone after reload');
  });
}

let code = 0;
try {
  if (opts['api-key']) await keyScenario(opts['api-key']);
  else await mainScenario();
  await step('no page errors and no requests outside the server', async () => {
    check(pageErrors.length === 0, `errors in the page: ${pageErrors.join(' | ')}`);
    check(foreign.length === 0, `requests outside the server: ${foreign.join(', ')}`);
  });
} catch (e) {
  code = 1;
  const shot = process.env.WEBUI_SCREENSHOT;
  if (shot) await page.screenshot({ path: shot, fullPage: true }).then(() => console.log(`  screenshot: ${shot}`), () => {});
  if (!failed) {
    failed++;
    console.log(`not ok - ${e.stack || e}`);
  }
} finally {
  clearTimeout(watchdog);
  await browser.close().catch(() => {});
}
console.log(`webui${opts['api-key'] ? ' (api key)' : ''}: ${passed} passed, ${failed} failed`);
process.exit(code || failed ? 1 : 0);
