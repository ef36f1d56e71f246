//! `lattice config view|set-url|set-token|set-tenant`.

use std::io::Write;

use crate::cli::ConfigCommand;
use crate::config::{self, Env, FlagValues, Source};
use crate::errors::CliError;

fn source_word(s: Source) -> &'static str {
    match s {
        Source::Flag => "flag",
        Source::Env => "environment",
        Source::File => "config file",
        Source::Default => "default",
    }
}

/// Runs a `config` subcommand.
pub fn run(
    cmd: &ConfigCommand,
    flags: &FlagValues,
    env: &Env,
    out: &mut dyn Write,
) -> Result<i32, CliError> {
    let Some(path) = config::config_path(flags.config.as_deref(), env) else {
        return Err(CliError::new(
            "locate the config file",
            "neither HOME nor XDG_CONFIG_HOME is set",
        )
        .hint("pass --config PATH"));
    };
    match cmd {
        ConfigCommand::View { raw } => {
            let mut file = config::load_file(&path)?;
            if !raw && file.token.is_some() {
                file.token = Some("REDACTED".into());
            }
            writeln!(out, "# {}", path.display())?;
            let text = serde_yaml::to_string(&file).unwrap_or_default();
            if text.trim() == "{}" {
                writeln!(out, "# (empty or missing)")?;
            } else {
                out.write_all(text.as_bytes())?;
            }
            let s = config::load(flags, env, true)?;
            writeln!(out, "# effective settings:")?;
            writeln!(
                out,
                "#   api_url: {} ({})",
                s.api_url,
                source_word(s.api_url_source)
            )?;
            writeln!(
                out,
                "#   tenant: {} ({})",
                s.tenant,
                source_word(s.tenant_source)
            )?;
            writeln!(
                out,
                "#   token: {}",
                if s.token.is_some() { "set" } else { "not set" }
            )?;
            Ok(0)
        }
        ConfigCommand::SetUrl { url } => {
            let mut file = config::load_file(&path)?;
            file.api_url = Some(config::normalize_url(url));
            config::save_file(&path, &file)?;
            writeln!(
                out,
                "api_url set to {} in {}",
                config::normalize_url(url),
                path.display()
            )?;
            Ok(0)
        }
        ConfigCommand::SetToken {
            token,
            file: token_file,
        } => {
            let mut file = config::load_file(&path)?;
            match (token, token_file) {
                (Some(t), None) => {
                    file.token = Some(t.trim().to_string());
                    file.token_file = None;
                    config::save_file(&path, &file)?;
                    writeln!(out, "token set in {}", path.display())?;
                }
                (None, Some(f)) => {
                    file.token = None;
                    file.token_file = Some(f.clone());
                    config::save_file(&path, &file)?;
                    writeln!(out, "token_file set to {f} in {}", path.display())?;
                }
                _ => {
                    return Err(CliError::new(
                        "config set-token",
                        "give either a TOKEN or --file PATH",
                    )
                    .hint("e.g. `lattice config set-token --file /var/lib/lattice/admin.token`"))
                }
            }
            Ok(0)
        }
        ConfigCommand::SetTenant { tenant } => {
            let mut file = config::load_file(&path)?;
            file.tenant = Some(tenant.clone());
            config::save_file(&path, &file)?;
            writeln!(out, "tenant set to {tenant} in {}", path.display())?;
            Ok(0)
        }
    }
}
