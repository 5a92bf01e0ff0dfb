//! The browser extension in headless Chromium (`--load-extension`, WebGPU in its service
//! worker): a local article is translated with the tiny fixture model; every visible text block
//! changes, elements and attributes stay the same, code, inputs and hidden text are untouched,
//! text added after load is translated too, and "show original" restores the page exactly.

mod common;
use common::fixtures;
use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Kill(Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn extension_translates_a_page_and_restores_it() {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    assert!(repo.join("www/pkg/tildeopen_bg.wasm").exists(), "www/pkg is missing: run scripts/build-web");
    let root = std::env::temp_dir().join(format!("tildeopen-ext-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    std::os::unix::fs::symlink(&repo, root.join("repo")).unwrap();
    std::os::unix::fs::symlink(fixtures().canonicalize().unwrap(), root.join("fixtures")).unwrap();
    let results = root.join("results.jsonl");
    let mut server = Command::new("python3")
        .args([repo.join("scripts/web-serve.py").to_str().unwrap(), "--root", root.to_str().unwrap(), "--port", "0", "--results", results.to_str().unwrap()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let _server = Kill(server);
    let base = line.trim().rsplit(' ').next().unwrap().to_string();

    // The extension with the tiny model, automatic translation and short answers baked in.
    let ext = root.join("extension");
    let model = format!("{base}/fixtures/models/tiny-tildeopen/model-Q8_0.gguf");
    let st = Command::new(repo.join("scripts/build-extension"))
        .args(["--out", ext.to_str().unwrap(), "--model", &model, "--auto", "--max-tokens", "4"])
        .status()
        .unwrap();
    assert!(st.success());
    assert!(root.join("tildeopen-extension.zip").exists());

    let chrome = Command::new("chromium")
        .args([
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu-sandbox",
            "--disable-dev-shm-usage",
            "--enable-unsafe-webgpu",
            "--enable-features=Vulkan",
            "--use-angle=swiftshader",
            "--use-vulkan=swiftshader",
            "--use-webgpu-adapter=swiftshader",
            &format!("--user-data-dir={}", root.join("profile").display()),
            &format!("--load-extension={}", ext.display()),
            &format!("--disable-extensions-except={}", ext.display()),
            &format!("{base}/repo/tests/web/article.html"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _chrome = Kill(chrome);
    let t0 = Instant::now();
    let text = loop {
        if let Ok(t) = std::fs::read_to_string(&results) {
            if t.ends_with('\n') {
                break t;
            }
        }
        assert!(t0.elapsed() < Duration::from_secs(400), "the page never reported (extension not translating?)");
        std::thread::sleep(Duration::from_millis(200));
    };
    let _ = std::fs::remove_dir_all(&root);
    let v: serde_json::Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
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
}
