//! The `tildeopen` command line: chat, the response format's tasks (translate, ask, summarise),
//! complete, tokenize, perplexity, logits, bench.

#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    std::process::exit(cli::main());
}

#[cfg(not(target_arch = "wasm32"))]
mod cli {
    use clap::{Args, Parser, Subcommand};
    use std::io::{BufRead, IsTerminal, Write};
    use std::path::{Path, PathBuf};
    use std::time::Instant;
    use tildeopen::api::{ApiError, ChatRequest, Message, Stop};
    use tildeopen::gpu::GpuOptions;
    use tildeopen::loader::WeightFormat;
    use tildeopen::model::LoadOptions;
    use tildeopen::tasks::Task;
    use tildeopen::tokenizer::Tokenizer;
    use tildeopen::engine::kv_tokens_fit;
    use tildeopen::{fetch, ChatEngine, ChatOptions, Error, Model, Result, Session, SessionOptions};

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

    /// Generation settings shared by chat, translate, ask and summarise.
    #[derive(Args, Clone)]
    struct Gen {
        /// Most tokens to generate (default: until the model stops or the context is full).
        #[arg(long)]
        max_tokens: Option<u64>,
        /// 0 = greedy (the default here; the JSON API's default is 1).
        #[arg(long, default_value_t = 0.0)]
        temperature: f32,
        #[arg(long)]
        top_p: Option<f32>,
        #[arg(long)]
        top_k: Option<i64>,
        #[arg(long)]
        min_p: Option<f32>,
        /// transformers' repetition penalty (TildeOpen recommends 1.2).
        #[arg(long)]
        repetition_penalty: Option<f32>,
        #[arg(long)]
        presence_penalty: Option<f32>,
        #[arg(long)]
        frequency_penalty: Option<f32>,
        #[arg(long)]
        seed: Option<u64>,
        /// A stop string (repeatable).
        #[arg(long)]
        stop: Vec<String>,
        /// Print the chat.completion object (with --stream: one chat.completion.chunk per line).
        #[arg(long)]
        json: bool,
        /// Print the answer as it is generated.
        #[arg(long)]
        stream: bool,
    }

    #[derive(Subcommand)]
    enum Cmd {
        /// Answer a chat message (without one: an interactive chat on stdin).
        Chat {
            #[command(flatten)]
            common: Common,
            #[command(flatten)]
            gen: Gen,
            /// A system message.
            #[arg(long)]
            system: Option<String>,
            /// A whole chat request as JSON (OpenAI shape) from this file, `-` for stdin.
            #[arg(long, conflicts_with = "message")]
            request: Option<PathBuf>,
            message: Option<String>,
        },
        /// Translate text (the translation only; line and paragraph structure kept).
        Translate {
            #[command(flatten)]
            common: Common,
            #[command(flatten)]
            gen: Gen,
            /// Source language (code such as en, or a name).
            #[arg(long)]
            from: String,
            /// Target language.
            #[arg(long)]
            to: String,
            /// Glossary: `source term<TAB>target term` lines.
            #[arg(long)]
            glossary: Option<PathBuf>,
            /// Examples: `source<TAB>translation` lines.
            #[arg(long)]
            examples: Option<PathBuf>,
            /// Read the text from a file.
            #[arg(long, conflicts_with = "text")]
            file: Option<PathBuf>,
            text: Option<String>,
        },
        /// Answer a question from a context document.
        Ask {
            #[command(flatten)]
            common: Common,
            #[command(flatten)]
            gen: Gen,
            #[arg(long)]
            context_file: Option<PathBuf>,
            #[arg(long, conflicts_with = "context_file")]
            context: Option<String>,
            question: String,
        },
        /// Summarise a text; --instruction sets length and focus.
        #[command(alias = "summarize")]
        Summarise {
            #[command(flatten)]
            common: Common,
            #[command(flatten)]
            gen: Gen,
            #[arg(long)]
            instruction: Option<String>,
            #[arg(long, conflicts_with = "text")]
            file: Option<PathBuf>,
            text: Option<String>,
        },
        /// Serve the response format over HTTP: /invocations and /ping (SageMaker), /v1/chat/completions
        /// and /v1/models (OpenAI), server-sent events for "stream": true.
        Serve {
            #[command(flatten)]
            common: Common,
            /// Default 127.0.0.1; 0.0.0.0 inside a SageMaker container.
            #[arg(long)]
            host: Option<String>,
            /// Default $SAGEMAKER_BIND_TO_PORT, else 8080. 0 picks a free port.
            #[arg(long)]
            port: Option<u16>,
            /// The `model` name responses carry (default: the file or directory name).
            #[arg(long)]
            model_name: Option<String>,
            /// Largest request body in bytes.
            #[arg(long, default_value_t = 16 << 20)]
            max_body_bytes: usize,
            /// Requests answered at once (continuous batching), each with --ctx-size tokens of
            /// KV cache; more wait in arrival order.
            #[arg(long, default_value_t = 4)]
            parallel: usize,
        },
        /// Batch Transform: one chat request per line of INPUT, one response per line of
        /// <output-dir>/<input name>.out, in order; rerun to resume.
        Batch {
            #[command(flatten)]
            common: Common,
            input: PathBuf,
            /// Default: the input's folder.
            #[arg(long)]
            output_dir: Option<PathBuf>,
            /// `input`: each output line is the request with the response under "SageMakerOutput".
            #[arg(long, value_parser = ["none", "input"], default_value = "none")]
            join_source: String,
            #[arg(long)]
            model_name: Option<String>,
            /// Requests answered at once (their decode steps share each forward pass), each
            /// with --ctx-size tokens of KV cache.
            #[arg(long, default_value_t = 8)]
            parallel: usize,
        },
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
        path: PathBuf,
    }

