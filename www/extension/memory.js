// The translation memory: (model, source language, target language, glossary, text) ->
// translation (any structured-clonable value: the service worker keeps the text, whether it was
// whole and the max_tokens it was made with), so a string met again (a menu, a footer, a reload, another page of the site) is
// never sent to the engine twice. Kept in IndexedDB (it survives restarts), bounded by entries
// with the least recently used dropped first. The logic is pure over a small store interface,
// tested with node (tests/web/memory-test.mjs) on `mapStore`.

/** Entries kept at most (a few MB of text: a translation is a block's worth). */
export const MAX_ENTRIES = 20_000;

/** `store`: `{ get(k) -> {text, at} | undefined, put(k, {text, at}), count(), oldest(n) -> keys,
 *  delete(keys), clear() }`, all async. `get` marks an entry used; `put` drops the least
 *  recently used tenth once there are more than `maxEntries`. A store that fails (storage
 *  blocked, quota) makes the memory miss, never the translation fail. */
export function translationMemory({ store, maxEntries = MAX_ENTRIES, now = () => Date.now() }) {
  let puts = 0;
  const safe = async (f, fallback) => { try { return await f(); } catch { return fallback; } };
  return {
    key: (model, source, target, glossary, text) => JSON.stringify([model, source, target, glossary ?? [], text]),
    async get(key) {
      return safe(async () => {
        const e = await store.get(key);
        if (!e) return null;
        await store.put(key, { text: e.text, at: now() });
        return e.text;
      }, null);
    },
    async put(key, text) {
      await safe(async () => {
        await store.put(key, { text, at: now() });
        // Counting on every put would cost a transaction each: every 64th, and the first.
        if (puts++ % 64 !== 0) return;
        const n = await store.count();
        if (n > maxEntries) await store.delete(await store.oldest(n - Math.floor(maxEntries * 0.9)));
      });
    },
    size: () => safe(() => store.count(), 0),
    clear: () => safe(() => store.clear()),
  };
}

/** A store in a Map (tests; and where IndexedDB is not there). */
export function mapStore() {
  const m = new Map();
  return {
    get: async (k) => m.get(k),
    put: async (k, v) => void m.set(k, v),
    count: async () => m.size,
    oldest: async (n) => [...m.entries()].sort((a, b) => a[1].at - b[1].at).slice(0, n).map((e) => e[0]),
    delete: async (keys) => keys.forEach((k) => m.delete(k)),
    clear: async () => m.clear(),
  };
}

/** A store in IndexedDB database `name` (object store "tm", an index on last use). */
export function idbStore(name = "tildeopen-memory") {
  let db = null;
  const open = () => (db ??= new Promise((ok, err) => {
    const r = indexedDB.open(name, 1);
    r.onupgradeneeded = () => r.result.createObjectStore("tm").createIndex("at", "at");
    r.onsuccess = () => ok(r.result);
    r.onerror = () => { db = null; err(r.error); };
  }));
  const tx = async (mode, f) => {
    const d = await open();
    return new Promise((ok, err) => {
      const t = d.transaction("tm", mode);
      const result = f(t.objectStore("tm"));
      t.oncomplete = () => ok(result.value);
      t.onerror = t.onabort = () => err(t.error);
    });
  };
  const req = (r, out) => { r.onsuccess = () => (out.value = r.result); };
  return {
    get: (k) => tx("readonly", (s) => { const out = {}; req(s.get(k), out); return out; }),
    put: (k, v) => tx("readwrite", (s) => { s.put(v, k); return {}; }),
    count: () => tx("readonly", (s) => { const out = {}; req(s.count(), out); return out; }),
    oldest: (n) => tx("readonly", (s) => {
      const out = { value: [] };
      const c = s.index("at").openKeyCursor();
      c.onsuccess = () => {
        const cur = c.result;
        if (!cur || out.value.length >= n) return;
        out.value.push(cur.primaryKey);
        cur.continue();
      };
      return out;
    }),
    delete: (keys) => tx("readwrite", (s) => { for (const k of keys) s.delete(k); return {}; }),
    clear: () => tx("readwrite", (s) => { s.clear(); return {}; }),
  };
}
