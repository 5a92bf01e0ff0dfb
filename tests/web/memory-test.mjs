// Unit test of www/extension/memory.js (run by tests/extension.rs with node): a translation met
// again comes from the memory, keys separate model/languages/glossary, the least recently used
// entries go first past the bound, and a failing store only misses.
import assert from "node:assert/strict";
import { translationMemory, mapStore } from "../../www/extension/memory.js";

let clock = 0;
const store = mapStore();
const tm = translationMemory({ store, maxEntries: 100, now: () => ++clock });
const k = (text, to = "lv", glossary = []) => tm.key("m.gguf", "en", to, glossary, text);
assert.equal(await tm.get(k("Home")), null);
await tm.put(k("Home"), "Sākums");
assert.equal(await tm.get(k("Home")), "Sākums");
assert.equal(await tm.get(k("Home", "lt")), null, "another target");
assert.equal(await tm.get(k("Home", "lv", [["Home", "Mājas"]])), null, "another glossary");
assert.notEqual(tm.key("a", "en", "lv", [], "x"), tm.key("b", "en", "lv", [], "x"), "another model");
// Past 100 entries, the least recently used go; "Home", read just now, stays.
for (let i = 0; i < 200; i++) {
  await tm.put(k(`line ${i}`), `rinda ${i}`);
  if (i % 10 === 0) await tm.get(k("Home"));
}
const n = await tm.size();
assert.ok(n <= 100 + 64, `bounded: ${n}`);
assert.equal(await tm.get(k("Home")), "Sākums", "recently used kept");
assert.equal(await tm.get(k("line 0")), null, "oldest dropped");
assert.equal(await tm.get(k("line 199")), "rinda 199");
await tm.clear();
assert.equal(await tm.size(), 0);
// A store that throws: misses, no error.
const broken = translationMemory({ store: { get: async () => { throw new Error("blocked"); }, put: async () => { throw new Error("quota"); }, count: async () => { throw new Error("x"); } } });
assert.equal(await broken.get("k"), null);
await broken.put("k", "v");
assert.equal(await broken.size(), 0);
console.log("memory.js: ok");