    /// SageMaker mounts the model here.
    const SAGEMAKER_MODEL_DIR: &str = "/opt/ml/model";

    /// `--model`, else a model under /opt/ml/model (a GGUF file in it, or the directory as an HF
    /// checkpoint), else the demo model.
    fn model_path(c: &Common) -> Result<PathBuf> {
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
    fn progress_bar() -> (indicatif::ProgressBar, impl FnMut(usize, usize)) {
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

    fn load(c: &Common, min_ctx: usize) -> Result<Loaded> {
        let path = model_path(c)?;
        let opts = LoadOptions {
            gpu: GpuOptions { max_binding_size: c.max_binding_size },
            hf_format: WeightFormat::parse(&c.quant)?,
        };
        let (bar, progress) = progress_bar();
        let model = pollster::block_on(Model::load_with_progress(&path, &opts, progress));
        bar.finish_and_clear();
        let model = model?;
        let kv_f16 = c.kv_cache == "f16";
        // Default context: the model's, at most 4096 and at most what one KV buffer can hold,
        // but never less than this command needs.
        let fits = kv_tokens_fit(&model, kv_f16);
        let ctx = c
            .ctx_size
            .unwrap_or_else(|| model.cfg.max_position_embeddings.clamp(1, 4096).min(fits).max(min_ctx));
        let sess = SessionOptions { ctx_size: ctx, kv_f16, ..Default::default() };
        Ok(Loaded { model, sess, path })
    }

    /// The `model` name responses carry: the GGUF's file stem or the checkpoint directory's name.
    fn model_name(path: &Path) -> String {
        let p = if path.is_dir() { path.file_name() } else { path.file_stem() };
        p.and_then(|s| s.to_str()).unwrap_or("tildeopen").to_string()
    }

    fn engine(c: &Common) -> Result<ChatEngine> {
        engine_named(c, None, 1)
    }

    /// A chat engine answering up to `parallel` requests at once, each with the context of
    /// --ctx-size (default: the model's, at most 4096 and at most what the KV buffers can hold
    /// for all of them).
    fn engine_named(c: &Common, name: Option<String>, parallel: usize) -> Result<ChatEngine> {
        if parallel == 0 {
            return Err(Error::Input("--parallel must be at least 1".into()));
        }
        let l = load(c, 0)?;
        let tok = Tokenizer::load(&l.path)?;
        let fits = (kv_tokens_fit(&l.model, l.sess.kv_f16) / parallel).max(2);
        let opts = ChatOptions {
            ctx_size: Some(c.ctx_size.unwrap_or(l.sess.ctx_size.min(fits))),
            kv_f16: l.sess.kv_f16,
            max_batch: l.sess.max_batch,
            parallel,
            model_name: name.unwrap_or_else(|| model_name(&l.path)),
        };
        ChatEngine::new(&l.model, tok, opts)
    }

    fn request(g: &Gen, messages: Vec<Message>, task: Option<Task>) -> ChatRequest {
        ChatRequest {
            messages,
            task,
            max_tokens: g.max_tokens,
            temperature: Some(g.temperature),
            top_p: g.top_p,
            top_k: g.top_k,
            min_p: g.min_p,
            repetition_penalty: g.repetition_penalty,
            presence_penalty: g.presence_penalty,
            frequency_penalty: g.frequency_penalty,
            seed: g.seed,
            stop: if g.stop.is_empty() { None } else { Some(Stop::Many(g.stop.clone())) },
            stream: Some(g.stream),
            ..Default::default()
        }
    }

    fn api_err(e: ApiError, json: bool) -> Error {
        if json {
            println!("{}", e.body());
        }
        Error::Input(e.message)
    }

    /// Runs a request and prints it as --json/--stream ask; returns the answer text.
    fn answer(eng: &mut ChatEngine, req: &ChatRequest, json: bool, stream: bool) -> Result<String> {
        use futures_util::StreamExt;
        let mut out = std::io::stdout().lock();
        if !stream {
            let c = pollster::block_on(eng.complete(req)).map_err(|e| api_err(e, json))?;
            if json {
                writeln!(out, "{}", serde_json::to_string(&c).unwrap()).ok();
            } else {
                writeln!(out, "{}", c.content()).ok();
            }
            return Ok(c.content().to_string());
        }
        pollster::block_on(async {
            let mut s = Box::pin(eng.stream(req).await.map_err(|e| api_err(e, json))?);
            let mut text = String::new();
            while let Some(chunk) = s.next().await {
                let chunk = chunk.map_err(|e| api_err(e, json))?;
                if json {
                    writeln!(out, "{}", serde_json::to_string(&chunk).unwrap()).ok();
                } else if let Some(c) = &chunk.choices[0].delta.content {
                    write!(out, "{c}").ok();
                    text += c;
                }
                out.flush().ok();
            }
            if !json {
                writeln!(out).ok();
            }
            Ok(text)
        })
    }

    fn read_text(path: &Path) -> Result<String> {
        if path == Path::new("-") {
            let mut s = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut s).map_err(|e| Error::Io { path: "stdin".into(), source: e })?;
            return Ok(s);
        }
        std::fs::read_to_string(path).map_err(|e| Error::Io { path: path.display().to_string(), source: e })
    }

    /// `a<TAB>b` lines (blank lines and lines starting with # skipped).
    fn read_pairs(path: &Path) -> Result<Vec<(String, String)>> {
        let text = read_text(path)?;
        let mut pairs = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end_matches('\r');
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once('\t') {
                Some((a, b)) if !a.trim().is_empty() && !b.trim().is_empty() => pairs.push((a.trim().to_string(), b.trim().to_string())),
                _ => return Err(Error::Input(format!("{}:{}: expected `source<TAB>target`", path.display(), i + 1))),
            }
        }
        Ok(pairs)
    }

