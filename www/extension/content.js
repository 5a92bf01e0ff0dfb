// Content script: finds the page's visible text blocks, has the extension's engine translate them
// (streamed, one block at a time, first screen first) and writes each translation back into the
// block's own text nodes, so elements, attributes, links and inline formatting stay as they were.
(() => {
  if (window.__tildeopen) return;
  window.__tildeopen = true;

  const MARK = " […]"; // as in whole.js: a part that could not be translated whole
  const SKIP = "[data-tildeopen-ui],script,style,noscript,template,code,pre,kbd,samp,textarea,input,select,option,svg,math,iframe,[contenteditable=''],[contenteditable=true],[translate=no],.notranslate";
  const original = new Map();   // Text node -> its original text
  const translated = new Map(); // Text node -> its translation
  const queued = new WeakSet();
  let showing = "original";
  let port = null, queue = [], running = false, writing = false;
  const stats = { blocks: 0, done: 0, tokens: 0, seconds: 0, error: null, loading: null };

  const isInline = (el) => {
    const d = getComputedStyle(el).display;
    return d === "inline" || d === "contents";
  };
  const visible = (el) => {
    const s = getComputedStyle(el);
    return s.visibility !== "hidden" && s.display !== "none" && el.getClientRects().length > 0;
  };

  /** Blocks (element + its text nodes) not yet queued, first screen first, then reading order. */
  function collect(root) {
    const byBlock = new Map();
    const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT, {
      acceptNode: (t) => (t.data.trim() && !original.has(t) && t.parentElement && !t.parentElement.closest(SKIP) ? NodeFilter.FILTER_ACCEPT : NodeFilter.FILTER_REJECT),
    });
    for (let t = walker.nextNode(); t; t = walker.nextNode()) {
      let block = t.parentElement;
      while (block.parentElement && isInline(block)) block = block.parentElement;
      if (!visible(t.parentElement)) continue;
      if (!byBlock.has(block)) byBlock.set(block, []);
      byBlock.get(block).push(t);
    }
    const blocks = [...byBlock.entries()].map(([el, nodes]) => ({ el, nodes })).filter((b) => !b.nodes.every((n) => queued.has(n)));
    const onScreen = (b) => { const r = b.el.getBoundingClientRect(); return r.bottom > 0 && r.top < innerHeight; };
    return [...blocks.filter(onScreen), ...blocks.filter((b) => !onScreen(b))];
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

  // Changes the page's text without the MutationObserver taking it for new page content.
  function quietly(f) {
    writing = true;
    try { f(); } finally { writing = false; }
  }

  function write(nodes, texts) {
    quietly(() => nodes.forEach((n, i) => { translated.set(n, texts[i]); if (showing === "translation") n.data = texts[i]; }));
  }

  // Undoes a block's partial streamed text: back to what the page showed before it.
  function restore(nodes) {
    quietly(() => nodes.forEach((n) => (n.data = showing === "translation" && translated.has(n) ? translated.get(n) : original.get(n))));
  }

  function connect() {
    port = chrome.runtime.connect({ name: "translate" });
    port.onMessage.addListener(onMessage);
    // The service worker restarted or the extension reloaded: put the block in flight back
    // (original text, front of the queue) and carry on with a new port.
    port.onDisconnect.addListener(() => {
      port = null;
      if (current) {
        restore(current.nodes);
        queue.unshift({ el: current.el, nodes: current.nodes });
        current = null;
      }
      running = false;
      setTimeout(pump, 500);
    });
  }

  let current = null;
  function onMessage(m) {
    if (m.type === "progress") { stats.loading = m; return; }
    if (!current || m.id !== current.id) return;
    if (m.type === "text") {
      // The block's whole text so far (earlier parts of a split block + the part in progress).
      current.text = m.text;
      // Stream into the block's first text node; the rest follows at the end of the block.
      if (showing === "translation") quietly(() => (current.nodes[0].data = current.text));
    } else if (m.type === "done" || m.type === "error") {
      if (m.type === "done") {
        // The final text: whole, or with the original and a visible mark where a part could
        // not be finished.
        current.text = m.text;
        const originals = current.nodes.map((n) => original.get(n));
        if (m.text === current.sent + MARK || !m.text.trim()) {
          // Nothing of it could be finished: the page's own text, exactly, and the mark.
          if (m.text.trim()) originals[originals.length - 1] = originals[originals.length - 1].trimEnd() + MARK;
          write(current.nodes, originals);
        } else write(current.nodes, distribute(current.nodes, current.text));
        stats.done++; stats.tokens += m.tokens; stats.seconds += m.seconds;
      } else {
        stats.error = m.message;
        restore(current.nodes);
      }
      current = null;
      running = false;
      pump();
    }
  }

  let nextId = 1;
  function pump() {
    if (showing !== "translation") return;
    if (running || !queue.length) {
      if (!running && !queue.length && stats.blocks) {
        document.documentElement.setAttribute("data-tildeopen", showing === "translation" ? "translated" : "original");
        // How many text nodes the script keeps (their originals): follows the page's live text.
        document.documentElement.setAttribute("data-tildeopen-nodes", String(original.size));
      }
      return;
    }
    const b = queue.shift();
    if (!b.el.isConnected) return pump();
    if (!port) connect();
    running = true;
    document.documentElement.setAttribute("data-tildeopen", "translating");
    const text = b.nodes.map((n) => original.get(n)).join("").replace(/\s+/g, " ").trim();
    current = { id: nextId++, el: b.el, nodes: b.nodes, text: "", sent: text };
    port.postMessage({ type: "block", id: current.id, text, target: stats.target });
  }

  // Forgets text nodes the page has removed (a feed or a clock re-rendering), so memory follows
  // what is on the page, not everything it ever showed.
  function prune() {
    const live = (n) => n.isConnected || current?.nodes.includes(n);
    for (const n of original.keys()) if (!live(n)) { original.delete(n); translated.delete(n); }
    queue = queue.filter((b) => b.el.isConnected);
  }

  function enqueue(root) {
    prune();
    for (const b of collect(root)) {
      b.nodes = b.nodes.filter((n) => !queued.has(n));
      if (!b.nodes.length) continue;
      for (const n of b.nodes) { queued.add(n); original.set(n, n.data); }
      queue.push(b);
      stats.blocks++;
    }
    pump();
  }

  function translatePage(target) {
    if (target) stats.target = target;
    showing = "translation";
    quietly(() => { for (const [n, t] of translated) n.data = t; });
    enqueue(document.body);
  }

  function showOriginal() {
    showing = "original"; // the queue waits (pump() sends nothing) until "translate" again
    quietly(() => { for (const [n, o] of original) n.data = o; });
    document.documentElement.setAttribute("data-tildeopen", "original");
  }

  // Text the page adds later (infinite scroll, SPA navigation) is translated too.
  let pending = null;
  new MutationObserver((records) => {
    if (writing || showing !== "translation") return;
    if (!records.some((r) => r.type === "childList" && r.addedNodes.length)) return;
    clearTimeout(pending);
    pending = setTimeout(() => enqueue(document.body), 300);
  }).observe(document.documentElement, { childList: true, subtree: true });

  chrome.runtime.onMessage.addListener((m, _sender, reply) => {
    if (m.type === "translate") translatePage(m.target);
    else if (m.type === "show-original") showOriginal();
    else if (m.type === "translate-selection") translateSelection(m.text);
    reply({ showing, ...stats, queued: queue.length });
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
    p.postMessage({ type: "block", id: 0, text });
  }

  // Settings come from the service worker (it merges the baked-in defaults; reading storage
  // here could race its first start).
  chrome.runtime.sendMessage({ type: "settings" }).then((s) => {
    if (s?.autoTranslate) translatePage(s.target);
  }).catch(() => {});
})();
