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
        shutdown: Some(Box::pin(async {
            let _ = tokio::signal::ctrl_c().await;
        })),
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
