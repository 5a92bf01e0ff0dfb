import { getSettings, setSettings } from "./settings.js";
import { LANGUAGES } from "./languages.js";

const $ = (id) => document.getElementById(id);
const s = await getSettings();
for (const [code, name] of Object.entries(LANGUAGES)) {
  $("source").add(new Option(name, code, code === s.source, code === s.source));
  $("target").add(new Option(name, code, code === s.target, code === s.target));
}
$("modelUrl").value = s.modelUrl ?? "";
$("glossary").value = (s.glossary ?? []).map(([a, b]) => `${a} = ${b}`).join("\n");
$("autoTranslate").checked = !!s.autoTranslate;
$("parallel").value = String(s.parallel ?? 4);
$("save").onclick = async () => {
  const glossary = $("glossary").value.split("\n").map((l) => l.split("=").map((x) => x.trim())).filter((p) => p.length === 2 && p[0] && p[1]);
  await setSettings({ modelUrl: $("modelUrl").value.trim(), source: $("source").value, target: $("target").value, glossary, autoTranslate: $("autoTranslate").checked, parallel: Number($("parallel").value) });
  $("saved").textContent = "Saved.";
};
