import { getSettings, setSettings } from "./settings.js";
import { LANGUAGES } from "./languages.js";

const $ = (id) => document.getElementById(id);
const s = await getSettings();
for (const [code, name] of Object.entries(LANGUAGES)) $("target").add(new Option(name, code, code === s.target, code === s.target));
const [tab] = await chrome.tabs.query({ active: true, currentWindow: true });
const send = (m) => chrome.tabs.sendMessage(tab.id, m).catch(() => null);

async function show(st) {
  if (!st) { $("status").textContent = "This page cannot be translated."; return; }
  const rate = st.seconds ? `${(st.tokens / st.seconds).toFixed(1)} tokens/s` : "";
  const load = st.loading && st.loading.total && st.loading.loaded < st.loading.total ? `loading model ${Math.round((100 * st.loading.loaded) / st.loading.total)}%\n` : "";
  let error = st.error;
  // The page only has a generic message for a failed load; the service worker tells the popup why.
  if (error && st.errorCode && st.errorFatal) {
    const last = await chrome.runtime.sendMessage({ type: "last-error" }).catch(() => null);
    if (last?.detail && last.code === st.errorCode) error += `\n${last.detail}`;
  }
  $("status").textContent = error ? error : `${load}${st.done} of ${st.blocks} blocks translated ${rate}`;
}
$("target").onchange = () => setSettings({ target: $("target").value });
$("translate").onclick = async () => show(await send({ type: "translate", target: $("target").value }));
$("original").onclick = async () => show(await send({ type: "show-original" }));
setInterval(async () => show(await send({ type: "status" })), 1000);
show(await send({ type: "status" }));
