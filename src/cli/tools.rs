//! Model tools: `logits`, `complete`, `bench`, `info`, `fetch`, `tokenize`, `perplexity`.

use super::{load, model_path, read_text, Common};
use clap::Subcommand;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::Instant;
use tildeopen::gpu::GpuOptions;
use tildeopen::model::fetch;
use tildeopen::text::tokenizer::Tokenizer;
use tildeopen::{Error, Result, Session, SessionOptions};

#[derive(Subcommand)]
pub enum ToolCmd {
    /// Print token ids (no bos/eos added). --model may be a bare tokenizer.model or tokenizer.json.
    Tokenize {
        #[arg(long)]
        model: Option<PathBuf>,
        #[arg(long, conflicts_with = "jsonl")]
        text: Option<String>,
        /// Read {"text": ...} lines on stdin, print {"ids": [...]} lines.
        #[arg(long)]
        jsonl: bool,
    },
    /// Perplexity of a text file, as llama.cpp's llama-perplexity computes it.
    Perplexity {
        #[command(flatten)]
        common: Common,
        #[arg(long)]
        file: PathBuf,
        /// Tokens per chunk (the second half of each is scored).
        #[arg(long, default_value_t = 512)]
        ctx: usize,
        /// Score at most this many chunks.
        #[arg(long)]
        chunks: Option<usize>,
    },
    /// Print the GPU adapter and its limits (fails if there is none), and every adapter there is.
    Info {
        #[arg(long)]
        max_binding_size: Option<u64>,
        /// The adapter to describe (a part of its name; also TILDEOPEN_ADAPTER).
        #[arg(long)]
        adapter: Option<String>,
        /// Also write every WGSL module the device compiles for a model (`--model`, default the
        /// demo model) into this folder: one file per pipeline, as compiled, with its override
        /// values in a header comment.
        #[arg(long)]
        dump_kernels: Option<PathBuf>,
        /// The model whose kernels --dump-kernels writes.
        #[arg(long, requires = "dump_kernels")]
        model: Option<PathBuf>,
    },
    /// Download the default demo model if needed and print its path.
    Fetch,
    /// Print the logits at every position of one causal forward pass as JSON.
    Logits {
        #[command(flatten)]
        common: Common,
        /// Comma-separated token ids.
        #[arg(long)]
        tokens: String,
    },
    /// Continue token ids (--tokens) or a text (--prompt, tokenized without a template).
    Complete {
        #[command(flatten)]
        common: Common,
        /// Comma-separated token ids.
        #[arg(long, required_unless_present = "prompt", conflicts_with = "prompt")]
        tokens: Option<String>,
        /// Text, tokenized as is (bos added when the tokenizer adds one).
        #[arg(long)]
        prompt: Option<String>,
        #[arg(long, default_value_t = 32)]
        max_tokens: usize,
        /// 0 = greedy.
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Stop after the model's end-of-sequence token.
        #[arg(long)]
        stop_at_eos: bool,
        /// Print {"ids": [...], "text": ...} instead of the text (or one id per line).
        #[arg(long)]
        json: bool,
    },
    /// Measure prefill and decode speed (medians over --repeat runs).
    Bench {
        #[command(flatten)]
        common: Common,
        #[arg(long, default_value_t = 512)]
        prompt_tokens: usize,
        #[arg(long, default_value_t = 128)]
        gen_tokens: usize,
        #[arg(long, default_value_t = 3)]
        repeat: usize,
        #[arg(long)]
        json: bool,
        /// Also print GPU time per kernel (each kernel then runs on its own: slower overall).
        #[arg(long)]
        profile: bool,
        /// Also measure the device's copy bandwidth (for the roofline: weight bytes read per
        /// decode step / bandwidth).
        #[arg(long)]
        bandwidth: bool,
    },
}

