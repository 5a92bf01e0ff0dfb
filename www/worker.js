// The engine in a dedicated Web Worker (see worker-proxy.js for the page side).
import { createEngineInThread } from "./tildeopen.js";

let engine = null;
const streams = new Map();

onmessage = async (e) => {
  const { id, op, args } = e.data;
  const reply = (m) => postMessage({ id, ...m });
  try {
    switch (op) {
      case "load":
        engine = await createEngineInThread({ ...args, worker: false, onProgress: (p) => reply({ progress: p }) });
        return reply({ result: { modelName: engine.modelName, contextSize: engine.contextSize, kvCache: engine.kvCache, parallel: engine.parallel, adapter: engine.adapter, adapterInfo: engine.adapterInfo, fastPaths: engine.fastPaths } });
      case "create": {
        const r = await engine.chat.completions.create(args);
        if (!args.stream) return reply({ result: r });
        streams.set(args.streamId, r);
        return reply({ result: null });
      }
      case "count":
        return reply({ result: await engine.countTokens(args) });
      case "stats":
        return reply({ result: await engine.stats() });
      case "next": {
        const it = streams.get(args.streamId);
        const r = it ? await it.next() : { done: true };
        if (r.done) streams.delete(args.streamId);
        return reply({ result: r });
      }
      case "return": {
        const it = streams.get(args.streamId);
        streams.delete(args.streamId);
        if (it) await it.return();
        return reply({ result: null });
      }
    }
    throw new Error(`unknown op ${op}`);
  } catch (err) {
    reply({ error: err?.message ?? String(err) });
  }
};
