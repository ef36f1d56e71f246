//! The `lattice` binary: parse arguments, run, exit with the command's code.

use std::io::IsTerminal;

use lattice_cli::config::Env;
use lattice_cli::RunOptions;

fn main() {
    let cli = match lattice_cli::parse_args(std::env::args_os()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: start the async runtime: {e}");
            std::process::exit(1);
        }
    };
    let opts = RunOptions {
        stdin: Box::new(std::io::stdin()),
        shutdown: Some(Box::pin(stop_requested())),
        tty: std::io::stdout().is_terminal(),
        ..RunOptions::default()
    };
    let mut out = std::io::stdout().lock();
    let mut err = std::io::stderr();
    let code = rt.block_on(lattice_cli::run(
        cli,
        &Env::from_process(),
        opts,
        &mut out,
        &mut err,
    ));
    drop(out);
    std::process::exit(code);
}

/// Resolves on Ctrl-C (SIGINT), SIGTERM or SIGHUP (the terminal closed): commands that
/// wait (`launch`, `session`, `watch`, `--wait`) stop and clean up as on Ctrl-C instead
/// of dying with their step or session left behind. The handlers are installed when a
/// command first waits on it; until then the signals end the process as usual.
async fn stop_requested() {
    use tokio::signal::unix::{signal, SignalKind};
    let (term, hup) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    );
    match (term, hup) {
        (Ok(mut term), Ok(mut hup)) => tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
            _ = hup.recv() => {}
        },
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
