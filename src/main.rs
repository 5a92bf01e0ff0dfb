//! The `tildeopen` command line: logits, complete, bench.

#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    std::process::exit(cli::main());
}

#[cfg(not(target_arch = "wasm32"))]
mod cli {
    use clap::{Args, Parser, Subcommand};
    use std::path::PathBuf;
    use std::time::Instant;
    use tildeopen::gpu::GpuOptions;
    use tildeopen::loader::WeightFormat;
    use tildeopen::model::LoadOptions;
    use tildeopen::{fetch, Error, Model, Result, Session, SessionOptions};

    #[derive(Parser)]
    #[command(name = "tildeopen", version, about = "TildeOpen LLMs on WGSL compute shaders (wgpu)")]
    struct Cli {
        #[command(subcommand)]
        cmd: Cmd,
    }

    #[derive(Args, Clone)]
    struct Common {
        /// A GGUF file or an HF checkpoint directory. Default: the demo model (SmolLM2-135M-Instruct
        /// Q4_1), fetched on first use.
        #[arg(long)]
        model: Option<PathBuf>,
        /// KV cache storage: f16 (packed in u32) or f32.
        #[arg(long, default_value = "f16", value_parser = ["f16", "f32"])]
        kv_cache: String,
        /// Cap every GPU buffer binding at this many bytes (tensors are split to fit).
        #[arg(long)]
        max_binding_size: Option<u64>,
        /// What HF checkpoints are quantized to at load time: q8_0, q4_0, f16 or bf16.
        #[arg(long, default_value = "q8_0")]
        quant: String,
        /// Context window (KV cache length) in tokens. Default: the model's, at most 4096.
        #[arg(long)]
        ctx_size: Option<usize>,
    }

    #[derive(Subcommand)]
    enum Cmd {
        /// Print the GPU adapter and its limits (fails if there is none).
        Info {
            #[arg(long)]
            max_binding_size: Option<u64>,
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
        /// Continue a sequence of token ids.
        Complete {
            #[command(flatten)]
            common: Common,
            #[arg(long)]
            tokens: String,
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
            /// Print {"ids": [...]} instead of one id per line.
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
        },
    }

    fn parse_ids(s: &str) -> Result<Vec<u32>> {
        s.split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| p.trim().parse::<u32>().map_err(|_| Error::Input(format!("bad token id {p:?}"))))
            .collect()
    }

    struct Loaded {
        model: Model,
        sess: SessionOptions,
    }

    fn load(c: &Common, min_ctx: usize) -> Result<Loaded> {
        let path = match &c.model {
            Some(p) => p.clone(),
            None => fetch::default_model()?,
        };
        let opts = LoadOptions {
            gpu: GpuOptions { max_binding_size: c.max_binding_size },
            hf_format: WeightFormat::parse(&c.quant)?,
        };
        let model = pollster::block_on(Model::load(&path, &opts))?;
        let kv_f16 = c.kv_cache == "f16";
        // Default context: the model's, at most 4096 and at most what one KV buffer can hold,
        // but never less than this command needs.
        let fits = (model.gpu.max_binding - 4) as usize / (model.cfg.kv_dim() * if kv_f16 { 2 } else { 4 });
        let ctx = c
            .ctx_size
            .unwrap_or_else(|| model.cfg.max_position_embeddings.clamp(1, 4096).min(fits).max(min_ctx));
        let sess = SessionOptions { ctx_size: ctx, kv_f16, ..Default::default() };
        Ok(Loaded { model, sess })
    }

    fn median(v: &mut [f64]) -> f64 {
        v.sort_by(|a, b| a.total_cmp(b));
        v[v.len() / 2]
    }