pub fn run(cmd: ToolCmd) -> Result<()> {
    match cmd {
        ToolCmd::Info { max_binding_size, adapter, dump_kernels, model } => {
            if let Some(dir) = dump_kernels {
                // A session records every op of the forward pass (decode and prefill variants),
                // which compiles every pipeline the model needs on this device: one per KV
                // cache type the model's heads take.
                let common = Common { model, kv_cache: "f16".into(), max_binding_size, quant: "q8_0".into(), ctx_size: Some(64), int_dot: false, adapter: adapter.clone() };
                let l = load(&common, 1)?;
                for kv in tildeopen::KvType::ALL.into_iter().filter(|t| t.unsupported(&l.model.cfg).is_none()) {
                    Session::new(&l.model, SessionOptions { kv, ..l.sess.clone() })?;
                }
                let n = l.model.gpu.kernels.dump(&dir).map_err(|e| Error::Io { path: dir.display().to_string(), source: e })?;
                eprintln!("{n} kernels written to {}", dir.display());
            }
            let gpu = pollster::block_on(tildeopen::gpu::Gpu::new(&GpuOptions { max_binding_size, adapter, ..Default::default() }))?;
            let l = &gpu.limits;
            println!(
                "{}",
                serde_json::json!({
                    "adapter": gpu.info.name, "backend": format!("{:?}", gpu.info.backend),
                    "driver": gpu.info.driver, "device_type": format!("{:?}", gpu.info.device_type),
                    "max_storage_buffer_binding_size": l.max_storage_buffer_binding_size,
                    "max_buffer_size": l.max_buffer_size, "engine_max_binding": gpu.max_binding,
                    "timestamps": gpu.timestamps,
                    "adapters": pollster::block_on(tildeopen::gpu::device::adapters()),
                    // The optional kernel paths this device gets (TILDEOPEN_* variables apply).
                    "fast_paths": gpu.fast.by_name().iter().map(|&(k, on)| (k.to_string(), serde_json::Value::Bool(on))).collect::<serde_json::Map<_, _>>(),
                })
            );
        }
        ToolCmd::Fetch => println!("{}", fetch::default_model()?.display()),
        ToolCmd::Logits { common, tokens } => {
            let ids = parse_ids(&tokens)?;
            let l = load(&common, ids.len())?;
            let mut s = Session::new(&l.model, l.sess)?;
            let logits = pollster::block_on(s.logits_all(&ids))?;
            println!("{}", serde_json::json!({ "logits": logits }));
        }
        ToolCmd::Complete { common, tokens, prompt, max_tokens, temperature, seed, stop_at_eos, json } => {
            if !(0.0..=100.0).contains(&temperature) {
                return Err(Error::Input(format!("temperature {temperature} out of range")));
            }
            let path = model_path(&common)?;
            let tok = match &prompt {
                Some(_) => Some(Tokenizer::load(&path)?),
                None => None,
            };
            let ids = match (&tokens, &prompt, &tok) {
                (Some(t), _, _) => parse_ids(t)?,
                (None, Some(p), Some(tok)) => {
                    let mut ids = tok.encode(p)?;
                    if let (true, Some(b)) = (tok.add_bos, tok.bos) {
                        ids.insert(0, b);
                    }
                    ids
                }
                _ => unreachable!("clap requires one of --tokens, --prompt"),
            };
            if ids.is_empty() {
                return Err(Error::Input("the prompt is empty".into()));
            }
            in_range("--max-tokens", max_tokens, 1, MAX_TOKENS)?;
            // Checked before generating (it failed after the last token, printing nothing).
            let need = ids.len() + max_tokens;
            if let Some(c) = common.ctx_size.filter(|&c| c < need) {
                return Err(Error::Input(format!("{} prompt tokens and --max-tokens {max_tokens} need a context of {need} tokens; --ctx-size is {c}", ids.len())));
            }
            let l = load(&Common { model: Some(path), ..common }, need)?;
            let mut s = Session::new(&l.model, l.sess)?;
            let stop = match (&tok, stop_at_eos) {
                (_, false) => vec![],
                (Some(t), true) => t.eog.clone(),
                (None, true) => l.model.cfg.eos_token_ids.clone(),
            };
            let out = if temperature == 0.0 {
                pollster::block_on(s.generate_greedy(&ids, max_tokens, &stop))?
            } else {
                pollster::block_on(s.generate_sampled(&ids, max_tokens, &stop, temperature, seed))?
            };
            let text = match &tok {
                Some(t) => Some(t.decode(&out)?),
                None => Tokenizer::load(&l.path).ok().and_then(|t| t.decode(&out).ok()),
            };
            if json {
                println!("{}", serde_json::json!({ "ids": out, "text": text }));
            } else if prompt.is_some() {
                println!("{}", text.unwrap_or_default());
            } else {
                for id in out {
                    println!("{id}");
                }
            }
        }
        ToolCmd::Tokenize { model, text, jsonl } => {
            let path = match model {
                Some(p) => p,
                None => fetch::default_model()?,
            };
            let tok = Tokenizer::load(&path)?;
            if jsonl {
                let mut out = std::io::stdout().lock();
                for (i, line) in std::io::stdin().lock().lines().enumerate() {
                    let line = line.map_err(|e| Error::Io { path: "stdin".into(), source: e })?;
                    if line.trim().is_empty() {
                        continue;
                    }
                    let v: serde_json::Value = serde_json::from_str(&line).map_err(|e| Error::Input(format!("stdin line {}: {e}", i + 1)))?;
                    let t = v.get("text").and_then(|t| t.as_str()).ok_or_else(|| Error::Input(format!("stdin line {}: no \"text\" string", i + 1)))?;
                    writeln!(out, "{}", serde_json::json!({ "ids": tok.encode(t)? })).ok();
                }
            } else {
                let t = text.ok_or_else(|| Error::Input("give --text or --jsonl".into()))?;
                println!("{}", serde_json::json!({ "ids": tok.encode(&t)? }));
            }
        }
        ToolCmd::Perplexity { common, file, ctx, chunks } => {
            // Each chunk scores its second half from the first: at least 4 tokens.
            in_range("--ctx", ctx, 4, MAX_TOKENS)?;
            if let Some(n) = chunks {
                in_range("--chunks", n, 1, usize::MAX)?;
            }
            if common.ctx_size.is_some() {
                return Err(Error::Input("perplexity takes its context from --ctx, not --ctx-size".into()));
            }
            let text = read_text(&file)?;
            let path = model_path(&common)?;
            let tok = Tokenizer::load(&path)?;
            let mut ids = tok.encode(&text)?;
            if let Some(n) = chunks {
                ids.truncate(n.saturating_mul(ctx));
            }
            let l = load(&Common { model: Some(path), ctx_size: Some(ctx), ..common }, ctx)?;
            let mut s = Session::new(&l.model, SessionOptions { max_batch: ctx.min(512), ..l.sess })?;
            let bos = if tok.add_bos { tok.bos } else { None };
            let n = ids.len() / ctx.max(1);
            eprintln!("{} tokens, {n} chunks of {ctx}", ids.len());
            let r = pollster::block_on(tildeopen::chat::perplexity::perplexity(&mut s, &ids, ctx, bos, |i, p| {
                eprintln!("[{}/{n}] {p:.4}", i + 1);
            }))?;
            println!("chunks: {}, scored tokens: {}", r.chunks, r.scored);
            println!("PPL = {:.4}", r.ppl);
        }
        ToolCmd::Bench { common, prompt_tokens, gen_tokens, repeat, json, profile, bandwidth } => {
            in_range("--prompt-tokens", prompt_tokens, 1, MAX_TOKENS)?;
            in_range("--gen-tokens", gen_tokens, 1, MAX_TOKENS)?;
            in_range("--repeat", repeat, 1, 1000)?;
            if let Some(c) = common.ctx_size.filter(|&c| c < prompt_tokens + gen_tokens) {
                return Err(Error::Input(format!("--prompt-tokens {prompt_tokens} and --gen-tokens {gen_tokens} need a context of {} tokens; --ctx-size is {c}", prompt_tokens + gen_tokens)));
            }
            let l = load(&common, prompt_tokens + gen_tokens)?;
            let mut s = Session::new(&l.model, l.sess)?;
            if profile {
                s.enable_profile();
            }
            let vocab = l.model.cfg.vocab_size as u32;
            let prompt: Vec<u32> = (0..prompt_tokens as u32).map(|i| (i * 7919 + 13) % vocab).collect();
            // Warm-up: every pipeline's first dispatch on a short run: the matvec path (passes of
            // up to 16 tokens), a decode step, and, for longer prompts, the matmul and
            // query-tiled attention path, so the timed prefill does not pay for them.
            s.reset();
            pollster::block_on(s.feed(&prompt[..prompt.len().min(8)]))?;
            pollster::block_on(s.feed(&[1]))?;
            pollster::block_on(s.last_argmax())?;
            if prompt.len() > 16 {
                s.reset();
                pollster::block_on(s.feed(&prompt[..prompt.len().min(64)]))?;
                pollster::block_on(s.last_argmax())?;
            }
            let (mut pre, mut dec) = (vec![], vec![]);
            // What the decode steps asked of the device (buffers created, submits, host waits).
            let mut per_decode = tildeopen::gpu::CounterValues::default();
            let mut prefill_submits = 0;
            for _ in 0..repeat.max(1) {
                s.reset();
                let t0 = Instant::now();
                let c = l.model.gpu.counters.get();
                pollster::block_on(s.feed(&prompt))?;
                prefill_submits = (l.model.gpu.counters.get() - c).submits;
                let mut tok = pollster::block_on(s.last_argmax())?;
                let t1 = Instant::now();
                let c0 = l.model.gpu.counters.get();
                for _ in 0..gen_tokens {
                    pollster::block_on(s.feed(&[tok]))?;
                    tok = pollster::block_on(s.last_argmax())?;
                }
                per_decode = l.model.gpu.counters.get() - c0;
                let t2 = Instant::now();
                pre.push(prompt_tokens as f64 / (t1 - t0).as_secs_f64());
                dec.push(gen_tokens as f64 / (t2 - t1).as_secs_f64());
            }
            let (p, d) = (median(&mut pre), median(&mut dec));
            let per_token = |n: u64| if gen_tokens == 0 { 0.0 } else { n as f64 / gen_tokens as f64 };
            // What one decode step records at the end of the run.
            let dispatches = s.dispatches(1, prompt_tokens + gen_tokens, 1);
            let layers = l.model.cfg.num_layers;
            let bw = if bandwidth { Some(l.model.gpu.copy_bandwidth()?) } else { None };
            if let Some(prof) = s.profile() {
                let how = if l.model.gpu.timestamps { "GPU timestamps" } else { "host clock, one submit per kernel" };
                eprintln!("time per kernel, all passes ({how}):");
                let mut v: Vec<_> = prof.iter().collect();
                v.sort_by(|a, b| b.1.total_cmp(a.1));
                for (k, t) in v {
                    eprintln!("{k:>17}: {t:8.3} s");
                }
            }
            let info = &l.model.gpu.info;
            if json {
                println!(
                    "{}",
                    serde_json::json!({
                        "prefill_tok_s": p, "decode_tok_s": d,
                        "prompt_tokens": prompt_tokens, "gen_tokens": gen_tokens, "repeat": repeat,
                        "adapter": info.name, "backend": format!("{:?}", info.backend),
                        "weights_bytes": l.model.weight_bytes,
                        "dispatches_per_token": dispatches, "layers": layers,
                        "submits_per_token": per_token(per_decode.submits),
                        "syncs_per_token": per_token(per_decode.syncs),
                        "buffers_created_per_token": per_token(per_decode.buffers_created),
                        // Command buffers of the prompt's passes (cut by work), and the decode
                        // attention's workgroups at the last position.
                        "prefill_submits": prefill_submits,
                        "attn_workgroups": s.attn_workgroups(prompt_tokens + gen_tokens - 1),
                        "kv_cache": s.kv_type().name(),
                        "wide_attention": l.model.gpu.fast.wide_attention,
                        "baseline_kernels": !l.model.gpu.fast.fused,
                        "subgroups": l.model.gpu.fast.subgroups,
                        "norm_fold": l.model.gpu.fast.norm_fold,
                        "int_dot": l.model.gpu.fast.int_dot,
                        "query_tiles": l.model.gpu.fast.query_tiles,
                        "bandwidth_gb_s": bw.map(|b| b / 1e9),
                    })
                );
            } else {
                let fast = &l.model.gpu.fast;
                let paths = [(fast.subgroups, ", subgroup matvec"), (fast.norm_fold, ", norms in the matvecs"), (fast.int_dot, ", integer-dot matvec")];
                let paths: String = paths.iter().filter(|p| p.0).map(|p| p.1).collect();
                println!("adapter: {} ({:?}){paths}", info.name, info.backend);
                println!("prefill: {p:.1} tok/s ({prompt_tokens} tokens), decode: {d:.1} tok/s ({gen_tokens} tokens), median of {repeat}");
                println!(
                    "decode step: {dispatches} dispatches ({layers} layers), {:.1} submits, {:.1} host waits, {:.1} buffers created",
                    per_token(per_decode.submits),
                    per_token(per_decode.syncs),
                    per_token(per_decode.buffers_created)
                );
                if let Some(b) = bw {
                    let roof = b / l.model.weight_bytes as f64;
                    println!("copy bandwidth: {:.1} GB/s; decode roofline (weights read once a step): {roof:.1} tok/s", b / 1e9);
                }
            }
        }
    }
    Ok(())
}

/// The most tokens a command-line count may ask for (a prompt, a generation, a perplexity
/// chunk): 2^20, beyond any context a model here has.
const MAX_TOKENS: usize = 1 << 20;

/// `flag`'s value `v` must be in `lo..=hi`: an error naming the flag otherwise (a huge count
/// wrapped, overflowed an allocation or was cut to 32 bits).
fn in_range(flag: &str, v: usize, lo: usize, hi: usize) -> Result<()> {
    if v < lo || v > hi {
        let range = if hi == usize::MAX { format!("at least {lo}") } else { format!("{lo} to {hi}") };
        return Err(Error::Input(format!("{flag} {v}: must be {range}")));
    }
    Ok(())
}

fn parse_ids(s: &str) -> Result<Vec<u32>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.trim().parse::<u32>().map_err(|_| Error::Input(format!("bad token id {p:?}"))))
        .collect()
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
