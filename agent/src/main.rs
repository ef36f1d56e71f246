//! `lattice-agent`: the Lattice node agent (see the crate docs and README).

use lattice_agent::config::{Cli, Command, Config};

fn main() -> std::process::ExitCode {
    let cli: Cli = lattice_config::parse();
    match cli.command {
        Some(Command::Shim(args)) => {
            // The shim stays small: no runtime, no tracing; diagnostics go to stderr.
            let code = lattice_agent::shim::run(args);
            return std::process::ExitCode::from(code.clamp(0, 255) as u8);
        }
        Some(Command::PmixServer(args)) => {
            #[cfg(feature = "pmix")]
            let code = lattice_agent::pmix::sidecar::run(args.fd);
            #[cfg(not(feature = "pmix"))]
            let code = {
                eprintln!(
                    "lattice-agent pmix-server (fd {}): this agent was built without the cargo feature pmix",
                    args.fd
                );
                2
            };
            return std::process::ExitCode::from(code.clamp(0, 255) as u8);
        }
        None => {}
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,hyper=warn,reqwest=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cfg = match Config::from_args(cli.agent) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("lattice-agent: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("lattice-agent: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(lattice_agent::agent::run(cfg)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "lattice-agent failed");
            std::process::ExitCode::FAILURE
        }
    }
}
