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
    let r = match cli::Cli::parse().cmd {
        cli::Cmd::Chat(c) => cli::chat::run(c),
        cli::Cmd::Serve(c) => cli::serve::run(c),
        cli::Cmd::Tools(c) => cli::tools::run(c),
    };
    if let Err(e) = r {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
