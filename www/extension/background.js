// The service worker: owns the engine (WebGPU in the worker, one engine for every tab) and
// translates blocks for content scripts over ports, streaming chunks back.
import { createEngineInThread, detectLanguage } from "./tildeopen.js";
import { getSettings } from "./settings.js";
import DEFAULTS from "./defaults.js";
import { LANGUAGES, sourceLanguage } from "./languages.js";
import { translationMemory, idbStore } from "./memory.js";
import { translateWhole } from "./whole.js";
import { engineCache, turns, pageError } from "./share.js";

// The settings (the model URL, perhaps a signed one, and the glossary) are for the extension's
// own pages and this worker: content scripts get what they act on by message ("settings"
// below). chrome.storage.local is open to content scripts by default; this closes it to them
// (Chrome 140+ for the local area; older versions reject it, leaving it readable from the
// content-script world, never from the page's own scripts). The browser keeps the level; it is
// set again at each start.
chrome.storage.local.setAccessLevel?.({ accessLevel: "TRUSTED_CONTEXTS" })?.catch((e) => console.warn(`TildeOpen: storage access level: ${e}`));

// Defaults baked in by scripts/build-extension fill in what the options page has not set.
chrome.storage.local.get(Object.keys(DEFAULTS)).then((s) => {
  const missing = Object.fromEntries(Object.entries(DEFAULTS).filter(([k]) => s[k] === undefined));
  if (Object.keys(missing).length) chrome.storage.local.set(missing);
});

// One engine for every tab; a lost device drops it (the next request loads it again) and a
// failed load is remembered for 30 s, during which requests for that URL fail at once.
// Blocks are translated `parallel` at a time in the engine's slots (the setting "blocks at
// once"); a block's context is 2048 tokens (whole.js splits what does not fit), so 8 slots cost
// what 4 of the default 4096 would.
const engines = engineCache({
  create: async (url, onProgress) => {
    const { parallel } = await getSettings();
    const e = await createEngineInThread({ model: url, worker: false, onProgress, parallel: Math.max(1, Math.min(32, parallel | 0 || 4)), ctxSize: 2048 });
    turn.setLimit(e.parallel);
    return e;
  },
});

// Translations already made, by model, languages, glossary and text (IndexedDB, least recently
// used dropped past 20,000): a block met again is never sent to the engine. The same text
// asked for again while its first translation is still running waits for that one.
const memory = translationMemory({ store: idbStore() });
const running = new Map(); // memory key -> promise of { text, complete }

async function getEngine(onProgress) {
  const { modelUrl } = await getSettings();
  if (!modelUrl) throw Object.assign(new Error("Set a model URL in the extension's options."), { code: "no_model", fatal: true });
  try {
    return await engines.get(modelUrl, onProgress);
  } catch (e) {
    // The details (URLs, perhaps a signed one) go to this console and the popup, not to pages.
    if (e.load) console.warn(`TildeOpen: ${e.detail}`);
    throw e;
  }
}

// Up to the engine's parallel slots in flight across all tabs (one until it has loaded), tabs
// taking turns per request: a tab's long block or whole page does not hold up the others, and a
// selection the user asked for goes first.
const turn = turns(1);

