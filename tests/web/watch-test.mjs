// Unit test of www/extension/watch.js (run by tests/extension.rs with node): how the content
// script answers a page that keeps changing its text (a clock) or takes the translation back,
// and where a block goes after the engine's answer. watch.js is a classic content script; it is
// run here as one, with a clock the test moves by hand.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import vm from "node:vm";

const file = new URL("../../www/extension/watch.js", import.meta.url);
const world = {};
world.globalThis = world;
vm.runInNewContext(readFileSync(file, "utf8"), world, { filename: file.pathname });

// A hand-moved clock: `advance(ms)` runs the timers that fall due.
function clock() {
  let now = 0, next = 1;
  const timers = new Map();
  return {
    setTimeout: (f, ms) => { const id = next++; timers.set(id, { at: now + ms, f }); return id; },
    clearTimeout: (id) => timers.delete(id),
    advance(ms) {
      const end = now + ms;
      for (;;) {
        const due = [...timers].filter(([, t]) => t.at <= end).sort((a, b) => a[1].at - b[1].at)[0];
        if (!due) break;
        timers.delete(due[0]);
        now = due[1].at;
        due[1].f();
      }
      now = end;
    },
    pending: () => timers.size,
  };
}

// A node the page rewrites: followed 3 times, then left to the page.
{
  const w = world.tildeopenWatch({ timers: clock() });
  const clockNode = {}, other = {};
  assert.deepEqual([1, 2, 3, 4, 5].map(() => w.changed(clockNode)), [true, true, true, false, false]);
  assert.equal(w.changed(other), true, "counted per node");
  // Taking the translation back: written again 3 times, then the page keeps its text.
  assert.deepEqual([1, 2, 3, 4].map(() => w.reverted(clockNode)), [true, true, true, false]);
}

// Settling: a block rewritten every 100 ms is not queued while it changes; once its text has held
// for 1 s it is queued once.
{
  const c = clock();
  const w = world.tildeopenWatch({ timers: c });
  const block = {};
  let queued = 0;
  for (let i = 0; i < 30; i++) { w.settle(block, () => queued++); c.advance(100); }
  assert.equal(queued, 0, "queued while it still changes");
  assert.ok(w.settling(block));
  c.advance(899); // 999 ms since the last change
  assert.equal(queued, 0);
  c.advance(1);
  assert.equal(queued, 1, "queued once its text held for 1 s");
  assert.ok(!w.settling(block));
  // Cancelled (the block was left to the page): never queued.
  w.settle(block, () => queued++);
  w.cancel(block);
  c.advance(5000);
  assert.equal(queued, 1);
  assert.equal(c.pending(), 0);
}

// After the engine's answer.
{
  const c = clock();
  const w = world.tildeopenWatch({ timers: c });
  const done = { type: "done" }, lost = { type: "error", retry: true }, failed = { type: "error" }, fatal = { type: "error", fatal: true };
  // Changed while it was being translated: behind the other blocks, never before them (to the
  // front, a clock ticking faster than a translation was translated for ever and no other block
  // was); still changing: its settle timer queues it.
  const b = {};
  assert.equal(w.after(b, done, { stale: true }), "back");
  assert.equal(w.after(b, lost, { stale: true }), "back");
  w.settle(b, () => {});
  assert.equal(w.after(b, done, { stale: true }), "wait");
  w.cancel(b);
  assert.equal(w.after(b, fatal, { stale: true }), "stop", "a failed load stops the queue whatever the block");
  // Another language asked for meanwhile: again next.
  assert.equal(w.after(b, done, { otherTarget: true }), "front");
  assert.equal(w.after(b, done), "done");
  assert.equal(w.after(b, failed), "drop");
  // A lost device: one retry, and another after a later loss once the block has been translated.
  const r = {};
  assert.equal(w.after(r, lost), "front", "first loss: retried");
  assert.equal(w.after(r, lost), "drop", "lost again at once: no endless retries");
  const s = {};
  assert.equal(w.after(s, lost), "front");
  assert.equal(w.after(s, done), "done");
  assert.equal(w.after(s, lost), "front", "a later loss, after the block was translated, gets its own retry");
}

console.log("watch.js: ok");
