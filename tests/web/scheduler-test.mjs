// Unit test of www/scheduler.js (run by tests/extension.rs with node) on a fake engine with N
// slots, whose every step gives each request in flight one token: requests share passes, the
// N+1-th waits in order, aborts free a slot or a queue place at once and leave the others whole,
// request errors come at once, and a failing engine fails everyone.
import assert from "node:assert/strict";
import { scheduler } from "../../www/scheduler.js";

// A fake engine: request `{ text, n }` answers `text` n times, a token per step.
function fakeEngine(slots) {
  const inFlight = new Map(); // id -> { req, stream, left, out }
  const log = { steps: [], admitted: [], cancelled: [], discarded: 0, unloaded: 0, stepping: false };
  let nextId = 1, fail = null;
  const engine = {
    log,
    failNext(e) { fail = e; },
    prepare(req) {
      if (typeof req.text !== "string") throw Object.assign(new Error("bad request"), { code: "bad" });
      return { req };
    },
    hasFreeSlot() { assert.ok(!log.stepping, "hasFreeSlot during a step"); return inFlight.size < slots; },
    admit(p, stream) {
      assert.ok(!log.stepping, "admit during a step");
      const id = nextId++;
      inFlight.set(id, { req: p.req, stream, left: p.req.n, out: "", role: stream });
      log.admitted.push(p.req.text);
      return id;
    },
    discard() { log.discarded++; },
    cancel(id) { assert.ok(!log.stepping, "cancel during a step"); log.cancelled.push(id); inFlight.delete(id); },
    unload() { assert.ok(!log.stepping, "unload during a step"); log.unloaded++; },
    async step() {
      log.stepping = true;
      await new Promise((r) => setTimeout(r, 1));
      log.stepping = false;
      if (fail) { const e = fail; fail = null; throw e; }
      log.steps.push([...inFlight.values()].map((r) => r.req.text));
      const events = [];
      for (const [id, r] of inFlight) {
        if (r.role) { r.role = false; events.push({ id, last: false, chunk: { delta: { role: "assistant" } } }); }
        r.left--;
        r.out += r.req.text;
        const last = r.left === 0;
        if (r.stream) {
          events.push({ id, last: false, chunk: { delta: { content: r.req.text } } });
          if (last) events.push({ id, last: true, chunk: { delta: {}, finish: "length" } });
        } else if (last) events.push({ id, last: true, completion: { content: r.out } });
        if (r.req.errorAt === r.req.n - r.left) { events.push({ id, last: true, error: new Error("row failed") }); inFlight.delete(id); continue; }
        if (last) inFlight.delete(id);
      }
      return events;
    },
  };
  return engine;
}

async function collect(it) {
  let text = "", chunks = 0;
  for await (const c of it) { chunks++; text += c.delta.content ?? ""; }
  return { text, chunks };
}

// 8 requests (streamed and not) on 4 slots: the first 4 share every pass, the 5th starts when a
// slot frees, in arrival order; each output is whole.
{
  const e = fakeEngine(4);
  const s = scheduler(e);
  const reqs = ["a", "b", "c", "d", "e", "f", "g", "h"].map((t, i) => ({ text: t, n: 3 + (i % 3) }));
  const outs = reqs.map((r, i) => (i % 2 ? collect(s.submit(r, { stream: true })) : s.submit(r)));
  assert.equal(s.queued, 8, "queued until the loop's microtask");
  const got = await Promise.all(outs);
  got.forEach((g, i) => {
    const want = reqs[i].text.repeat(reqs[i].n);
    if (i % 2) { assert.equal(g.text, want); assert.equal(g.chunks, reqs[i].n + 2, "role, tokens, finish"); } else assert.equal(g.content, want);
  });
  assert.deepEqual(e.log.steps[0], ["a", "b", "c", "d"], "four at once from the first pass");
  assert.ok(e.log.steps.every((st) => st.length <= 4), "never more than the slots");
  assert.deepEqual(e.log.admitted, ["a", "b", "c", "d", "e", "f", "g", "h"], "FIFO");
  const serialSteps = reqs.reduce((a, r) => a + r.n, 0);
  assert.ok(e.log.steps.length < serialSteps / 2, `${e.log.steps.length} passes for ${serialSteps} tokens`);
  assert.equal(s.inFlight, 0);
}