chrome.runtime.onConnect.addListener((port) => {
  if (port.name !== "translate") return;
  let closed = false, pageLanguage = null;
  const live = new Set(); // streams in flight, ended when the tab goes
  port.onDisconnect.addListener(() => {
    closed = true;
    for (const it of live) it.return?.();
    turn.drop(port, new Error("disconnected"));
  });
  const post = (m) => !closed && port.postMessage(m);
  // Blocks arrive up to "blocks at once" at a time and run side by side.
  port.onMessage.addListener((msg) => {
    if (msg?.type === "block") translateBlock(msg);
  });

  async function translateBlock(msg) {
    if (closed) return;
    try {
      const settings = await getSettings();
      // Only the languages the extension offers reach the instruction.
      const to = msg.target || settings.target;
      if (!Object.hasOwn(LANGUAGES, to)) throw new Error(`unsupported language ${JSON.stringify(to)}`);
      if (typeof msg.text !== "string" || !msg.text) throw new Error("nothing to translate");
      const t0 = performance.now();
      // The source: the block's `lang` where the page gives one, else the detector's reliable
      // guess, else the tab's first reliable guess, else the setting. Text already in the target
      // language is left as it is (no request).
      const detected = await detectLanguage(msg.text).catch(() => null);
      if (detected?.reliable && !msg.lang) pageLanguage ??= detected.language;
      const from = sourceLanguage({ lang: msg.lang, detected, page: pageLanguage, fallback: settings.source || "en" });
      if (from === to) {
        post({ type: "done", id: msg.id, text: msg.text, target: to, source: from, tokens: 0, seconds: 0, complete: true, requests: 0, same: true });
        return;
      }
      const glossary = settings.glossary ?? [];
      const maxTokens = settings.maxTokens || 512;
      const key = memory.key(settings.modelUrl, from, to, glossary, msg.text);
      // A remembered translation is used when it was whole, or when it was cut (greedy: the
      // same answer again) at a max_tokens at least today's; a larger max_tokens tries again.
      const known = await memory.get(key);
      if (known && typeof known.text === "string" && (known.complete || known.maxTokens >= maxTokens)) {
        post({ type: "done", id: msg.id, text: known.text, target: to, source: from, tokens: 0, seconds: (performance.now() - t0) / 1000, complete: known.complete, requests: 0, cached: true });
        return;
      }
      const shared = running.get(key);
      // (If that one fails, its tab closed say, this block is translated on its own.)
      const r0 = shared && (await shared.catch(() => null));
      if (r0) {
        post({ type: "done", id: msg.id, text: r0.text, target: to, source: from, tokens: 0, seconds: (performance.now() - t0) / 1000, complete: r0.complete, requests: 0, cached: true });
        return;
      }
      let n = 0;
      // One request, in this tab's turn: streamed, its partial text reported; `cut` when it
      // stopped at max_tokens.
      const translate = (text, onPartial) => turn.run(port, async () => {
        if (closed) throw new Error("disconnected");
        const eng = await getEngine((p) => post({ type: "progress", loaded: p.loaded, total: p.total }));
        let out = "", finish = null, it = null;
        try {
          it = await eng.tasks.translate({
            text, from, to,
            glossary, stream: true, temperature: 0, max_tokens: maxTokens,
          });
          live.add(it);
          for await (const chunk of it) {
            if (closed) throw new Error("disconnected");
            const d = chunk.choices[0]?.delta?.content;
            if (d) { n++; out += d; onPartial(out); }
            finish = chunk.choices[0]?.finish_reason ?? finish;
          }
        } catch (e) {
          engines.failed(eng, e); // a lost device or an unloaded engine: the next request reloads
          throw e;
        } finally {
          live.delete(it);
        }
        return { text: out, cut: finish === "length" };
      }, { first: !!msg.user });
      // A block longer than one answer (or than the context) is split and translated part by
      // part, in at most a few requests per part; a part that cannot finish keeps its original
      // text with a visible mark (see whole.js).
      const whole = translateWhole(translate, msg.text, {
        splitAbove: maxTokens,
        onText: (text) => post({ type: "text", id: msg.id, text }),
      });
      running.set(key, whole);
      let r;
      try {
        r = await whole;
      } finally {
        running.delete(key);
      }
      await memory.put(key, { text: r.text, complete: r.complete, maxTokens });
      post({ type: "done", id: msg.id, text: r.text, target: to, source: from, tokens: n, seconds: (performance.now() - t0) / 1000, complete: r.complete, requests: r.requests, capped: r.capped });
    } catch (e) {
      post({ type: "error", id: msg.id, ...pageError(e) });
    }
  }
});

chrome.runtime.onMessage.addListener((m, sender, reply) => {
  if (m?.type === "settings") {
    // Content scripts get what they act on; the model URL and the glossary stay here.
    getSettings().then((s) => reply(sender.tab ? { autoTranslate: s.autoTranslate, target: s.target, parallel: s.parallel } : s));
    return true; // async reply
  }
  if (m?.type === "clear-memory" && !sender.tab) {
    // The popup's "Forget translations".
    memory.clear().then(() => reply({ ok: true }));
    return true;
  }
  if (m?.type === "memory-size" && !sender.tab) {
    memory.size().then((n) => reply({ entries: n }));
    return true;
  }
  if (m?.type === "last-error" && !sender.tab) {
    // For the popup: why the last load failed, URLs included (extension pages only).
    reply(engines.lastError);
    return false;
  }
  return false;
});

chrome.runtime.onInstalled.addListener(() => {
  chrome.contextMenus.create({ id: "tildeopen-selection", title: "Translate selection with TildeOpen", contexts: ["selection"] });
});

chrome.contextMenus.onClicked.addListener((info, tab) => {
  if (info.menuItemId === "tildeopen-selection" && tab?.id !== undefined) {
    chrome.tabs.sendMessage(tab.id, { type: "translate-selection", text: info.selectionText });
  }
});
