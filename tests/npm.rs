//! The npm package as a web developer uses it: `npm pack ./www`, install the tarball into a
//! scratch project next to esbuild and TypeScript (from npm), type-check a file against the
//! package's types, bundle a page that calls `createEngine` (in the page's thread and in the
//! package's worker) and run the bundle in headless Chromium on the tiny fixture: the answers
//! must equal the native CLI's. Needs `scripts/build-web`, npm and Debian's `chromium`.

mod common;
use common::fixtures;
mod browser;
use browser::WebRoot;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const ESBUILD: &str = "esbuild@0.28.2";
const TYPESCRIPT: &str = "typescript@5.9.3";

fn run(dir: &Path, cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).current_dir(dir).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn native(model: &Path, request: &str) -> String {
    let file = std::env::temp_dir().join(format!("tildeopen-npm-req-{}.json", std::process::id()));
    std::fs::write(&file, request).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen")).args(["chat", "--model", model.to_str().unwrap(), "--request", file.to_str().unwrap(), "--json"]).output().unwrap();
    std::fs::remove_file(&file).ok();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

const PAGE: &str = r#"import { createEngine, adapterInfo } from "tildeopen-wgpu";
const q = new URLSearchParams(location.search);
const report = (o) => fetch("/result", { method: "POST", body: JSON.stringify(o) });
try {
  const req = JSON.parse(q.get("request"));
  const a = await createEngine({ model: q.get("model"), worker: false });
  const plain = await a.chat.completions.create(req);
  const inThread = plain.choices[0].message.content;
  // A signal that never fires: the same object as without one (ids and times aside); one that
  // fires stops a long non-streamed request between tokens with an AbortError.
  const same = (x, y) => JSON.stringify({ ...x, id: 0, created: 0 }) === JSON.stringify({ ...y, id: 0, created: 0 });
  const abortAfter = async (e, ms) => {
    const ac = new AbortController();
    const t0 = performance.now();
    const p = e.chat.completions.create({ messages: [{ role: "user", content: "Go on." }], max_tokens: 1000, temperature: 0, signal: ac.signal });
    setTimeout(() => ac.abort(), ms);
    try { await p; return "finished"; } catch (err) { return [err?.name, performance.now() - t0 < 20000]; }
  };
  const signalThread = [same(plain, await a.chat.completions.create({ ...req, signal: new AbortController().signal })), await abortAfter(a, 300)];
  // Errors carry the JSON body's fields as properties, in the thread and through the worker.
  const bad = { messages: [{ role: "user", content: "x" }], temperature: 5 };
  const fields = (e) => [e?.type, e?.param, JSON.parse(e?.message ?? "null")?.error?.param];
  let errInThread = null, errWorker = null;
  try { await a.chat.completions.create(bad); } catch (e) { errInThread = fields(e); }
  const adapter = a.adapter;
  await a.unload();
  // Relative to the page (not to the worker script, which lives in out/).
  const w = await createEngine({ model: ".." + q.get("model") });
  try { await w.chat.completions.create(bad); } catch (e) { errWorker = fields(e); }
  const signalWorker = [same(plain, await w.chat.completions.create({ ...req, signal: new AbortController().signal })), await abortAfter(w, 300)];
  let worker = "";
  for await (const c of await w.chat.completions.create({ ...req, stream: true })) worker += c.choices[0]?.delta?.content ?? "";
  await w.unload();
  await report({ inThread, worker, adapter, errInThread, errWorker, signalThread, signalWorker, info: await adapterInfo() });
} catch (e) {
  await report({ failure: String(e?.message ?? e) });
}
"#;

const TYPES: &str = r#"import { createEngine, type Engine, type ChatCompletion, type EngineError } from "tildeopen-wgpu";
import { install, Translator, LanguageDetector, Summarizer, LanguageModel } from "tildeopen-wgpu/builtin-ai";
export async function viaBuiltins(model: string): Promise<string> {
  const names: string[] = install({ model, parallel: 4 });
  const t = await Translator.create({ sourceLanguage: "en", targetLanguage: "lv", monitor(m) { m.addEventListener("downloadprogress", () => {}); } });
  const n: number = await t.measureInputUsage("Hi");
  const s: ReadableStream<string> = t.translateStreaming("Hi");
  const [{ detectedLanguage }] = await (await LanguageDetector.create()).detect("Sveiki");
  const sum = await Summarizer.create({ type: "tldr", length: "medium", format: "plain-text", outputLanguage: "lv" });
  const headline: string = await sum.summarize("a", { context: "b" });
  const lm = await LanguageModel.create({ initialPrompts: [{ role: "system", content: "Be brief." }], topK: 3, temperature: 0.7 });
  lm.addEventListener("contextoverflow", () => {});
  await lm.append([{ role: "user", content: [{ type: "text", value: "Hi" }] }]);
  const used: number = lm.contextUsage + lm.contextWindow + (await lm.measureContextUsage("Hi"));
  const twin: LanguageModel = await lm.clone();
  const streamed: ReadableStream<string> = twin.promptStreaming("Hi");
  const qa: string = await lm.prompt("Who?", { context: "Anna did." });
  return names.join() + n + String(s.locked) + detectedLanguage + headline + used + String(streamed.locked) + qa + (await t.translate("Hi", { signal: AbortSignal.timeout(1000) }));
}
export async function answer(model: string): Promise<string> {
  const engine: Engine = await createEngine({ model, worker: false, wasmUrl: "/x.wasm" });
  const r: ChatCompletion = await engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], max_tokens: 4 });
  for await (const c of await engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], stream: true })) {
    const d: string | undefined = c.choices[0].delta.content;
    void d;
  }
  for await (const c of await engine.tasks.translate({ text: "Hi", from: "en", to: "lv", stream: true })) void c.choices[0].delta.content;
  const t: ChatCompletion = await engine.tasks.ask({ context: "a", question: "b" });
  // A stream flag known only at run time: either kind of answer.
  const live: boolean = Math.random() > 2;
  const either = await engine.chat.completions.create({ messages: [{ role: "user", content: "Hi" }], stream: live });
  if (Symbol.asyncIterator in either) for await (const c of either) void c.id;
  else void either.choices[0].message.content;
  void (await engine.tasks.summarise({ text: "a", stream: live }));
  try {
    await engine.chat.completions.create({ messages: [], model: "x", n: 1 });
  } catch (e) {
    const code: string | null = (e as EngineError).code;
    void code;
  }
  return r.choices[0].message.content + t.choices[0].message.content + String(engine.adapterInfo?.subgroups);
}
"#;

