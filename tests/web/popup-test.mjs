// Unit test of www/extension/popup.js (run by tests/extension.rs with node, with stand-ins for
// its DOM and the chrome APIs): a status poll still waiting for the service worker's load error
// when a "translate" click's answer is shown does not write the old error over it.
import assert from "node:assert/strict";

const els = {};
const el = (id) => (els[id] ??= { id, textContent: "", value: "lv", options: [], add(o) { this.options.push(o); } });
globalThis.document = { getElementById: el };
globalThis.Option = class { constructor(text, value) { Object.assign(this, { text, value }); } };
let poll = null;
globalThis.setInterval = (f) => { poll = f; return 1; };

// The content script's answers, and the service worker's `last-error`, released by the test.
let status = { showing: "translation", blocks: 3, done: 0, tokens: 0, seconds: 0, error: "The model could not be loaded (load_failed)", errorCode: "load_failed", errorFatal: true };
const lastErrors = [];
let cleared = 0;
globalThis.chrome = {
  storage: { local: { get: async () => ({}), set: async () => {} } },
  tabs: {
    query: async () => [{ id: 7 }],
    sendMessage: async (_tab, m) => {
      if (m.type === "translate") status = { ...status, error: null, errorCode: null, errorFatal: false };
      return structuredClone(status);
    },
  },
  runtime: {
    sendMessage: (m) => {
      if (m.type === "memory-size") return Promise.resolve({ entries: 12 });
      if (m.type === "clear-memory") { cleared++; return Promise.resolve({ ok: true }); }
      assert.equal(m.type, "last-error");
      return new Promise((ok) => lastErrors.push(() => ok({ code: "load_failed", detail: "HTTP 404 for https://host/model.gguf" })));
    },
  },
};
const settle = async () => { for (let i = 0; i < 20; i++) await new Promise((ok) => setImmediate(ok)); };

await import("../../www/extension/popup.js");
await settle();
// The first status: the failed load, with the service worker's details.
assert.equal(lastErrors.length, 1);
lastErrors.shift()();
await settle();
assert.match(els.status.textContent, /could not be loaded[^]*HTTP 404/);

// A poll asks again (the error is still there) and waits for the details ...
poll();
await settle();
assert.equal(lastErrors.length, 1, "the poll waits for last-error");
// ... the user clicks "translate" meanwhile: the error is gone and the status says so ...
await els.translate.onclick();
await settle();
assert.equal(els.status.textContent, "0 of 3 blocks translated ");
// ... and the poll's late answer does not bring the old error back.
lastErrors.shift()();
await settle();
assert.equal(els.status.textContent, "0 of 3 blocks translated ", "a stale poll overwrote the newer status");

// The translation memory: its size on the button; a click empties it.
assert.equal(els.forget.textContent, "Forget saved translations (12)");
await els.forget.onclick();
assert.equal(cleared, 1);

console.log("popup.js: ok");
