//! # lattice-config
//!
//! A daemon's config file: a flat TOML file whose keys are the daemon's long flags without
//! the leading `--`, each set to what the flag takes.
//!
//! ```toml
//! data-dir = "/var/lib/lattice"
//! tls-addr = "0.0.0.0:8443"
//! tls-san = ["lattice.example.org", "10.0.0.5"]   # a flag given several times
//! heartbeat-timeout = "30s"
//! store-threads = 2
//! bootstrap = true                                # a switch: true, or leave it out
//! ```
//!
//! A setting counts for what neither the command line nor the environment says:
//! command-line flag > environment variable > config file > the flag's default.
//!
//! The flags are defined once, by the daemon's clap [`Parser`]: the file's keys are that
//! command's long flags, and nothing else. [`try_parse_from`] parses the command line and
//! the environment, reads the file named by the argument with id [`CONFIG_ARG`] (its
//! `--config` flag or that flag's environment variable), and then parses the command line
//! once more with the file's settings in front of it, for the flags that neither the command
//! line nor the environment set. So each value from the file passes the flag's own parser,
//! and the rules between flags (`requires`, `conflicts_with`) hold for the file as they
//! hold for the command line. With a subcommand the file is not read: it configures the
//! daemon, not its tools.
//!
//! ```
//! use clap::Parser;
//!
//! #[derive(Parser, Debug)]
//! struct Args {
//!     /// A TOML file of flag values.
//!     #[arg(long)]
//!     config: Option<std::path::PathBuf>,
//!     #[arg(long, default_value_t = 1)]
//!     threads: usize,
//!     #[arg(long)]
//!     verbose: bool,
//! }
//!
//! let dir = tempfile::tempdir().unwrap();
//! let file = dir.path().join("d.toml");
//! std::fs::write(&file, "threads = 4\nverbose = true\n").unwrap();
//! let config = file.to_str().unwrap();
//! let args: Args = lattice_config::try_parse_from(["d", "--config", config]).unwrap();
//! assert_eq!((args.threads, args.verbose), (4, true));
//! // The command line wins.
//! let args: Args =
//!     lattice_config::try_parse_from(["d", "--config", config, "--threads", "8"]).unwrap();
//! assert_eq!(args.threads, 8);
//! // A key that is no flag is an error naming the file, the line and the key.
//! std::fs::write(&file, "thread = 4\n").unwrap();
//! let e = lattice_config::try_parse_from::<Args, _, _>(["d", "--config", config]).unwrap_err();
//! assert!(e.to_string().contains("d.toml:1: unknown key `thread`"), "{e}");
//! ```

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, Command, Parser};

/// The id of the argument that names the config file (a `config: Option<PathBuf>` field).
pub const CONFIG_ARG: &str = "config";

/// Parse `P` from the process's arguments and environment with its config file under
/// them; on an error, print it and exit as clap does.
pub fn parse<P: Parser>() -> P {
    try_parse_from(std::env::args_os()).unwrap_or_else(|e| e.exit())
}

/// Parse `P` from `args` (the program name first) and the environment, with the settings
/// of the config file named by `--config` (or its environment variable) under both.
///
/// Panics when `P` has no argument with id [`CONFIG_ARG`] of type `PathBuf`.
pub fn try_parse_from<P, I, T>(args: I) -> Result<P, clap::Error>
where
    P: Parser,
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    let cmd = P::command();
    let Some((file, settings)) = file_settings(&cmd, &args)? else {
        return P::try_parse_from(args);
    };
    let mut full = Vec::with_capacity(args.len() + settings.len());
    full.extend(args.first().cloned());
    full.extend(settings);
    full.extend(args.iter().skip(1).cloned());
    P::try_parse_from(full).map_err(|e| match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => e,
        kind => {
            let rendered = e.render().to_string();
            let message = rendered
                .strip_prefix("error: ")
                .unwrap_or(&rendered)
                .trim_end();
            clap::Error::raw(
                kind,
                format!(
                    "{message}\n\n(with the settings of the config file {})\n",
                    file.display()
                ),
            )
        }
    })
}

