//! The browser extension in headless Chromium (`--load-extension`, WebGPU in its service
//! worker): a local article is translated with the tiny fixture model; every visible text block
//! changes, elements and attributes stay the same, code, inputs and hidden text are untouched,
//! text added after load is translated too, "show original" restores the page exactly, and a
//! page's own message cannot start a translation; a block longer than one answer is split and
//! nothing of it is lost. `whole.js` (the splitting) is also tested on its own with node.

mod common;
mod browser;
use browser::{repo, WebRoot};
use std::process::Command;
use std::time::Duration;

#[test]
fn extension_translates_a_page_and_restores_it() {
    let web = WebRoot::new("tildeopen-ext", &[]);
    let (root, base) = (&web.root, &web.base);

    // The extension with the tiny model, automatic translation and short answers baked in.
    let ext = root.join("extension");
    let model = format!("{base}/fixtures/models/tiny-tildeopen/model-Q8_0.gguf");
    let st = Command::new(repo().join("scripts/build-extension"))
        .args(["--out", ext.to_str().unwrap(), "--model", &model, "--auto", "--max-tokens", "64"])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(root.join("tildeopen-extension.zip").exists());

    let v = web.open(
        &format!("{base}/repo/tests/web/article.html"),
        &[format!("--load-extension={}", ext.display()), format!("--disable-extensions-except={}", ext.display())],
        Duration::from_secs(400),
        "the page never reported (extension not translating?)",
    );
    println!("before: {}\nafter: {}", v["textsBefore"], v["textsAfter"]);
    let (b, a) = (&v["textsBefore"], &v["textsAfter"]);
    // Every visible text block changed.
    for sel in ["h1", "h2", "li", "th", "td", "button"] {
        for (x, y) in b[sel].as_array().unwrap().iter().zip(a[sel].as_array().unwrap()) {
            assert_ne!(x, y, "{sel} not translated");
        }
    }
    assert_ne!(b["p"][0], a["p"][0], "paragraph with inline markup");
    assert_eq!(a["#late"].as_array().unwrap().len(), 1, "late paragraph");
    assert_ne!(a["#late"][0], "This paragraph arrived later.", "text added after load is translated");
    // Code, inputs, hidden text untouched; the same elements and attributes.
    assert_eq!(a["code"], b["code"]);
    assert_eq!(a["div"], b["div"]);
    assert_eq!(v["inputValue"], "Anna");
    assert!(v["sameShape"].as_bool().unwrap(), "elements/attributes changed:\n{}", v["shapeAfter"]);
    // "Show original" restores the page exactly.
    assert!(v["restored"].as_bool().unwrap(), "not restored:\n{}\nvs\n{}", v["restoredHtml"], v["before"]);
    // A block longer than one answer (64 tokens here, and the tiny model never stops) is split
    // into parts of at most 64 characters; each part that cannot finish keeps its own text with
    // the mark, so none of the paragraph is lost.
    let long = a["#long"][0].as_str().unwrap();
    assert!(long.matches(" […]").count() >= 2, "split into marked parts: {long}");
    assert_eq!(long.replace(" […]", ""), b["#long"][0].as_str().unwrap(), "nothing lost: {long}");
    // A ticker re-rendered 8 times: the script keeps the live text node, not all 8.
    let (n0, n1) = (v["nodesBefore"].as_u64().unwrap(), v["nodesAfterTicker"].as_u64().unwrap());
    assert!(n0 > 10 && n1 <= n0 + 2, "text nodes kept: {n0} before the ticker, {n1} after");
    // The page's own {tildeopen: "translate"} message starts nothing.
    assert!(v["pageCannotTranslate"].as_bool().unwrap(), "a page message started a translation");
}

#[test]
fn long_blocks_are_translated_whole() {
    // whole.js with a model stand-in whose answers stop at a budget: a paragraph longer than one
    // answer comes back whole and in order; parts that cannot finish keep their text, marked.
    let out = Command::new("node").arg(repo().join("tests/web/whole-test.mjs")).output().expect("node");
    assert!(out.status.success(), "{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("whole.js: ok"));
}
