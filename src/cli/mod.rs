//! The `tildeopen` command line, one file per group of subcommands: [`chat`] (chat and the
//! tasks), [`tools`] (model tools), [`serve`] (server and batch). This file holds what they share:
//! the model options, loading with a progress bar, and the chat engine they build.

pub mod chat;
pub mod serve;
pub mod tools;

use clap::{Args, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use tildeopen::gpu::session::{default_ctx_size, DEFAULT_CTX_CAP};
use tildeopen::gpu::GpuOptions;
use tildeopen::model::fetch;
use tildeopen::model::loader::WeightFormat;
use tildeopen::model::LoadOptions;
use tildeopen::text::tokenizer::Tokenizer;
use tildeopen::chat::engine::MAX_CONTEXT;
use tildeopen::{ChatEngine, ChatOptions, Error, KvType, Model, Result, SessionOptions};

#[derive(Parser)]
#[command(name = "tildeopen", version, about = "TildeOpen LLMs on WGSL compute shaders (wgpu)")]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    #[command(flatten)]
    Chat(chat::ChatCmd),
    #[command(flatten)]
    Serve(serve::ServeCmd),
    #[command(flatten)]
    Tools(tools::ToolCmd),
}

#[derive(Args, Clone)]
pub struct Common {
    /// A GGUF file or an HF checkpoint directory. Default: the demo model (SmolLM2-135M-Instruct
    /// Q4_1), fetched on first use.
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// KV cache storage: f16 (packed in u32), f32, or llama.cpp's q8_0 / q4_0 blocks (about a
    /// half / a quarter of f16's bytes).
    #[arg(long, default_value = "f16", value_parser = ["f16", "f32", "q8_0", "q4_0"])]
    pub kv_cache: String,
    /// Cap every GPU buffer binding at this many bytes (tensors are split to fit).
    #[arg(long)]
    pub max_binding_size: Option<u64>,
    /// What HF checkpoints are quantized to at load time: q8_0, q4_0, f16 or bf16.
    #[arg(long, default_value = "q8_0")]
    pub quant: String,
    /// Context window (KV cache length) in tokens. Default: the model's, at most 4096.
    #[arg(long)]
    pub ctx_size: Option<usize>,
    /// Q/K/V and gate/up matvecs with 8-bit integer dot products on input rounded to 8 bits
    /// (Q8_0, Q4_0, Q4_1, Q4_K, Q6_K weights): lossy, so off by default (also
    /// TILDEOPEN_INT_DOT=1).
    #[arg(long)]
    pub int_dot: bool,
    /// Run on the first GPU adapter whose name contains this (case-insensitive) instead of the
    /// fastest (also TILDEOPEN_ADAPTER); `tildeopen info` lists them.
    #[arg(long)]
    pub adapter: Option<String>,
}

pub struct Loaded {
    pub model: Model,
    pub sess: SessionOptions,
    pub path: PathBuf,
}

/// SageMaker mounts the model here.
pub const SAGEMAKER_MODEL_DIR: &str = "/opt/ml/model";

/// `--model`, else a model under /opt/ml/model (a GGUF file in it, or the directory as an HF
/// checkpoint), else the demo model.
pub fn model_path(c: &Common) -> Result<PathBuf> {
    if let Some(p) = &c.model {
        return Ok(p.clone());
    }
    let sm = Path::new(SAGEMAKER_MODEL_DIR);
    if sm.is_dir() {
        let mut ggufs: Vec<PathBuf> = std::fs::read_dir(sm)
            .map_err(|e| Error::Io { path: SAGEMAKER_MODEL_DIR.into(), source: e })?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
            .collect();
        ggufs.sort();
        return Ok(ggufs.into_iter().next().unwrap_or_else(|| sm.to_path_buf()));
    }
    fetch::default_model()
}

