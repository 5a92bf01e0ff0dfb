// The service worker: owns the engine (WebGPU in the worker, one engine for every tab) and
// translates blocks for content scripts over ports, streaming chunks back.
import { createEngineInThread } from "./tildeopen.js";
import { getSettings } from "./settings.js";
import DEFAULTS from "./defaults.js";
import { serialQueue } from "./util.js";
import { LANGUAGES } from "./languages.js";
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
const engines = engineCache({ create: (url, onProgress) => createEngineInThread({ model: url, worker: false, onProgress }) });

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

// One request at a time across all tabs (the engine answers one at a time anyway), tabs taking
// turns per request: a tab's long block, split into many requests, does not hold up the others.
const turn = turns();

chrome.runtime.onConnect.addListener((port) => {
  if (port.name !== "translate") return;
  let closed = false, current = null;
  const blocks = serialQueue(); // this tab's blocks, one after another
  port.onDisconnect.addListener(() => {
    closed = true;
    current?.return?.();
    turn.drop(port, new Error("disconnected"));
  });
  const post = (m) => !closed && port.postMessage(m);
  port.onMessage.addListener((msg) => {
    if (msg?.type === "block") blocks(() => translateBlock(msg));
  });

  async function translateBlock(msg) {
    if (closed) return;
    try {
      const settings = await getSettings();
      // Only the languages the extension offers reach the instruction.
      const to = msg.target || settings.target;
      const from = settings.source || "en";
      if (!Object.hasOwn(LANGUAGES, to) || !Object.hasOwn(LANGUAGES, from)) throw new Error(`unsupported language ${JSON.stringify(to)}`);
      if (typeof msg.text !== "string" || !msg.text) throw new Error("nothing to translate");
      const t0 = performance.now();
      const maxTokens = settings.maxTokens || 512;
      let n = 0;
      // One request, in this tab's turn: streamed, its partial text reported; `cut` when it
      // stopped at max_tokens.
      const translate = (text, onPartial) => turn.run(port, async () => {
        if (closed) throw new Error("disconnected");
        const eng = await getEngine((p) => post({ type: "progress", loaded: p.loaded, total: p.total }));
        let out = "", finish = null;
        try {
          current = await eng.tasks.translate({
            text, from, to,
            glossary: settings.glossary ?? [], stream: true, temperature: 0, max_tokens: maxTokens,
          });
          for await (const chunk of current) {
            if (closed) throw new Error("disconnected");
            const d = chunk.choices[0]?.delta?.content;
            if (d) { n++; out += d; onPartial(out); }
            finish = chunk.choices[0]?.finish_reason ?? finish;
          }
        } catch (e) {
          engines.failed(eng, e); // a lost device or an unloaded engine: the next request reloads
          throw e;
        } finally {
          current = null;
        }
        return { text: out, cut: finish === "length" };
      });
      // A block longer than one answer (or than the context) is split and translated part by
      // part, in at most a few requests per part; a part that cannot finish keeps its original
      // text with a visible mark (see whole.js).
      const r = await translateWhole(translate, msg.text, {
        splitAbove: maxTokens,
        onText: (text) => post({ type: "text", id: msg.id, text }),
      });
      post({ type: "done", id: msg.id, text: r.text, target: to, tokens: n, seconds: (performance.now() - t0) / 1000, complete: r.complete, requests: r.requests, capped: r.capped });
    } catch (e) {
      post({ type: "error", id: msg.id, ...pageError(e) });
    }
  }
});

chrome.runtime.onMessage.addListener((m, sender, reply) => {
  if (m?.type === "settings") {
    // Content scripts get what they act on; the model URL and the glossary stay here.
    getSettings().then((s) => reply(sender.tab ? { autoTranslate: s.autoTranslate, target: s.target } : s));
    return true; // async reply
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
