//! `serve` (the HTTP endpoint) and `batch` (Batch Transform files).

use super::{engine_named, Common, SAGEMAKER_MODEL_DIR};
use clap::Subcommand;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use tildeopen::{Error, Result};

#[derive(Subcommand)]
pub enum ServeCmd {
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
        /// Web page origins (scheme://host[:port], comma-separated; `*` for any) allowed to
        /// call the server. Requests without an Origin (curl, SDKs) and the server's own
        /// loopback origin are always allowed; others get 403.
        #[arg(long, value_delimiter = ',')]
        allowed_origins: Vec<String>,
        /// Require `Authorization: Bearer KEY` on every route but /ping (default:
        /// $TILDEOPEN_API_KEY when set).
        #[arg(long, env = "TILDEOPEN_API_KEY", hide_env_values = true)]
        api_key: Option<String>,
        /// Requests that may wait for a free slot; more get 503 with Retry-After.
        #[arg(long, default_value_t = tildeopen::serve::server::DEFAULT_MAX_QUEUE)]
        max_queue: usize,
        /// Seconds a client may take to send a request's body (its headers: at most 10 of
        /// them); a slower one gets 408 and is closed.
        #[arg(long, default_value_t = 30)]
        read_timeout: u64,
        /// Connections served at once; more are closed as they arrive.
        #[arg(long, default_value_t = tildeopen::serve::server::DEFAULT_MAX_CONNECTIONS)]
        max_connections: usize,
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
        /// Start over: replace an existing output instead of resuming it (needed when it was
        /// made from a different input, --join-source or model).
        #[arg(long)]
        overwrite: bool,
    },
}

pub fn run(cmd: ServeCmd) -> Result<()> {
    match cmd {
        ServeCmd::Serve { common, host, port, model_name, max_body_bytes, parallel, allowed_origins, api_key, max_queue, read_timeout, max_connections } => {
            let sagemaker = std::env::var_os("SAGEMAKER_BIND_TO_PORT").is_some() || Path::new(SAGEMAKER_MODEL_DIR).is_dir();
            let port = match port {
                Some(p) => p,
                None => match std::env::var("SAGEMAKER_BIND_TO_PORT") {
                    Ok(p) => p.parse().map_err(|_| Error::Input(format!("SAGEMAKER_BIND_TO_PORT={p:?} is not a port")))?,
                    Err(_) => 8080,
                },
            };
            let host = host.unwrap_or_else(|| if sagemaker { "0.0.0.0" } else { "127.0.0.1" }.to_string());
            let read_timeout = std::time::Duration::from_secs(read_timeout.max(1));
            // One name from the start (`/v1/models` answers it while the model loads).
            let name = super::served_name(&common, model_name);
            let opts = tildeopen::serve::server::ServeOptions {
                host,
                port,
                max_body_bytes,
                allowed_origins,
                api_key,
                max_queue,
                read_timeout,
                max_connections,
                model_name: name.clone(),
                parallel,
            };
            tildeopen::serve::server::serve(opts, move || engine_named(&common, Some(name), parallel), |addr| {
                eprintln!("listening on http://{addr}");
            })?;
        }
        ServeCmd::Batch { common, input, output_dir, join_source, model_name, parallel, overwrite } => {
            if !input.is_file() {
                return Err(Error::Input(format!("{}: no such input file", input.display())));
            }
            let mut eng = engine_named(&common, model_name, parallel)?;
            let bar = if std::io::stderr().is_terminal() { indicatif::ProgressBar::new(0) } else { indicatif::ProgressBar::hidden() };
            let s = tildeopen::serve::batch::run(&mut eng, &input, output_dir.as_deref(), join_source == "input", overwrite, |done, total| {
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
    }
    Ok(())
}
