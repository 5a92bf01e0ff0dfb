//! `chat` and the tasks: `translate`, `ask`, `summarise`.

use super::{engine, read_text, Common};
use clap::{Args, Subcommand};
use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use tildeopen::chat::api::{ApiError, ChatRequest, Message, Stop};
use tildeopen::chat::tasks::Task;
use tildeopen::{ChatEngine, Error, Result};

/// Generation settings shared by chat, translate, ask and summarise.
#[derive(Args, Clone)]
pub struct Gen {
    /// Most tokens to generate (default: until the model stops or the context is full).
    #[arg(long)]
    pub max_tokens: Option<u64>,
    /// 0 = greedy (the default here; the JSON API's default is 1).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    #[arg(long)]
    pub top_p: Option<f32>,
    #[arg(long)]
    pub top_k: Option<i64>,
    #[arg(long)]
    pub min_p: Option<f32>,
    /// transformers' repetition penalty (TildeOpen recommends 1.2).
    #[arg(long)]
    pub repetition_penalty: Option<f32>,
    #[arg(long, allow_negative_numbers = true)]
    pub presence_penalty: Option<f32>,
    #[arg(long, allow_negative_numbers = true)]
    pub frequency_penalty: Option<f32>,
    #[arg(long)]
    pub seed: Option<u64>,
    /// A stop string (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Print the chat.completion object (with --stream: one chat.completion.chunk per line).
    #[arg(long)]
    pub json: bool,
    /// Print the answer as it is generated.
    #[arg(long)]
    pub stream: bool,
}

#[derive(Subcommand)]
pub enum ChatCmd {
    /// Answer a chat message (without one: an interactive chat on stdin).
    Chat {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        gen: Gen,
        /// A system message.
        #[arg(long)]
        system: Option<String>,
        /// A whole chat request as JSON (OpenAI shape) from this file, `-` for stdin. Its
        /// fields are the settings: the sampling flags and --system conflict with it (--json
        /// and --stream apply).
        #[arg(long, conflicts_with_all = ["message", "system", "max_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty", "seed", "stop"])]
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
}

pub fn run(cmd: ChatCmd) -> Result<()> {
    match cmd {
        ChatCmd::Chat { common, gen, system, request: req_file, message } => {
            if let Some(f) = req_file {
                let body = read_text(&f)?;
                let req = ChatRequest::from_json(&body).map_err(|e| api_err(e, gen.json))?;
                let mut eng = engine(&common)?;
                let stream = gen.stream || req.stream.unwrap_or(false);
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
        ChatCmd::Translate { common, gen, from, to, glossary, examples, file, text } => {
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
        ChatCmd::Ask { common, gen, context_file, context, question } => {
            let context = match (context, context_file) {
                (Some(c), _) => c,
                (None, Some(f)) => read_text(&f)?,
                (None, None) => return Err(Error::Input("give --context-file or --context".into())),
            };
            let mut eng = engine(&common)?;
            answer(&mut eng, &request(&gen, vec![], Some(Task::Ask { context, question })), gen.json, gen.stream)?;
        }
        ChatCmd::Summarise { common, gen, instruction, file, text } => {
            let task = Task::Summarise { text: text_arg(text, file, "text")?, instruction };
            let mut eng = engine(&common)?;
            answer(&mut eng, &request(&gen, vec![], Some(task)), gen.json, gen.stream)?;
        }
    }
    Ok(())
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
            let delta = chunk.choices[0].delta.content.as_deref().unwrap_or("");
            let written = if json { writeln!(out, "{}", serde_json::to_string(&chunk).unwrap()) } else { write!(out, "{delta}") };
            // The answer joins the conversation whichever way it is printed (with --json the
            // history kept empty assistant turns).
            text += delta;
            // A reader that went away ends the generation (it ran on to the end of the context).
            if written.and_then(|_| out.flush()).is_err() {
                return Err(Error::Input("standard output was closed".into()));
            }
        }
        if !json {
            writeln!(out).ok();
        }
        Ok(text)
    })
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