#[test]
fn npm_package_installs_typechecks_bundles_and_answers_like_native() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert!(repo.join("www/pkg/tildeopen_bg.wasm").exists(), "www/pkg is missing: run scripts/build-web");
    let scratch = std::env::temp_dir().join(format!("tildeopen-npm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();

    // The tarball: named by Cargo.toml's version, holding the wasm and types, not the demo.
    let packed = run(repo, "npm", &["pack", "./www", "--pack-destination", scratch.to_str().unwrap(), "--silent"]);
    let tgz = packed.trim().lines().last().unwrap().to_string();
    assert_eq!(tgz, format!("tildeopen-wgpu-{}.tgz", env!("CARGO_PKG_VERSION")));
    let listing = run(&scratch, "tar", &["tzf", &tgz]);
    for f in ["package/package.json", "package/tildeopen.js", "package/tildeopen.d.ts", "package/worker.js", "package/builtin-ai.js", "package/builtin-ai-core.js", "package/builtin-ai.d.ts", "package/builtin-ai/language-model.js", "package/builtin-ai/shared.js", "package/extension/languages.js", "package/scheduler.js", "package/pkg/tildeopen_bg.wasm", "package/README.md", "package/LICENSE"] {
        assert!(listing.lines().any(|l| l == f), "{f} in the package: {listing}");
    }
    // (The language list, extension/languages.js, is shared with builtin-ai.js.)
    let extension_files = listing.lines().filter(|l| l.contains("extension/") && *l != "package/extension/languages.js").count();
    assert!(!listing.contains("index.html") && extension_files == 0, "the demo and extension stay out: {listing}");

    std::fs::write(scratch.join("package.json"), r#"{"name":"scratch","private":true,"type":"module"}"#).unwrap();
    run(&scratch, "npm", &["install", "--no-audit", "--no-fund", "--silent", &format!("./{tgz}"), ESBUILD, TYPESCRIPT]);

    // The types resolve through the package's `exports` and describe what the page uses.
    std::fs::write(scratch.join("check.ts"), TYPES).unwrap();
    run(&scratch, "node_modules/.bin/tsc", &["--strict", "--noEmit", "--target", "es2022", "--module", "nodenext", "--moduleResolution", "nodenext", "--lib", "es2022,dom", "check.ts"]);

    // esbuild: the page and the package's worker as two entry points, the wasm copied next to them.
    std::fs::write(scratch.join("page.js"), PAGE).unwrap();
    std::fs::write(scratch.join("worker-entry.js"), "import \"tildeopen-wgpu/worker\";\n").unwrap();
    std::fs::write(scratch.join("page.html"), "<!doctype html><script type=\"module\" src=\"out/page.js\"></script>\n").unwrap();
    run(&scratch, "node_modules/.bin/esbuild", &["page=./page.js", "worker=./worker-entry.js", "--bundle", "--format=esm", "--outdir=out", "--log-level=warning"]);
    std::fs::copy(scratch.join("node_modules/tildeopen-wgpu/pkg/tildeopen_bg.wasm"), scratch.join("out/tildeopen_bg.wasm")).unwrap();

    let model = "/fixtures/models/tiny-tildeopen/model-Q8_0.gguf";
    let req = r#"{"messages":[{"role":"user","content":"I like cakes."}],"max_tokens":8,"temperature":0}"#;
    let web = WebRoot::new("tildeopen-npm-web", &[("app", &scratch)]);
    let url = format!("{}/app/page.html?model={model}&request={}", web.base, req.replace('"', "%22").replace(' ', "%20").replace('{', "%7B").replace('}', "%7D"));
    let v = web.open(&url, &[], Duration::from_secs(300), "the bundled page posted nothing");
    std::fs::remove_dir_all(&scratch).ok();
    assert!(v.get("failure").is_none(), "bundled page failed: {}", v["failure"]);
    let want = native(&fixtures().join("models/tiny-tildeopen/model-Q8_0.gguf"), req);
    assert_eq!(v["inThread"], want.as_str(), "in the page's thread");
    assert_eq!(v["worker"], want.as_str(), "in the package's worker, streamed, the model URL relative to the page");
    for k in ["signalThread", "signalWorker"] {
        assert_eq!(v[k], serde_json::json!([true, ["AbortError", true]]), "{k}: {v}");
    }
    for k in ["errInThread", "errWorker"] {
        assert_eq!(v[k], serde_json::json!(["invalid_request_error", "temperature", "temperature"]), "{k}: {v}");
    }
    assert!(v["adapter"].as_str().unwrap().to_lowercase().contains("swiftshader"), "{v}");
    assert_eq!(v["info"]["shaderF16"], false, "{v}");
}