/// The long flags `cmd --help` shows (`help` and `version` included): what a user reads,
/// for tests that the config keys and the help agree.
pub fn help_long_flags(cmd: &Command) -> std::collections::BTreeSet<String> {
    let help = cmd.clone().render_long_help().to_string();
    help.lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let l = l
                .strip_prefix("-h, ")
                .or(l.strip_prefix("-V, "))
                .unwrap_or(l);
            let flag = l.strip_prefix("--")?;
            let end = flag
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
                .unwrap_or(flag.len());
            Some(flag[..end].to_string())
        })
        .collect()
}

/// The keys a config file of `cmd` takes: its long flags, but `--help`, `--version` and
/// the config flag itself.
pub fn keys(cmd: &Command) -> Vec<&str> {
    cmd.get_arguments().filter_map(key_of).collect()
}

fn key_of(arg: &Arg) -> Option<&str> {
    let long = arg.get_long()?;
    let builtin = matches!(
        arg.get_action(),
        ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong | ArgAction::Version
    );
    (!builtin && arg.get_id() != CONFIG_ARG).then_some(long)
}

/// The config file `args` name, and its settings as command-line arguments for the flags
/// that neither `args` nor the environment set. `None`: no file, or a subcommand.
fn file_settings(
    cmd: &Command,
    args: &[OsString],
) -> Result<Option<(PathBuf, Vec<OsString>)>, clap::Error> {
    // A first, lenient parse: which config file, and where each flag's value comes from.
    // Help, version and real errors are left to the full parse.
    let Ok(probe) = cmd.clone().ignore_errors(true).try_get_matches_from(args) else {
        return Ok(None);
    };
    if probe.subcommand().is_some() {
        return Ok(None);
    }
    let path = match probe.try_get_one::<PathBuf>(CONFIG_ARG) {
        Ok(Some(path)) => path.clone(),
        Ok(None) => return Ok(None),
        Err(e) => panic!(
            "{}: no `{CONFIG_ARG}` argument of type PathBuf: {e}",
            cmd.get_name()
        ),
    };
    let file =
        ConfigFile::load(&path, cmd).map_err(|e| clap::Error::raw(e.kind(), format!("{e}\n")))?;
    let mut settings = Vec::new();
    for s in &file.settings {
        let given = matches!(
            probe.value_source(&s.id),
            Some(ValueSource::CommandLine | ValueSource::EnvVariable)
        );
        if given {
            continue;
        }
        match &s.value {
            Setting::Switch(true) => settings.push(OsString::from(format!("--{}", s.key))),
            Setting::Switch(false) => {}
            Setting::Values(values) => settings.extend(
                values
                    .iter()
                    .map(|v| OsString::from(format!("--{}={v}", s.key))),
            ),
        }
    }
    Ok(Some((path, settings)))
}

/// A config file, read and checked against a command's flags.
#[derive(Debug)]
pub struct ConfigFile {
    /// Where it was read from.
    pub path: PathBuf,
    settings: Vec<Entry>,
}

#[derive(Debug)]
struct Entry {
    /// The flag's long name (the key).
    key: String,
    /// The flag's argument id.
    id: String,
    value: Setting,
}

#[derive(Debug, PartialEq)]
enum Setting {
    /// A flag that takes no value.
    Switch(bool),
    /// The values of a flag that takes some (several for a flag given more than once).
    Values(Vec<String>),
}

/// What is wrong with a config file: the file, the line, and what to do about it.
#[derive(Debug)]
pub struct ConfigError {
    path: PathBuf,
    line: Option<usize>,
    message: String,
    kind: ErrorKind,
}

impl ConfigError {
    /// The clap error kind it is reported as (exit code 2, as for a bad flag).
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "{}:{line}: {}", self.path.display(), self.message),
            None => write!(f, "{}: {}", self.path.display(), self.message),
        }
    }
}

impl std::error::Error for ConfigError {}

