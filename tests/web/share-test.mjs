// Unit test of www/extension/share.js (run by tests/extension.rs with node): tabs take turns per
// request, the engine cache drops a lost device and remembers a failed load for a while, and
// what reaches a page of an error has no URL.
import assert from "node:assert/strict";
import { turns, engineCache, pageError, stripUrls } from "../../www/extension/share.js";
import { translateWhole } from "../../www/extension/whole.js";

const tick = () => new Promise((ok) => setTimeout(ok, 1));

// Turns: tab A's block never finishes a part (many requests); tab B's one-request block, sent
// while A's first request runs, goes next, not after all of A's.
{
  const turn = turns();
  const log = [];
  let running = 0, most = 0;
  const request = (tab) => (text) => turn.run(tab, async () => {
    running++; most = Math.max(most, running);
    log.push(tab);
    await tick();
    running--;
    return { text, cut: tab === "A" };
  });
  const long = Array.from({ length: 20 }, (_, i) => `Sentence ${i} is about bread.`).join(" ");
  const a = translateWhole(request("A"), long, { splitAbove: 60 });
  await Promise.resolve();
  const b = translateWhole(request("B"), "Two cups of flour.", { splitAbove: 60 });
  const [ra, rb] = await Promise.all([a, b]);
  assert.equal(most, 1, "one request at a time");
  assert.equal(rb.text, "Two cups of flour.");
  assert.ok(ra.requests > 10, `A made many requests: ${ra.requests}`);
  assert.deepEqual(log.slice(0, 3), ["A", "B", "A"], `B's request goes second: ${log.join("")}`);

  // Three tabs with several requests each alternate; a dropped tab's queued requests reject.
  log.length = 0;
  const many = (tab, n) => Promise.all(Array.from({ length: n }, () => request(tab)("x")));
  const pa = many("A", 3), pb = many("B", 3), pc = many("C", 3);
  const cRejected = assert.rejects(pc, /disconnected/);
  turn.drop("C", new Error("disconnected"));
  await Promise.all([pa, pb, cRejected]);
  assert.equal(log.join(""), "ABABAB", "round robin; C dropped before its turn");
}

// The engine cache.
{
  let t = 0, creates = 0, unloads = 0, fail = true;
  const url = "https://models.example/m.gguf?X-Amz-Signature=SECRET123";
  const create = async (u) => {
    creates++;
    if (fail) throw Object.assign(new Error(JSON.stringify({ error: { message: `${u}: HTTP 403`, type: "server_error", param: null, code: null } })), { code: null });
    return { id: creates, unload: async () => { unloads++; } };
  };
  const cache = engineCache({ create, now: () => t, backoffMs: 30_000 });

  // A failed load: a load error with a code and the details kept for the popup.
  const e1 = await cache.get(url).catch((e) => e);
  assert.equal(e1.code, "load_failed");
  assert.ok(e1.load && e1.fatal && e1.detail.includes("HTTP 403"));
  assert.ok(cache.lastError.detail.includes("SECRET123"), "the popup gets the details");
  // Within 30 s the same URL fails at once, without loading again; two tabs asking at once share it.
  t = 29_000;
  const [e2, e3] = await Promise.all([cache.get(url).catch((e) => e), cache.get(url).catch((e) => e)]);
  assert.ok(e2 === e1 && e3 === e1, "the remembered failure");
  assert.equal(creates, 1, "no new load during the backoff");
  // After it, a new try; it loads now and is cached.
  t = 31_000;
  fail = false;
  const eng = await cache.get(url);
  assert.equal(creates, 2);
  assert.equal(await cache.get(url), eng, "cached");
  assert.equal(creates, 2);

  // An ordinary request error keeps the engine; a lost device or an unloaded engine drops it
  // (unloaded), and the next get loads a new one.
  assert.equal(cache.failed(eng, { code: "context_length_exceeded" }), false);
  assert.equal(await cache.get(url), eng);
  assert.equal(cache.failed(eng, { code: "device_lost" }), true);
  await tick();
  assert.equal(unloads, 1, "the lost engine is unloaded");
  const eng2 = await cache.get(url);
  assert.ok(eng2 !== eng && creates === 3, "loaded again after device_lost");
  assert.equal(cache.failed(eng, { code: "unloaded" }), false, "an engine already dropped is not dropped twice");
  assert.equal(cache.failed(eng2, { code: "unloaded" }), true);
  assert.ok((await cache.get(url)) !== eng2 && creates === 4, "loaded again after unloaded");

  // What a page gets of errors: no URL, no signature; the code; fatal for a failed load.
  const p1 = pageError(e1);
  assert.ok(!p1.message.includes("SECRET123") && !p1.message.includes("models.example"), p1.message);
  assert.ok(p1.message.includes("load_failed") && p1.fatal && p1.code === "load_failed", JSON.stringify(p1));
  const body = (message, code) => Object.assign(new Error(JSON.stringify({ error: { message, type: "server_error", param: null, code } })), { code });
  const p2 = pageError(body(`fetch ${url} failed`, "device_lost"));
  assert.equal(p2.message, "fetch <URL> failed");
  assert.deepEqual([p2.fatal, p2.retry, p2.code], [false, true, "device_lost"]);
  const p3 = pageError(new Error('unsupported language "xx"'));
  assert.deepEqual([p3.message, p3.fatal, p3.retry], ['unsupported language "xx"', false, false]);
  assert.equal(pageError(Object.assign(new Error("Set a model URL in the extension's options."), { code: "no_model", fatal: true })).fatal, true);
  assert.equal(stripUrls("a blob:https://h.example/x?y=1 and file:///tmp/a b"), "a blob:<URL> and <URL> b");
}
// Turns with a limit: up to 3 at once, refilled as each finishes, tabs still rotating; a `first`
// job (the user's selection) goes before the queued ones.
{
  const turn = turns(3);
  let running = 0, most = 0;
  const order = [];
  const job = (tab, ms = 2) => () => turn.run(tab, async () => {
    running++; most = Math.max(most, running);
    order.push(tab);
    await new Promise((ok) => setTimeout(ok, ms));
    running--;
  });
  const all = [];
  for (let i = 0; i < 9; i++) all.push(job("A")());
  for (let i = 0; i < 3; i++) all.push(job("B")());
  await Promise.resolve();
  all.push(turn.run("C", async () => order.push("sel"), { first: true }));
  await Promise.all(all);
  assert.equal(most, 3, "three at once");
  assert.ok(order.indexOf("sel") <= 3, `the selection went first: ${order.join(",")}`);
  assert.ok(order.indexOf("B") < 6, `B did not wait for all of A: ${order.join(",")}`);
  turn.setLimit(1);
  running = most = 0;
  await Promise.all([job("A")(), job("B")(), job("A")()]);
  assert.equal(most, 1, "limit lowered");
}
console.log("share.js: ok");
