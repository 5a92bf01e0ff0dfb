//! Shared harness of the headless-Chromium tests: a served root with Range support, Chromium
//! with WebGPU on SwiftShader, and the JSON a page POSTs back to `/result`.
#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Kills a child process when dropped.
pub struct Kill(pub Child);
impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A temporary folder served by `scripts/web-serve.py`, holding `repo/`, `fixtures/` and `extra`
/// files (symlinks); removed when dropped.
pub struct WebRoot {
    pub root: PathBuf,
    /// `http://127.0.0.1:PORT`
    pub base: String,
    pub results: PathBuf,
    _server: Kill,
}

impl WebRoot {
    pub fn new(prefix: &str, extra: &[(&str, &Path)]) -> Self {
        assert!(repo().join("www/pkg/tildeopen_bg.wasm").exists(), "www/pkg is missing: run scripts/build-web");
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let root = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        std::os::unix::fs::symlink(repo(), root.join("repo")).unwrap();
        std::os::unix::fs::symlink(crate::common::fixtures().canonicalize().unwrap(), root.join("fixtures")).unwrap();
        for (name, target) in extra {
            std::os::unix::fs::symlink(target.canonicalize().unwrap(), root.join(name)).unwrap();
        }
        let results = root.join("results.jsonl");
        let mut server = Command::new("python3")
            .args([repo().join("scripts/web-serve.py").to_str().unwrap(), "--root", root.to_str().unwrap(), "--port", "0", "--results", results.to_str().unwrap()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(server.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let base = line.trim().rsplit(' ').next().unwrap().to_string();
        WebRoot { root, base, results, _server: Kill(server) }
    }

    /// Opens `url` in headless Chromium (WebGPU on SwiftShader) with `extra_args`, waits up to
    /// `timeout` for the page's POST to `/result` and returns it (`what` names the wait in the
    /// failure message).
    pub fn open(&self, url: &str, extra_args: &[String], timeout: Duration, what: &str) -> serde_json::Value {
        self.open_n(url, extra_args, timeout, what, 1).remove(0)
    }

    /// [`WebRoot::open`], waiting for `n` results (a page that reloads itself and posts again).
    pub fn open_n(&self, url: &str, extra_args: &[String], timeout: Duration, what: &str, n: usize) -> Vec<serde_json::Value> {
        let mut args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu-sandbox",
            "--disable-dev-shm-usage",
            "--enable-unsafe-webgpu",
            "--enable-features=Vulkan",
            "--use-angle=swiftshader",
            "--use-vulkan=swiftshader",
            "--use-webgpu-adapter=swiftshader",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.push(format!("--user-data-dir={}", self.root.join("profile").display()));
        args.extend_from_slice(extra_args);
        args.push(url.to_string());
        let chrome = Command::new("chromium")
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromium (Debian's `chromium` package) is needed for the web tests");
        let _chrome = Kill(chrome);
        let t0 = Instant::now();
        let text = loop {
            if let Ok(t) = std::fs::read_to_string(&self.results) {
                if t.ends_with('\n') && t.lines().count() >= n {
                    break t;
                }
            }
            assert!(t0.elapsed() < timeout, "{what} within {timeout:?}: {url}");
            std::thread::sleep(Duration::from_millis(200));
        };
        text.lines().take(n).map(|l| serde_json::from_str(l).unwrap()).collect()
    }
}

impl Drop for WebRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