/// Refuses `path` unless it and every directory above it (symbolic links resolved) are
/// owned by root and not writable by group or others. A directory with the sticky bit
/// (`/tmp`) passes: nobody else may rename or remove the root-owned entry below it.
pub fn only_root_writes(path: &Path) -> Result<(), ConfigError> {
    use std::os::unix::fs::MetadataExt;
    let io = |message: String| ConfigError {
        path: path.to_path_buf(),
        line: None,
        message,
        kind: ErrorKind::Io,
    };
    let real =
        std::fs::canonicalize(path).map_err(|e| io(format!("cannot read the config file: {e}")))?;
    for p in real.ancestors() {
        let m =
            std::fs::metadata(p).map_err(|e| io(format!("cannot inspect {}: {e}", p.display())))?;
        let sticky_dir = m.is_dir() && m.mode() & 0o1000 != 0;
        if m.uid() != 0 || (m.mode() & 0o022 != 0 && !sticky_dir) {
            return Err(io(format!(
                "{} is owned by uid {} with mode {:o}: a daemon running as root takes its \
                 config only from files and directories that root owns and nobody else may \
                 write (chown root {0}; chmod go-w {0})",
                p.display(),
                m.uid(),
                m.mode() & 0o7777
            )));
        }
    }
    Ok(())
}

impl ConfigFile {
    /// Read `path` and check every key and value against `cmd`'s flags.
    ///
    /// A daemon running as root (the agent) takes its file only from root: the file and
    /// every directory above it must be owned by root and writable by nobody else, or
    /// whoever could write it would choose, for instance, the uid floor of jobs.
    pub fn load(path: &Path, cmd: &Command) -> Result<Self, ConfigError> {
        if nix::unistd::geteuid().is_root() {
            only_root_writes(path)?;
        }
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            path: path.to_path_buf(),
            line: None,
            message: format!("cannot read the config file: {e}"),
            kind: ErrorKind::Io,
        })?;
        Self::parse(path, &text, cmd)
    }

    /// Check `text` (the contents of `path`) against `cmd`'s flags.
    pub fn parse(path: &Path, text: &str, cmd: &Command) -> Result<Self, ConfigError> {
        let error = |span: Option<std::ops::Range<usize>>, kind, message: String| ConfigError {
            path: path.to_path_buf(),
            line: span.map(|s| 1 + text[..s.start.min(text.len())].matches('\n').count()),
            message,
            kind,
        };
        let doc = toml_edit::Document::parse(text).map_err(|e| {
            let message = e.message().trim_end().to_string();
            error(
                e.span(),
                ErrorKind::InvalidValue,
                format!("not TOML: {message}"),
            )
        })?;
        let bin = cmd.get_name();
        let table = doc.as_table();
        let mut settings = Vec::new();
        for (name, _) in table.iter() {
            let (key, item) = table.get_key_value(name).expect("a key of this table");
            let span = key.span();
            let Some(arg) = cmd.get_arguments().find(|a| key_of(a) == Some(name)) else {
                let config_flag = cmd
                    .get_arguments()
                    .find(|a| a.get_id() == CONFIG_ARG)
                    .and_then(Arg::get_long);
                let hint = if config_flag == Some(name) {
                    "; a config file cannot name another".to_string()
                } else {
                    match closest(name, &keys(cmd)) {
                        Some(k) => format!("; did you mean `{k}`?"),
                        None => String::new(),
                    }
                };
                return Err(error(
                    span,
                    ErrorKind::UnknownArgument,
                    format!(
                        "unknown key `{name}`: not a flag of {bin}{hint} (the keys are {bin}'s \
                         long flags without `--`; `{bin} --help` lists them)"
                    ),
                ));
            };
            let value_span = item.span().or(span.clone());
            let value = match item {
                toml_edit::Item::Value(v) => v,
                _ => {
                    return Err(error(
                        span,
                        ErrorKind::InvalidValue,
                        format!(
                            "`{name}` is a table; the file is flat, one `key = value` per flag \
                             (no [sections])"
                        ),
                    ))
                }
            };
            let shown = value_span
                .clone()
                .and_then(|s| text.get(s))
                .unwrap_or("")
                .trim();
            let setting = setting(arg, name, value, shown)
                .map_err(|m| error(value_span, ErrorKind::InvalidValue, m))?;
            settings.push(Entry {
                key: name.to_string(),
                id: arg.get_id().to_string(),
                value: setting,
            });
        }
        Ok(Self {
            path: path.to_path_buf(),
            settings,
        })
    }

    /// The keys the file sets, in its order.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.settings.iter().map(|s| s.key.as_str())
    }
}

