// How the service worker shares its one engine between tabs: turns per request, one cached
// engine that is dropped when its device is lost, load failures remembered for a while, and
// error messages fit for a page (no URLs). Pure logic, tested with node (tests/web/share-test.mjs).

/** Turns between clients (the ports of the tabs): `run(client, f, { first })` queues `f` and
 *  resolves to its result; up to `limit` run at once (the engine's parallel slots), and each
 *  freed place goes to the next client in rotation, so a client that queues request after
 *  request (a long block split in parts, a whole page) does not keep the others waiting for all
 *  of them. `first`: the user's own request (a selection) goes before every queued one.
 *  `setLimit(n)`: places from now on. `drop(client, error)` rejects what that client still has
 *  queued. */
export function turns(limit = 1) {
  const waiting = new Map(); // client -> [{ f, ok, err }]; insertion order is the rotation
  const urgent = []; // jobs with `first`, in order
  let busy = 0;
  function next() {
    while (busy < limit) {
      let job, client;
      if (urgent.length) job = urgent.shift();
      else {
        const first = waiting.entries().next();
        if (first.done) return;
        let jobs;
        [client, jobs] = first.value;
        job = jobs.shift();
        waiting.delete(client);
        if (jobs.length) waiting.set(client, jobs); // to the back of the rotation
      }
      busy++;
      Promise.resolve().then(job.f).then(job.ok, job.err).finally(() => {
        busy--;
        // What the client queued while its request ran waits behind the others.
        const more = client !== undefined && waiting.get(client);
        if (more) { waiting.delete(client); waiting.set(client, more); }
        next();
      });
    }
  }
  return {
    run(client, f, { first = false } = {}) {
      return new Promise((ok, err) => {
        if (first) urgent.push({ f, ok, err, client });
        else {
          if (!waiting.has(client)) waiting.set(client, []);
          waiting.get(client).push({ f, ok, err });
        }
        next();
      });
    },
    setLimit(n) {
      limit = Math.max(1, n | 0);
      next();
    },
    get limit() { return limit; },
    drop(client, error = new Error("disconnected")) {
      const jobs = waiting.get(client) ?? [];
      waiting.delete(client);
      for (let i = urgent.length - 1; i >= 0; i--) if (urgent[i].client === client) jobs.push(...urgent.splice(i, 1));
      for (const j of jobs) j.err(error);
    },
  };
}

/** The message of an error: an engine error's body message (its `message` is the JSON body),
 *  else the plain message. */
export function errorText(e) {
  const m = e?.message ?? String(e);
  try {
    const body = JSON.parse(m)?.error;
    if (typeof body?.message === "string") return body.message;
  } catch {}
  return m;
}

/** `s` with every URL (scheme://..., a signed URL's query string included) replaced by `<URL>`. */
export function stripUrls(s) {
  return String(s).replace(/\b[a-z][a-z0-9+.-]*:\/\/[^\s"'<>]*/gi, "<URL>");
}

const RELOAD = new Set(["device_lost", "unloaded"]);

/** An error of loading the engine: `code` (the engine's, else `load_failed`), `detail` (the whole
 *  message, URLs included: for the popup and the console only). */
function loadError(e) {
  const code = e?.code ?? "load_failed";
  const err = new Error(`the model could not be loaded (${code})`);
  Object.assign(err, { load: true, fatal: true, code, detail: errorText(e) });
  return err;
}

/** What a content script (and so the page) gets of an error: `{ message, code, fatal, retry }`.
 *  A load error is a generic message with its code (its details stay in the service worker and
 *  the popup); any other message has its URLs stripped. `fatal`: later blocks would fail the
 *  same way (stop the queue); `retry`: the engine was dropped (device lost), a new try loads it
 *  again. */
export function pageError(e) {
  const code = e?.code ?? null;
  if (e?.load) return { message: `The model could not be loaded (${code}); the extension's popup shows why.`, code, fatal: true, retry: false };
  return { message: stripUrls(errorText(e)), code, fatal: !!e?.fatal, retry: RELOAD.has(code) };
}

/** One engine at a time, for the model URL asked for. `create(url, onProgress)` loads one.
 *  `get(url, onProgress)` returns the loaded engine (loading it, or a new URL's, first); a load
 *  that failed is remembered for `backoffMs` and `get` for that URL fails at once with the same
 *  error meanwhile. `failed(engine, error)`: a request failed; on `device_lost` or `unloaded` the
 *  engine is dropped (and unloaded) so the next `get` loads it again; true when dropped.
 *  `lastError`: `{ code, detail, at }` of the last load failure (URLs included), or null. */
export function engineCache({ create, now = () => Date.now(), backoffMs = 30_000 }) {
  let engine = null, engineUrl = null, loading = null;
  const failures = new Map(); // url -> { error, until }
  const cache = {
    lastError: null,
    async get(url, onProgress) {
      for (;;) {
        if (engine && engineUrl === url) return engine;
        const f = failures.get(url);
        if (f && now() < f.until) throw f.error;
        if (!loading) break;
        await loading.catch(() => {});
      }
      loading = (async () => {
        const old = engine;
        engine = engineUrl = null;
        if (old) await Promise.resolve().then(() => old.unload()).catch(() => {});
        try {
          const e = await create(url, onProgress);
          failures.delete(url);
          engine = e;
          engineUrl = url;
          return e;
        } catch (e) {
          const err = loadError(e);
          failures.set(url, { error: err, until: now() + backoffMs });
          cache.lastError = { code: err.code, detail: err.detail, at: now() };
          throw err;
        }
      })().finally(() => (loading = null));
      return loading;
    },
    failed(eng, error) {
      if (!eng || eng !== engine || !RELOAD.has(error?.code)) return false;
      engine = engineUrl = null;
      Promise.resolve().then(() => eng.unload()).catch(() => {});
      return true;
    },
  };
  return cache;
}
