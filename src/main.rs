//! The `tildeopen` command line: parses the arguments and dispatches to `src/cli/` (chat and the
//! tasks, model tools, serve and batch).

#[cfg(not(target_arch = "wasm32"))]
mod cli;

#[cfg(target_arch = "wasm32")]
fn main() {}

#[cfg(not(target_arch = "wasm32"))]
fn main() {
    use clap::Parser;
    cli::quiet_mesa();
    env_logger::init();
    let cmd = cli::Cli::parse().cmd;
    // `tildeopen logits ... | head`: a closed pipe ends the process quietly, as for other
    // command-line tools, instead of a panic in println! or a generation nobody reads. The
    // server and Batch Transform keep Rust's default (a write error, handled there).
    #[cfg(unix)]
    if !matches!(cmd, cli::Cmd::Serve(_)) {
        // SAFETY: sets a signal disposition before any thread is started.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    let r = match cmd {
        cli::Cmd::Chat(c) => cli::chat::run(c),
        cli::Cmd::Serve(c) => cli::serve::run(c),
        cli::Cmd::Tools(c) => cli::tools::run(c),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
