// The service worker: owns the engine (WebGPU in the worker, one engine for every tab) and
// translates blocks for content scripts over ports, streaming chunks back.
import { createEngineInThread } from "./tildeopen.js";
import { getSettings } from "./settings.js";
import DEFAULTS from "./defaults.js";
import { serialQueue } from "./util.js";
import { LANGUAGES } from "./languages.js";
import { translateWhole } from "./whole.js";

// Defaults baked in by scripts/build-extension fill in what the options page has not set
// (content scripts read chrome.storage directly).
chrome.storage.local.get(Object.keys(DEFAULTS)).then((s) => {
  const missing = Object.fromEntries(Object.entries(DEFAULTS).filter(([k]) => s[k] === undefined));
  if (Object.keys(missing).length) chrome.storage.local.set(missing);
});

let engine = null, engineUrl = null, loading = null;

async function getEngine(onProgress) {
  const { modelUrl } = await getSettings();
  if (!modelUrl) throw new Error("Set a model URL in the extension's options.");
  if (engine && engineUrl === modelUrl) return engine;
  if (!loading) {
    loading = (async () => {
      const old = engine;
      engine = engineUrl = null;
      await old?.unload();
      engine = await createEngineInThread({ model: modelUrl, worker: false, onProgress });
      engineUrl = modelUrl;
      return engine;
    })().finally(() => (loading = null));
  }
  return loading;
}

// One block at a time across all tabs (the engine answers one request at a time anyway).
const serial = serialQueue();

chrome.runtime.onConnect.addListener((port) => {
  if (port.name !== "translate") return;
  let closed = false, current = null;
  port.onDisconnect.addListener(() => { closed = true; current?.return?.(); });
  port.onMessage.addListener(async (msg) => {
    if (msg.type !== "block") return;
    await serial(async () => {
      if (closed) return;
      try {
        const settings = await getSettings();
        // Only the languages the extension offers reach the instruction.
        const to = msg.target || settings.target;
        const from = settings.source || "en";
        if (!Object.hasOwn(LANGUAGES, to) || !Object.hasOwn(LANGUAGES, from)) throw new Error(`unsupported language ${JSON.stringify(to)}`);
        if (typeof msg.text !== "string" || !msg.text) throw new Error("nothing to translate");
        const eng = await getEngine((p) => !closed && port.postMessage({ type: "progress", ...p }));
        const t0 = performance.now();
        const maxTokens = settings.maxTokens || 512;
        let n = 0;
        // One request: streamed, its partial text reported; `cut` when it stopped at max_tokens.
        const translate = async (text, onPartial) => {
          let out = "", finish = null;
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
          return { text: out, cut: finish === "length" };
        };
        // A block longer than one answer is split and translated part by part; a part that
        // cannot finish keeps its original text with a visible mark (see whole.js).
        const r = await translateWhole(translate, msg.text, {
          splitAbove: maxTokens,
          onText: (text) => !closed && port.postMessage({ type: "text", id: msg.id, text }),
        });
        if (!closed) port.postMessage({ type: "done", id: msg.id, text: r.text, tokens: n, seconds: (performance.now() - t0) / 1000, complete: r.complete, requests: r.requests });
      } catch (e) {
        if (!closed) port.postMessage({ type: "error", id: msg.id, message: e.message ?? String(e) });
      } finally {
        current = null;
      }
    });
  });
});

chrome.runtime.onMessage.addListener((m, _sender, reply) => {
  if (m?.type !== "settings") return false;
  getSettings().then(reply);
  return true; // async reply
});

chrome.runtime.onInstalled.addListener(() => {
  chrome.contextMenus.create({ id: "tildeopen-selection", title: "Translate selection with TildeOpen", contexts: ["selection"] });
});

chrome.contextMenus.onClicked.addListener((info, tab) => {
  if (info.menuItemId === "tildeopen-selection" && tab?.id !== undefined) {
    chrome.tabs.sendMessage(tab.id, { type: "translate-selection", text: info.selectionText });
  }
});
