import { getSettings, setSettings } from "./settings.js";
import { LANGUAGES } from "./languages.js";

const $ = (id) => document.getElementById(id);
const s = await getSettings();
for (const [code, name] of Object.entries(LANGUAGES)) $("target").add(new Option(name, code, code === s.target, code === s.target));
const [tab] = await chrome.tabs.query({ active: true, currentWindow: true });
const send = (m) => chrome.tabs.sendMessage(tab.id, m).catch(() => null);

// Each status is numbered when asked for; one that comes back after a newer one was shown (a
// 1 s poll still waiting for the load error while a "translate" click's answer arrived) is
// dropped, so the popup never goes back to an older state.
let asked = 0, shown = 0;
async function update(msg) {
  const n = ++asked;
  const text = await describe(await send(msg));
  if (n < shown) return;
  shown = n;
  $("status").textContent = text;
}

async function describe(st) {
  if (!st) return "This page cannot be translated.";
  const rate = st.seconds ? `${(st.tokens / st.seconds).toFixed(1)} tokens/s` : "";
  const load = st.loading && st.loading.total && st.loading.loaded < st.loading.total ? `loading model ${Math.round((100 * st.loading.loaded) / st.loading.total)}%\n` : "";
  let error = st.error;
  // The page only has a generic message for a failed load; the service worker tells the popup why.
  if (error && st.errorCode && st.errorFatal) {
    const last = await chrome.runtime.sendMessage({ type: "last-error" }).catch(() => null);
    if (last?.detail && last.code === st.errorCode) error += `\n${last.detail}`;
  }
  const saved = st.cached ? `, ${st.cached} from saved translations` : "";
  return error ? error : `${load}${st.done} of ${st.blocks} blocks translated${saved} ${rate}`;
}
$("target").onchange = () => setSettings({ target: $("target").value });
$("translate").onclick = () => update({ type: "translate", target: $("target").value });
$("original").onclick = () => update({ type: "show-original" });
// The translation memory (IndexedDB in the service worker): its size on the button, emptied on click.
async function memorySize() {
  const r = await chrome.runtime.sendMessage({ type: "memory-size" }).catch(() => null);
  $("forget").textContent = `Forget saved translations${r ? ` (${r.entries})` : ""}`;
}
$("forget").onclick = async () => { await chrome.runtime.sendMessage({ type: "clear-memory" }).catch(() => null); memorySize(); };
memorySize();
setInterval(() => update({ type: "status" }), 1000);
update({ type: "status" });
