// The content script's bookkeeping for pages that change their own text: how often a node may
// change or take back its translation before it is left to the page, the wait for a changed
// block's text to settle, and where a block goes after the engine's answer. No DOM: loaded as a
// content script before content.js (it defines `tildeopenWatch` in the extension's isolated
// world, which pages cannot see) and tested with node (tests/web/watch-test.mjs).
globalThis.tildeopenWatch = function watch({ settleMs = 1000, maxChanges = 3, maxReapplies = 3, timers = globalThis } = {}) {
  const changes = new WeakMap(), reapplies = new WeakMap(), settling = new Map();
  const bump = (m, k) => { const n = (m.get(k) ?? 0) + 1; m.set(k, n); return n; };
  return {
    /** The page wrote new text into a translated (or queued) node: whether to follow it (drop
     *  the translation, translate the new text). False from change maxChanges + 1 on: a clock or
     *  a counter, left as the page writes it. */
    changed: (node) => bump(changes, node) <= maxChanges,
    /** The page wrote a node's original text back over its translation: whether to write the
     *  translation again. False from revert maxReapplies + 1 on: a page that insists on its text
     *  (or restores it from its own MutationObserver) keeps it. */
    reverted: (node) => bump(reapplies, node) <= maxReapplies,
    /** Runs `f` once the block's text has not changed for settleMs: each call starts the wait
     *  again, so a block the page rewrites faster than that is not sent at all meanwhile. */
    settle(block, f) {
      timers.clearTimeout(settling.get(block));
      settling.set(block, timers.setTimeout(() => { settling.delete(block); f(); }, settleMs));
    },
    settling: (block) => settling.has(block),
    cancel(block) { timers.clearTimeout(settling.get(block)); settling.delete(block); },
    /** Where a block goes after the engine's answer `m` ({type: "done"} or {type: "error",
     *  fatal, retry}): "done" (write the translation), "stop" (every block would fail so: keep it
     *  first and stop the queue), "front" (again next: a lost engine's one retry, or another
     *  language asked for meanwhile), "back" (the page changed its text meanwhile: behind the
     *  others, never before them), "wait" (changed and still changing: its settle timer queues
     *  it) or "drop" (failed; left as it is). */
    after(block, m, { stale = false, otherTarget = false } = {}) {
      if (m.type === "error" && m.fatal) return "stop";
      if (stale) return settling.has(block) ? "wait" : "back";
      if (m.type === "done") {
        if (otherTarget) return "front";
        block.retried = false; // the next lost device gets its own retry
        return "done";
      }
      if (m.retry && !block.retried) { block.retried = true; return "front"; }
      return "drop";
    },
  };
};
