// Extension settings in chrome.storage.local, over the defaults baked in by scripts/build-extension.
import DEFAULTS from "./defaults.js";

export async function getSettings() {
  const s = await chrome.storage.local.get(["modelUrl", "target", "source", "glossary", "autoTranslate", "maxTokens", "parallel"]);
  return { ...DEFAULTS, ...Object.fromEntries(Object.entries(s).filter(([, v]) => v !== undefined && v !== "")) };
}

export async function setSettings(s) {
  await chrome.storage.local.set(s);
}