/// A progress bar on stderr while weights upload (only when stderr is a terminal).
pub fn progress_bar() -> (indicatif::ProgressBar, impl FnMut(usize, usize)) {
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template("loading {bar:40} {pos}/{len} tensors {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let b = bar.clone();
    (bar, move |done, total| {
        b.set_length(total as u64);
        b.set_position(done as u64);
    })
}

pub fn load(c: &Common, min_ctx: usize) -> Result<Loaded> {
    let path = model_path(c)?;
    let opts = LoadOptions {
        gpu: GpuOptions { max_binding_size: c.max_binding_size, int_dot: c.int_dot.then_some(true), adapter: c.adapter.clone(), ..Default::default() },
        hf_format: WeightFormat::parse(&c.quant)?,
    };
    let (bar, progress) = progress_bar();
    let model = pollster::block_on(Model::load_with_progress(&path, &opts, progress));
    bar.finish_and_clear();
    let model = model?;
    software_note(&model.gpu.info);
    let kv = KvType::parse(&c.kv_cache)?;
    // Default context: the shared default, but never less than this command needs.
    let ctx = c
        .ctx_size
        .unwrap_or_else(|| default_ctx_size(&model.cfg, model.gpu.max_binding, kv, 1, DEFAULT_CTX_CAP).max(min_ctx));
    let sess = SessionOptions { ctx_size: ctx, kv, ..Default::default() };
    Ok(Loaded { model, sess, path })
}

/// Says once per process, on stderr, that the adapter is a CPU implementation (lavapipe,
/// SwiftShader, WARP): correct but slow, so a slow answer is not taken for a bug.
pub fn software_note(info: &wgpu::AdapterInfo) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    if info.device_type == wgpu::DeviceType::Cpu {
        ONCE.call_once(|| {
            eprintln!("note: running on a software device ({}): answers are correct but slow; install your GPU's Vulkan driver for speed", info.name)
        });
    }
}

/// The `model` name responses carry: the GGUF's file stem or the checkpoint directory's name.
/// The name responses carry, known before anything is loaded or fetched: `--model-name`, else
/// the model file's stem (a folder's name), else the default model's.
pub fn served_name(c: &Common, name: Option<String>) -> String {
    if let Some(n) = name {
        return n;
    }
    if c.model.is_none() && !Path::new(SAGEMAKER_MODEL_DIR).is_dir() {
        return model_name(Path::new(fetch::DEFAULT_FILE));
    }
    model_path(c).map(|p| model_name(&p)).unwrap_or_else(|_| "tildeopen".into())
}

pub fn model_name(path: &Path) -> String {
    let p = if path.is_dir() { path.file_name() } else { path.file_stem() };
    p.and_then(|s| s.to_str()).unwrap_or("tildeopen").to_string()
}

pub fn engine(c: &Common) -> Result<ChatEngine> {
    engine_named(c, None, 1)
}

/// A chat engine answering up to `parallel` requests at once, each with the context of
/// --ctx-size (default: the model's, at most 4096 and at most what the KV buffers can hold
/// for all of them).
pub fn engine_named(c: &Common, name: Option<String>, parallel: usize) -> Result<ChatEngine> {
    if parallel == 0 {
        return Err(Error::Input("--parallel must be at least 1".into()));
    }
    if let Some(n) = c.ctx_size.filter(|n| !(2..=MAX_CONTEXT).contains(n)) {
        return Err(Error::Input(format!("--ctx-size {n}: a chat context is 2 to {MAX_CONTEXT} tokens")));
    }
    let l = load(c, 0)?;
    let tok = Tokenizer::load(&l.path)?;
    let default = default_ctx_size(&l.model.cfg, l.model.gpu.max_binding, l.sess.kv, parallel, DEFAULT_CTX_CAP);
    let opts = ChatOptions {
        ctx_size: Some(c.ctx_size.unwrap_or(default)),
        kv: l.sess.kv,
        max_batch: l.sess.max_batch,
        parallel,
        model_name: name.unwrap_or_else(|| model_name(&l.path)),
    };
    ChatEngine::new(&l.model, tok, opts)
}

pub fn read_text(path: &Path) -> Result<String> {
    if path == Path::new("-") {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| Error::Io { path: "stdin".into(), source: e })?;
        return Ok(s);
    }
    std::fs::read_to_string(path).map_err(|e| Error::Io { path: path.display().to_string(), source: e })
}

/// Mesa prints `error: XDG_RUNTIME_DIR is invalid or not set` on machines without a desktop
/// session, which reads like a failure: when it is unset, point it at a private directory
/// (created 0700) before any thread starts.
pub fn quiet_mesa() {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if std::env::var_os("XDG_RUNTIME_DIR").is_some() {
        return;
    }
    let uid = std::fs::metadata("/proc/self").map(|m| m.uid()).unwrap_or(0);
    let dir = std::env::temp_dir().join(format!("tildeopen-runtime-{uid}"));
    let _ = std::fs::DirBuilder::new().mode(0o700).create(&dir);
    // Only a directory of ours with no access for others will do.
    let ok = std::fs::metadata(&dir).is_ok_and(|m| m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o077 == 0);
    if ok {
        std::env::set_var("XDG_RUNTIME_DIR", &dir);
    }
}