// Aborts: a queued request leaves the queue at once (never admitted), a running stream gives its
// slot back before the next pass, the others are whole; the 3rd request starts then.
{
  const e = fakeEngine(2);
  const s = scheduler(e);
  const acStream = new AbortController(), acQueued = new AbortController();
  const long = s.submit({ text: "L", n: 6 });
  const stream = s.submit({ text: "S", n: 50 }, { stream: true, signal: acStream.signal });
  const queued = s.submit({ text: "Q", n: 2 }, { signal: acQueued.signal });
  const third = s.submit({ text: "T", n: 2 });
  acQueued.abort();
  await assert.rejects(queued, (err) => err.name === "AbortError");
  let n = 0;
  for await (const c of stream) if (c.delta.content && ++n === 2) acStream.abort();
  assert.equal(n, 2, "the stream ends right after abort()");
  assert.equal((await long).content, "LLLLLL");
  assert.equal((await third).content, "TT");
  assert.ok(!e.log.admitted.includes("Q"), "the aborted queued request never took a slot");
  assert.equal(e.log.discarded, 1);
  assert.equal(e.log.cancelled.length, 1, "the aborted stream's slot was cancelled");
  const tStart = e.log.steps.findIndex((st) => st.includes("T"));
  const sLast = e.log.steps.findLastIndex((st) => st.includes("S"));
  assert.ok(tStart <= sLast + 1, "T took the stream's slot at the next pass");
  // A stream's return() frees its slot too.
  const it = s.submit({ text: "R", n: 30 }, { stream: true });
  await it.next();
  await it.return();
  assert.deepEqual(await it.next(), { done: true, value: undefined });
  assert.equal((await s.submit({ text: "x", n: 1 })).content, "x");
  assert.equal(e.log.cancelled.length, 2);
}

// Request errors are thrown by submit at once; an already aborted signal too; a row's error ends
// only its request.
{
  const e = fakeEngine(2);
  const s = scheduler(e);
  assert.throws(() => s.submit({ text: 5 }), (err) => err.code === "bad");
  const ac = new AbortController(); ac.abort();
  assert.throws(() => s.submit({ text: "a", n: 1 }, { signal: ac.signal }), (err) => err.name === "AbortError");
  const bad = s.submit({ text: "e", n: 5, errorAt: 2 });
  const good = s.submit({ text: "g", n: 4 });
  await assert.rejects(bad, /row failed/);
  assert.equal((await good).content, "gggg");
}

// The engine fails (device lost): every request in flight or queued fails with its error; a
// stream throws it after the chunks it had. close() fails the rest and unloads once.
{
  const e = fakeEngine(1);
  const s = scheduler(e);
  const lost = Object.assign(new Error("device lost"), { code: "device_lost" });
  const st = s.submit({ text: "a", n: 10 }, { stream: true });
  const q = s.submit({ text: "b", n: 1 });
  const first = await st.next();
  assert.equal(first.value.delta.role, "assistant");
  e.failNext(lost);
  await assert.rejects(q, (err) => err.code === "device_lost");
  await assert.rejects(async () => { for (;;) if ((await st.next()).done) break; }, (err) => err.code === "device_lost");
  const live = s.submit({ text: "c", n: 100 }, { stream: true });
  await live.next();
  const unloaded = Object.assign(new Error("unloaded"), { code: "unloaded" });
  await s.close(unloaded);
  await assert.rejects(() => live.next(), (err) => err.code === "unloaded");
  assert.throws(() => s.submit({ text: "d", n: 1 }), (err) => err.code === "unloaded");
  assert.equal(e.log.unloaded, 1);
  await s.close(unloaded);
  assert.equal(e.log.unloaded, 1, "unloaded once");
}

console.log("scheduler.js: ok");