    fn run(cli: Cli) -> Result<()> {
        match cli.cmd {
            Cmd::Info { max_binding_size } => {
                let gpu = pollster::block_on(tildeopen::gpu::Gpu::new(&GpuOptions { max_binding_size }))?;
                let l = &gpu.limits;
                println!(
                    "{}",
                    serde_json::json!({
                        "adapter": gpu.info.name, "backend": format!("{:?}", gpu.info.backend),
                        "driver": gpu.info.driver, "device_type": format!("{:?}", gpu.info.device_type),
                        "max_storage_buffer_binding_size": l.max_storage_buffer_binding_size,
                        "max_buffer_size": l.max_buffer_size, "engine_max_binding": gpu.max_binding,
                    })
                );
            }
            Cmd::Fetch => println!("{}", fetch::default_model()?.display()),
            Cmd::Logits { common, tokens } => {
                let ids = parse_ids(&tokens)?;
                let l = load(&common, ids.len())?;
                let mut s = Session::new(&l.model, l.sess)?;
                let logits = pollster::block_on(s.logits_all(&ids))?;
                println!("{}", serde_json::json!({ "logits": logits }));
            }
            Cmd::Complete { common, tokens, max_tokens, temperature, seed, stop_at_eos, json } => {
                let ids = parse_ids(&tokens)?;
                if ids.is_empty() {
                    return Err(Error::Input("--tokens is empty".into()));
                }
                if !(0.0..=100.0).contains(&temperature) {
                    return Err(Error::Input(format!("temperature {temperature} out of range")));
                }
                let l = load(&common, ids.len() + max_tokens)?;
                let mut s = Session::new(&l.model, l.sess)?;
                let stop = if stop_at_eos { l.model.cfg.eos_token_ids.clone() } else { vec![] };
                let out = if temperature == 0.0 {
                    pollster::block_on(s.generate_greedy(&ids, max_tokens, &stop))?
                } else {
                    pollster::block_on(s.generate_sampled(&ids, max_tokens, &stop, temperature, seed))?
                };
                if json {
                    println!("{}", serde_json::json!({ "ids": out }));
                } else {
                    for id in out {
                        println!("{id}");
                    }
                }
            }
            Cmd::Bench { common, prompt_tokens, gen_tokens, repeat, json, profile } => {
                let l = load(&common, prompt_tokens + gen_tokens)?;
                let mut s = Session::new(&l.model, l.sess)?;
                if profile {
                    s.enable_profile();
                }
                let vocab = l.model.cfg.vocab_size as u32;
                let prompt: Vec<u32> = (0..prompt_tokens as u32).map(|i| (i * 7919 + 13) % vocab).collect();
                // Warm-up: compiles every pipeline (matmul, matvec, attention) on a short run.
                s.reset();
                pollster::block_on(s.feed(&prompt[..prompt.len().min(8)]))?;
                pollster::block_on(s.feed(&[1]))?;
                pollster::block_on(s.last_argmax())?;
                let (mut pre, mut dec) = (vec![], vec![]);
                for _ in 0..repeat.max(1) {
                    s.reset();
                    let t0 = Instant::now();
                    pollster::block_on(s.feed(&prompt))?;
                    let mut tok = pollster::block_on(s.last_argmax())?;
                    let t1 = Instant::now();
                    for _ in 0..gen_tokens {
                        pollster::block_on(s.feed(&[tok]))?;
                        tok = pollster::block_on(s.last_argmax())?;
                    }
                    let t2 = Instant::now();
                    pre.push(prompt_tokens as f64 / (t1 - t0).as_secs_f64());
                    dec.push(gen_tokens as f64 / (t2 - t1).as_secs_f64());
                }
                let (p, d) = (median(&mut pre), median(&mut dec));
                if let Some(prof) = s.profile() {
                    let mut v: Vec<_> = prof.iter().collect();
                    v.sort_by(|a, b| b.1.total_cmp(a.1));
                    for (k, t) in v {
                        eprintln!("{k:>10}: {t:8.3} s");
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
                        })
                    );
                } else {
                    println!("adapter: {} ({:?})", info.name, info.backend);
                    println!("prefill: {p:.1} tok/s ({prompt_tokens} tokens), decode: {d:.1} tok/s ({gen_tokens} tokens), median of {repeat}");
                }
            }
        }
        Ok(())
    }

    pub fn main() -> i32 {
        env_logger::init();
        let cli = Cli::parse();
        match run(cli) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("error: {e}");
                1
            }
        }
    }
}
