// Content script: finds the page's visible text blocks (and the attributes people read: title,
// alt, placeholder, aria-label, and the document's title), has the extension's engine translate
// them (streamed, "blocks at once" in flight, the first screen first, then the screens near it,
// then the rest of the page) and writes each translation back into the block's own text nodes, so
// elements, links and inline formatting stay as they were. DOM writes are batched once per frame.
(() => {
  if (window.__tildeopen) return;
  window.__tildeopen = true;

  const MARK = " […]"; // as in whole.js: a part that could not be translated whole
  const SKIP = "[data-tildeopen-ui],script,style,noscript,template,code,pre,kbd,samp,var,textarea,input,select,option,svg,math,iframe,[contenteditable=''],[contenteditable=true],[translate=no],.notranslate";
  // Attributes read by people; inputs' placeholders too (their values never).
  const ATTRS = ["title", "alt", "placeholder", "aria-label"];
  const ATTR_SKIP = "[data-tildeopen-ui],script,style,noscript,template,code,pre,kbd,samp,var,svg,math,iframe,[contenteditable=''],[contenteditable=true],[translate=no],.notranslate";
  const original = new Map();   // Text node -> its original text (follows the page's own edits)
  const translated = new Map(); // Text node -> its translation
  const queued = new WeakSet();
  const blockOf = new WeakMap(); // Text node -> its block { el, nodes, target (of its translation) }
  // Text nodes left to the page: it kept changing them (a clock) or taking their translation back
  // (see watch.js). Never translated or watched again.
  const left = new WeakSet();
  const watch = globalThis.tildeopenWatch();
  let showing = "original";
  let port = null, queue = [];
  // Blocks sent and not answered yet (id -> entry), at most `limit` ("blocks at once").
  const inflight = new Map();
  let limit = 4;
  // Attributes (Attr nodes, and the document title as `TITLE`) -> original / translation.
  const attrOriginal = new Map(), attrTranslated = new Map();
  const TITLE = { title: true };
  const attrBlocks = new Set(); // attribute blocks translated (for a change of target language)
  // Set by an error every later block would hit too (the model cannot load): the queue waits
  // until "translate" again instead of trying each block.
  let stopped = false;
  // requests: engine requests made; cached: blocks answered by the translation memory; same:
  // blocks left as they were (already in the target language); sources: blocks per source language.
  const stats = { blocks: 0, done: 0, cached: 0, same: 0, requests: 0, sources: {}, tokens: 0, seconds: 0, error: null, errorCode: null, errorFatal: false, loading: null };

  const isInline = (el) => {
    const d = getComputedStyle(el).display;
    return d === "inline" || d === "contents";
  };
  const visible = (el) => {
    const s = getComputedStyle(el);
    return s.visibility !== "hidden" && s.display !== "none" && el.getClientRects().length > 0;
  };

  // A text node the script may translate (visibility aside): text, outside skipped content.
  const acceptable = (t) => t.data.trim() && !left.has(t) && t.parentElement && !t.parentElement.closest(SKIP);
  // Its block: the nearest non-inline ancestor.
  const blockElement = (t) => {
    let block = t.parentElement;
    while (block.parentElement && isInline(block)) block = block.parentElement;
    return block;
  };

  /** Blocks (element + its text nodes) not yet queued, first screen first, then reading order. */
  function collect(root) {
    const byBlock = new Map();
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
      acceptNode: (t) => (acceptable(t) && !original.has(t) ? NodeFilter.FILTER_ACCEPT : NodeFilter.FILTER_REJECT),
    });
    for (let t = walker.nextNode(); t; t = walker.nextNode()) {
      const block = blockElement(t);
      if (!visible(t.parentElement)) continue;
      if (!byBlock.has(block)) byBlock.set(block, []);
      byBlock.get(block).push(t);
    }
    const blocks = [...byBlock.entries()].map(([el, nodes]) => ({ el, nodes, target: null })).filter((b) => !b.nodes.every((n) => queued.has(n)));
    // Attributes people read, each a block of its own.
    const els = root.nodeType === 1 ? [root, ...root.querySelectorAll(ATTRS.map((a) => `[${a}]`).join(","))] : [];
    for (const el of els) {
      if (el.closest(ATTR_SKIP)) continue;
      for (const a of ATTRS) {
        const node = el.getAttributeNode(a);
        if (!node || !node.value.trim() || attrOriginal.has(node) || left.has(node)) continue;
        if (a === "alt" && el.tagName !== "IMG" && el.tagName !== "AREA" && el.tagName !== "INPUT") continue;
        blocks.push({ el, nodes: [], attr: node, target: null });
      }
    }
    if (root === document.body && document.title.trim() && !attrOriginal.has(TITLE)) blocks.push({ el: document.documentElement, nodes: [], attr: TITLE, target: null });
    return screenFirst(blocks);
  }

  // Where a block stands from the viewport: 0 on screen, 1 within a screen of it, 2 further.
  function rank(b) {
    if (b.attr === TITLE) return 0;
    const r = b.el.getBoundingClientRect();
    if (r.bottom > 0 && r.top < innerHeight) return 0;
    return r.bottom > -innerHeight && r.top < 2 * innerHeight ? 1 : 2;
  }
  function screenFirst(blocks) {
    const ranks = new Map(blocks.map((b) => [b, rank(b)]));
    return [0, 1, 2].flatMap((k) => blocks.filter((b) => ranks.get(b) === k));
  }
  // The queue is put back in that order before a block is taken when the page scrolled or
  // the queue changed since the last time (one layout read per change, not per block).
  let ranked = null;
  const orderKey = () => `${Math.round(scrollX)},${Math.round(scrollY)},${innerHeight},${queue.length}`;
  function nextBlock() {
    if (ranked !== orderKey()) { queue = screenFirst(queue); ranked = orderKey(); }
    const b = queue.shift();
    ranked = orderKey();
    return b;
  }

  // The text a block is translated from.
  const attrValue = (a) => (a === TITLE ? document.title : a.value);
  const sourceOf = (b) => (b.attr ? attrOriginal.get(b.attr) ?? attrValue(b.attr) : b.nodes.map((n) => original.get(n)).join("")).replace(/\s+/g, " ").trim();
  // The block's language as the page declares it.
  const langOf = (b) => (b.el.closest("[lang]")?.getAttribute("lang") || document.documentElement.lang || null);

  // DOM writes wait for the next frame and go together (a page of streamed blocks would
  // otherwise write once per token per block); a hidden tab, which gets no frames, after 100 ms.
  let writes = [], frame = null;
  function soon(f) {
    writes.push(f);
    if (frame) return;
    let done = false;
    const run = () => { if (done) return; done = true; frame = null; flushWrites(); };
    frame = requestAnimationFrame(run);
    setTimeout(run, 100);
  }
  function flushWrites() {
    const w = writes;
    writes = [];
    if (w.length) quietly(() => w.forEach((f) => f()));
    status();
  }
  function writeAttr(a, text) {
    if (a === TITLE) document.title = text;
    else a.value = text;
  }

  /** Splits a translation over a block's text nodes in proportion to their original lengths. */
  function distribute(nodes, text) {
    if (nodes.length === 1) return [text];
    const words = text.split(/(\s+)/);
    const lens = nodes.map((n) => original.get(n).trim().length);
    const total = lens.reduce((a, b) => a + b, 0) || 1;
    const out = nodes.map(() => "");
    let w = 0;
    const wordCount = words.length;
    for (let i = 0; i < nodes.length; i++) {
      const share = i === nodes.length - 1 ? wordCount - w : Math.max(1, Math.round((lens[i] / total) * wordCount));
      out[i] = words.slice(w, Math.min(wordCount, w + share)).join("");
      w = Math.min(wordCount, w + share);
    }
    // Keep each node's own leading/trailing space so words do not run together.
    return out.map((s, i) => {
      const o = original.get(nodes[i]);
      const lead = o.match(/^\s*/)[0], trail = o.match(/\s*$/)[0];
      return lead + s.trim() + trail;
    });
  }

  // Changes the page's text without the MutationObserver taking it for the page's own: the
  // page's changes still pending are handled first (before they are overwritten), then the
  // records of this write are dropped.
  function quietly(f) {
    flush();
    try { f(); } finally { observer.takeRecords(); }
  }

  // Handles the page's changes the observer has not reported yet.
  function flush() {
    const records = observer.takeRecords();
    if (records.length) onMutations(records);
  }

  function write(nodes, texts) {
    nodes.forEach((n, i) => translated.set(n, texts[i]));
    soon(() => nodes.forEach((n) => { if (showing === "translation" && translated.has(n)) n.data = translated.get(n); }));
  }

  // Undoes a block's partial streamed text: back to what the page showed before it.
  function restore(nodes) {
    soon(() => nodes.forEach((n) => { if (original.has(n)) n.data = showing === "translation" && translated.has(n) ? translated.get(n) : original.get(n); }));
  }

  function connect() {
    port = chrome.runtime.connect({ name: "translate" });
    port.onMessage.addListener(onMessage);
    // The service worker restarted or the extension reloaded: put the blocks in flight back
    // (original text, front of the queue) and carry on with a new port.
    port.onDisconnect.addListener(() => {
      port = null;
      for (const c of inflight.values()) {
        if (!c.block.attr) restore(c.nodes);
        queue.unshift(c.block);
      }
      inflight.clear();
      setTimeout(pump, 500);
    });
  }

  const inFlightBlock = (b) => [...inflight.values()].some((c) => c.block === b);
  function onMessage(m) {
    if (m.type === "progress") { stats.loading = m; return; }
    const c = inflight.get(m.id);
    if (!c) return;
    if (m.type === "text") {
      if (c.block.attr) return; // attributes change once, when done
      // The block's whole text so far (earlier parts of a split block + the part in progress).
      c.text = m.text;
      // Stream into the block's first text node (next frame); the rest follows at the end.
      soon(() => { if (showing === "translation" && !c.stale && inflight.get(c.id) === c) c.nodes[0].data = c.text; });
    } else if (m.type === "done" || m.type === "error") {
      flush();
      inflight.delete(c.id);
      if (m.type === "done") {
        stats.requests += m.requests ?? 0;
        if (m.cached) stats.cached++;
        if (m.same) stats.same++;
        if (m.source) stats.sources[m.source] = (stats.sources[m.source] ?? 0) + 1;
      }
      if (c.block.attr) return attrDone(c, m);
      // The page changed the block's text meanwhile (stale), or another language was asked for:
      // this translation is of the past. See watch.js for where the block goes.
      const where = watch.after(c.block, m, { stale: c.stale, otherTarget: m.type === "done" && !!stats.target && m.target !== stats.target });
      if (m.type === "error") {
        stats.error = m.message;
        stats.errorCode = m.code ?? null;
        stats.errorFatal = !!m.fatal;
      }
      if (where === "done") {
        c.block.target = m.target;
        c.block.counted = false;
        // The final text: whole, or with the original and a visible mark where a part could
        // not be finished.
        c.text = m.text;
        const originals = c.nodes.map((n) => original.get(n));
        if (m.same) {
          // Already in the target language: the page's own text, exactly.
          write(c.nodes, c.nodes.map((n) => original.get(n)));
        } else if (m.text === c.sent + MARK || !m.text.trim()) {
          // Nothing of it could be finished: the page's own text, exactly, and the mark.
          if (m.text.trim()) originals[originals.length - 1] = originals[originals.length - 1].trimEnd() + MARK;
          write(c.nodes, originals);
        } else write(c.nodes, distribute(c.nodes, c.text));
        stats.done++; stats.tokens += m.tokens; stats.seconds += m.seconds;
      } else restore(c.nodes);
      // "stop": every block would fail the same way: keep them (this one first) for "translate".
      if (where === "stop") stopped = true;
      if (where === "stop" || where === "front") queue.unshift(c.block);
      else if (where === "back") later(c.block);
      // Nodes the page removed while the block was in flight are forgotten now (a re-rendering
      // ticker would otherwise leave one per block in flight until the next scan).
      for (const n of c.nodes) if (!n.isConnected) { original.delete(n); translated.delete(n); }
      pump();
    }
  }

  // An attribute's (or the title's) answer, written once it is done.
  function attrDone(c, m) {
    const a = c.block.attr;
    if (m.type === "done" && attrOriginal.has(a)) {
      c.block.target = m.target;
      attrBlocks.add(c.block);
      // As for text: what could not be finished keeps its text with the mark (whole.js).
      attrTranslated.set(a, m.same || !m.text.trim() ? attrOriginal.get(a) : m.text);
      soon(() => { if (showing === "translation" && attrTranslated.has(a)) writeAttr(a, attrTranslated.get(a)); });
      stats.done++; stats.tokens += m.tokens; stats.seconds += m.seconds;
    } else if (m.type === "error") {
      stats.error = m.message;
      stats.errorCode = m.code ?? null;
      stats.errorFatal = !!m.fatal;
      if (m.fatal) { stopped = true; queue.unshift(c.block); }
    }
    pump();
  }

  // The page's data-tildeopen attribute: translating, translated, error or original.
  function status() {
    const root = document.documentElement;
    if (showing !== "translation") return;
    if (stopped) { if (!inflight.size) root.setAttribute("data-tildeopen", "error"); return; }
    if (inflight.size || queue.length) root.setAttribute("data-tildeopen", "translating");
    else if (stats.blocks && !writes.length) {
      root.setAttribute("data-tildeopen", "translated");
      // How many text nodes the script keeps (their originals): follows the page's live text.
      root.setAttribute("data-tildeopen-nodes", String(original.size));
    }
  }

  let nextId = 1;
  function pump() {
    if (showing !== "translation") return;
    while (!stopped && inflight.size < limit && queue.length) {
      const b = nextBlock();
      if (!b.el.isConnected) continue;
      if (!b.attr) {
        b.nodes = b.nodes.filter((n) => original.has(n));
        if (!b.nodes.length) continue;
      }
      const text = sourceOf(b);
      if (!text) continue;
      if (!port) connect();
      const c = { id: nextId++, block: b, el: b.el, nodes: b.nodes, text: "", sent: text, stale: false };
      inflight.set(c.id, c);
      port.postMessage({ type: "block", id: c.id, text, target: stats.target, lang: langOf(b) });
    }
    if (writes.length) return; // status() runs after the frame's writes
    status();
  }

  // Forgets text nodes the page has removed (a feed or a clock re-rendering), so memory follows
  // what is on the page, not everything it ever showed.
  function prune() {
    const live = (n) => n.isConnected || [...inflight.values()].some((c) => c.nodes.includes(n));
    for (const n of original.keys()) if (!live(n)) { original.delete(n); translated.delete(n); }
    queue = queue.filter((b) => b.el.isConnected);
  }

  function enqueue(root) {
    prune();
    for (const b of collect(root)) {
      if (b.attr) {
        attrOriginal.set(b.attr, attrValue(b.attr));
        b.counted = true;
        queue.push(b);
        stats.blocks++;
        continue;
      }
      b.nodes = b.nodes.filter((n) => !queued.has(n));
      if (!b.nodes.length) continue;
      for (const n of b.nodes) { queued.add(n); original.set(n, n.data); blockOf.set(n, b); }
      b.counted = true;
      queue.push(b);
      stats.blocks++;
    }
    pump();
  }

  // Queues a block again (at the back), counted once in `blocks` until it is done.
  function later(b) {
    if (b.left || !b.el.isConnected || queue.includes(b) || inFlightBlock(b)) return;
    if (!b.counted) { b.counted = true; stats.blocks++; }
    queue.push(b);
    pump();
  }

  // Drops a block's translation: its nodes show their original text again.
  function untranslate(b) {
    for (const n of b.nodes) translated.delete(n);
    b.target = null;
    quietly(() => b.nodes.forEach((n) => { if (original.has(n)) n.data = original.get(n); }));
    for (const c of inflight.values()) if (c.block === b) c.stale = true;
  }

  /** Another language is asked for: the block is queued to be translated anew. */
  function requeue(b) {
    untranslate(b);
    if (!watch.settling(b)) later(b);
  }

  /** The page changed the block's text: it is translated anew once the text has been the same
   *  for a while (watch.js), behind the other blocks. */
  function edited(b) {
    untranslate(b);
    queue = queue.filter((x) => x !== b);
    watch.settle(b, () => { if (b.target === null) later(b); });
  }

  /** Leaves a block to the page (it keeps changing or reverting it): the page's own text, not
   *  translated or watched again. */
  function leave(b) {
    untranslate(b);
    watch.cancel(b);
    queue = queue.filter((x) => x !== b);
    b.left = true;
    if (b.counted) { b.counted = false; stats.blocks--; }
    for (const n of b.nodes) { original.delete(n); left.add(n); }
  }

  // The page wrote a node's original text back over its translation (a re-render): show the
  // translation again, a few times at most, and never from inside the observer's callback, so
  // that a page restoring its text from its own MutationObserver does not ping-pong with this
  // one in microtasks that never end.
  function reverted(n) {
    if (!watch.reverted(n)) { const b = blockOf.get(n); if (b) leave(b); return; }
    setTimeout(() => {
      if (showing === "translation" && original.has(n) && n.data === original.get(n) && translated.has(n)) quietly(() => (n.data = translated.get(n)));
    }, 0);
  }

  function translatePage(target) {
    if (target) stats.target = target;
    showing = "translation";
    stopped = false;
    stats.error = stats.errorCode = null;
    stats.errorFatal = false;
    // Translations into another language than the one asked for now are dropped and their
    // blocks queued again (first screen first).
    if (stats.target) {
      const stale = new Set();
      for (const n of translated.keys()) {
        const b = blockOf.get(n);
        if (b && b.target !== stats.target) stale.add(b);
      }
      screenFirst([...stale].filter((b) => b.el.isConnected)).forEach(requeue);
      for (const b of [...attrBlocks]) {
        if (b.target === stats.target) continue;
        attrBlocks.delete(b);
        attrTranslated.delete(b.attr);
        b.target = null;
        quietly(() => writeAttr(b.attr, attrOriginal.get(b.attr)));
        later(b);
      }
    }
    quietly(() => { for (const [n, t] of translated) n.data = t; for (const [a, t] of attrTranslated) writeAttr(a, t); });
    enqueue(document.body);
  }

  function showOriginal() {
    showing = "original"; // the queue waits (pump() sends nothing) until "translate" again
    quietly(() => { for (const [n, o] of original) n.data = o; for (const [a, o] of attrOriginal) writeAttr(a, o); });
    document.documentElement.setAttribute("data-tildeopen", "original");
  }

  // Text the page adds later (infinite scroll, SPA navigation) is translated too, and text it
  // changes in place (frameworks set a text node's value) replaces the original: its block's
  // translation is dropped and the block translated again (see edited, leave). The extension's
  // own writes never reach here (see quietly).
  let pending = null, pendingText = null;
  const touched = new Set(); // untracked text nodes the page changed: only their blocks are scanned
  function onMutations(records) {
    let rescan = false;
    for (const r of records) {
      if (r.type === "childList") { if (r.addedNodes.length) rescan = true; continue; }
      const n = r.target;
      if (!original.has(n)) { if (!left.has(n)) touched.add(n); continue; } // not ours yet
      if (n.data === original.get(n)) {
        // Re-rendered with the same text (over the translation): show the translation again.
        if (showing === "translation" && translated.has(n)) reverted(n);
        continue;
      }
      if (translated.has(n) && n.data === translated.get(n)) continue;
      original.set(n, n.data);
      const b = blockOf.get(n);
      if (b) { if (watch.changed(n)) edited(b); else leave(b); }
    }
    if (showing !== "translation") { touched.clear(); return; }
    if (touched.size && !pendingText) pendingText = setTimeout(scanTouched, 300);
    if (!rescan) return;
    clearTimeout(pending);
    pending = setTimeout(() => enqueue(document.body), 300);
  }
  // A text node the page changed that the script does not keep (it was empty, or is in code,
  // hidden or skipped content): its own block is scanned if the node can be translated now,
  // never the whole page (a clock in a code block or a <style> rewritten by CSS-in-JS would
  // otherwise cost a full scan a tick).
  function scanTouched() {
    pendingText = null;
    const blocks = new Set();
    for (const n of touched) if (n.isConnected && !original.has(n) && acceptable(n) && visible(n.parentElement)) blocks.add(blockElement(n));
    touched.clear();
    for (const el of blocks) enqueue(el);
  }
  const observer = new MutationObserver(onMutations);
  observer.observe(document.documentElement, { childList: true, subtree: true, characterData: true });

  chrome.runtime.onMessage.addListener((m, _sender, reply) => {
    if (m.type === "translate") translatePage(m.target);
    else if (m.type === "show-original") showOriginal();
    else if (m.type === "translate-selection") translateSelection(m.text);
    reply({ showing, ...stats, queued: queue.length, inFlight: inflight.size });
  });

  // Pages cannot start work: translation starts only from the popup, the context menu or the
  // user's own auto-translate setting. A page may only ask for its original text back.
  window.addEventListener("message", (e) => {
    if (e.source === window && e.data?.tildeopen === "show-original") showOriginal();
  });

  function translateSelection(text) {
    const box = document.createElement("div");
    box.setAttribute("data-tildeopen-ui", "");
    box.setAttribute("style", "position:fixed;z-index:2147483647;right:16px;bottom:16px;max-width:420px;padding:12px 14px;background:#fff;color:#111;border:1px solid #ccd;border-radius:8px;box-shadow:0 4px 18px rgba(0,0,0,.15);font:14px/1.45 system-ui,sans-serif;white-space:pre-wrap");
    box.textContent = "…";
    box.onclick = () => box.remove();
    document.body.append(box);
    const p = chrome.runtime.connect({ name: "translate" });
    p.onMessage.addListener((m) => {
      if (m.type === "text" || m.type === "done") box.textContent = m.text;
      if (m.type === "error") box.textContent = m.message;
      if (m.type === "done" || m.type === "error") p.disconnect();
    });
    // The user's own request: ahead of every page's queue.
    p.postMessage({ type: "block", id: 0, text, user: true });
  }

  // Settings come from the service worker (it merges the baked-in defaults, and chrome.storage
  // is closed to content scripts: see background.js).
  chrome.runtime.sendMessage({ type: "settings" }).then((s) => {
    if (s?.parallel >= 1) limit = Math.min(32, s.parallel | 0);
    if (s?.autoTranslate) translatePage(s.target);
  }).catch(() => {});
})();