    fn text_arg(text: Option<String>, file: Option<PathBuf>, what: &str) -> Result<String> {
        match (text, file) {
            (Some(t), _) => Ok(t),
            (None, Some(f)) => read_text(&f),
            (None, None) => Err(Error::Input(format!("give the {what} as an argument or with --file"))),
        }
    }

    /// An interactive chat on stdin: each line is a user turn; `/reset` forgets the history.
    fn interactive(eng: &mut ChatEngine, g: &Gen, system: Option<String>) -> Result<()> {
        let tty = std::io::stdin().is_terminal();
        let mut history: Vec<Message> = system.iter().map(Message::system).collect();
        let base = history.clone();
        if tty {
            eprintln!("chat with {} ({} tokens of context); /reset forgets, Ctrl-D ends", eng.model_name(), eng.context_size());
        }
        let stdin = std::io::stdin();
        loop {
            if tty {
                eprint!("> ");
            }
            let mut line = String::new();
            if stdin.lock().read_line(&mut line).map_err(|e| Error::Io { path: "stdin".into(), source: e })? == 0 {
                return Ok(());
            }
            let line = line.trim();
            if line.is_empty() {
                continue;
            }
            if line == "/reset" {
                history = base.clone();
                continue;
            }
            history.push(Message::user(line));
            let req = request(g, history.clone(), None);
            match answer(eng, &req, g.json, g.stream || !g.json) {
                Ok(text) => history.push(Message::assistant(text)),
                Err(e) => {
                    eprintln!("error: {e}");
                    history.pop();
                }
            }
        }
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
            Cmd::Complete { common, tokens, prompt, max_tokens, temperature, seed, stop_at_eos, json } => {
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
                let l = load(&Common { model: Some(path), ..common }, ids.len() + max_tokens)?;
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
            Cmd::Chat { common, gen, system, request: req_file, message } => {
                if let Some(f) = req_file {
                    let body = read_text(&f)?;
                    let req = ChatRequest::from_json(&body).map_err(|e| api_err(e, gen.json))?;
                    let mut eng = engine(&common)?;
                    let stream = req.stream.unwrap_or(false);
                    answer(&mut eng, &req, gen.json, stream)?;
                    return Ok(());
                }
                let mut eng = engine(&common)?;
                match message {
                    Some(m) => {
                        let mut msgs: Vec<Message> = system.iter().map(Message::system).collect();
                        msgs.push(Message::user(m));
                        answer(&mut eng, &request(&gen, msgs, None), gen.json, gen.stream)?;
                    }
                    None => interactive(&mut eng, &gen, system)?,
                }
            }
            Cmd::Translate { common, gen, from, to, glossary, examples, file, text } => {
                let task = Task::Translate {
                    text: text_arg(text, file, "text")?,
                    source: from,
                    target: to,
                    glossary: glossary.as_deref().map(read_pairs).transpose()?.unwrap_or_default(),
                    examples: examples.as_deref().map(read_pairs).transpose()?.unwrap_or_default(),
                };
                let mut eng = engine(&common)?;
                answer(&mut eng, &request(&gen, vec![], Some(task)), gen.json, gen.stream)?;
            }
            Cmd::Ask { common, gen, context_file, context, question } => {
                let context = match (context, context_file) {
                    (Some(c), _) => c,
                    (None, Some(f)) => read_text(&f)?,
                    (None, None) => return Err(Error::Input("give --context-file or --context".into())),
                };
                let mut eng = engine(&common)?;
                answer(&mut eng, &request(&gen, vec![], Some(Task::Ask { context, question })), gen.json, gen.stream)?;
            }
            Cmd::Summarise { common, gen, instruction, file, text } => {
                let task = Task::Summarise { text: text_arg(text, file, "text")?, instruction };
                let mut eng = engine(&common)?;
                answer(&mut eng, &request(&gen, vec![], Some(task)), gen.json, gen.stream)?;
            }
            Cmd::Serve { common, host, port, model_name, max_body_bytes, parallel } => {
                let sagemaker = std::env::var_os("SAGEMAKER_BIND_TO_PORT").is_some() || Path::new(SAGEMAKER_MODEL_DIR).is_dir();
                let port = match port {
                    Some(p) => p,
                    None => match std::env::var("SAGEMAKER_BIND_TO_PORT") {
                        Ok(p) => p.parse().map_err(|_| Error::Input(format!("SAGEMAKER_BIND_TO_PORT={p:?} is not a port")))?,
                        Err(_) => 8080,
                    },
                };
                let host = host.unwrap_or_else(|| if sagemaker { "0.0.0.0" } else { "127.0.0.1" }.to_string());
                let opts = tildeopen::server::ServeOptions { host, port, max_body_bytes };
                tildeopen::server::serve(opts, move || engine_named(&common, model_name, parallel), |addr| {
                    eprintln!("listening on http://{addr}");
                })?;
            }
            Cmd::Batch { common, input, output_dir, join_source, model_name, parallel } => {
                if !input.is_file() {
                    return Err(Error::Input(format!("{}: no such input file", input.display())));
                }
                let mut eng = engine_named(&common, model_name, parallel)?;
                let bar = if std::io::stderr().is_terminal() { indicatif::ProgressBar::new(0) } else { indicatif::ProgressBar::hidden() };
                let s = tildeopen::batch::run(&mut eng, &input, output_dir.as_deref(), join_source == "input", |done, total| {
                    bar.set_length(total as u64);
                    bar.set_position(done as u64);
                })?;
                bar.finish_and_clear();
                let new = s.lines - s.resumed;
                eprintln!(
                    "{} lines ({} resumed from an earlier run, {new} answered now), {} errors, {} prompt + {} completion tokens in {:.1} s ({:.2} completion tokens/s) -> {}",
                    s.lines, s.resumed, s.errors, s.prompt_tokens, s.completion_tokens, s.seconds,
                    s.completion_tokens as f64 / s.seconds.max(1e-9), s.output.display()
                );
            }
            Cmd::Tokenize { model, text, jsonl } => {
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
            Cmd::Perplexity { common, file, ctx, chunks } => {
                let text = read_text(&file)?;
                let path = model_path(&common)?;
                let tok = Tokenizer::load(&path)?;
                let mut ids = tok.encode(&text)?;
                if let Some(n) = chunks {
                    ids.truncate(n * ctx);
                }
                let l = load(&Common { model: Some(path), ctx_size: Some(ctx), ..common }, ctx)?;
                let mut s = Session::new(&l.model, SessionOptions { max_batch: ctx.min(512), ..l.sess })?;
                let bos = if tok.add_bos { tok.bos } else { None };
                let n = ids.len() / ctx.max(1);
                eprintln!("{} tokens, {n} chunks of {ctx}", ids.len());
                let r = pollster::block_on(tildeopen::perplexity::perplexity(&mut s, &ids, ctx, bos, |i, p| {
                    eprintln!("[{}/{n}] {p:.4}", i + 1);
                }))?;
                println!("chunks: {}, scored tokens: {}", r.chunks, r.scored);
                println!("PPL = {:.4}", r.ppl);
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