/// `value` as the setting of flag `arg`, each value checked by the flag's own parser.
fn setting(arg: &Arg, key: &str, value: &toml_edit::Value, shown: &str) -> Result<Setting, String> {
    use toml_edit::Value;
    if !arg.get_action().takes_values() {
        return match value {
            Value::Boolean(b) => Ok(Setting::Switch(*b.value())),
            _ => Err(format!(
                "`{key} = {shown}`: --{key} is a switch; write `{key} = true` (or leave it out)"
            )),
        };
    }
    let scalar = |v: &Value| -> Result<String, String> {
        match v {
            Value::String(s) => Ok(s.value().clone()),
            Value::Integer(i) => Ok(i.value().to_string()),
            Value::Float(f) => Ok(f.value().to_string()),
            Value::Boolean(b) => Ok(b.value().to_string()),
            Value::Datetime(_) | Value::Array(_) | Value::InlineTable(_) => Err(format!(
                "`{key} = {shown}`: --{key} takes {}; write it as a string or a number",
                value_name(arg)
            )),
        }
    };
    let values = match value {
        Value::Array(items) if matches!(arg.get_action(), ArgAction::Append) => {
            items.iter().map(scalar).collect::<Result<Vec<_>, _>>()?
        }
        Value::Array(_) => {
            return Err(format!(
                "`{key} = {shown}`: --{key} takes one value ({}), not a list",
                value_name(arg)
            ))
        }
        v => vec![scalar(v)?],
    };
    // The flag's own value parser, alone in a command of its own (the flag's rules about
    // other flags are for the full parse).
    let alone = Command::new("config").no_binary_name(true).arg(
        Arg::new("value")
            .long("value")
            .value_parser(arg.get_value_parser().clone())
            .action(ArgAction::Set),
    );
    for v in &values {
        let given = [OsString::from("--value"), OsString::from(v)];
        if let Err(e) = alone.clone().try_get_matches_from(given) {
            return Err(format!(
                "`{key} = {shown}`: {}; set it to what --{key} takes ({}): {}",
                reason(&e, v),
                value_name(arg),
                first_sentence(arg)
            ));
        }
    }
    Ok(Setting::Values(values))
}

/// What a value parser found wrong, without clap's framing.
fn reason(e: &clap::Error, value: &str) -> String {
    if let Some(ContextValue::Strings(valid)) = e.get(ContextKind::ValidValue) {
        return format!("{value:?} is not one of {}", valid.join(", "));
    }
    if let Some(source) = std::error::Error::source(e) {
        return source.to_string();
    }
    format!("{value:?} is an invalid value")
}

fn value_name(arg: &Arg) -> String {
    match arg.get_value_names() {
        Some([name, ..]) => name.to_string(),
        _ => arg.get_id().as_str().to_uppercase(),
    }
}

/// The first sentence of a flag's help.
fn first_sentence(arg: &Arg) -> String {
    let help = arg
        .get_long_help()
        .or(arg.get_help())
        .map(|h| h.to_string())
        .unwrap_or_default();
    let help = help.replace('\n', " ");
    // A sentence ends at a full stop before a capital ("e.g. http://..." goes on).
    let end = help
        .match_indices(". ")
        .find(|(i, _)| help[i + 2..].starts_with(|c: char| c.is_uppercase()))
        .map_or(help.len(), |(i, _)| i + 1);
    help[..end].to_string()
}

/// The key nearest `name` when it is near enough to be a slip (`data_dir`, `data-dri`).
fn closest<'a>(name: &str, keys: &[&'a str]) -> Option<&'a str> {
    let dashed = name.replace('_', "-");
    keys.iter()
        .map(|k| {
            (
                if *k == dashed {
                    0
                } else {
                    distance(&dashed, k)
                },
                *k,
            )
        })
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k)
}

/// Levenshtein distance.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests;
