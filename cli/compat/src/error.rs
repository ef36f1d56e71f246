//! Errors and warnings, each naming what was wrong, where, and what to do.

use std::fmt;

use serde::Serialize;

/// Where a setting came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Source {
    /// A `#SBATCH` directive on this (1-based) script line.
    Sbatch {
        /// 1-based line number in the script.
        line: usize,
    },
    /// A `#LATTICE` directive on this (1-based) script line.
    Lattice {
        /// 1-based line number in the script.
        line: usize,
    },
    /// Another line of the script's directive header, e.g. a `#DW` burst-buffer or a
    /// `#PBS` directive.
    Script {
        /// 1-based line number in the script.
        line: usize,
    },
    /// A `lattice submit` / `sbatch` command-line flag.
    CommandLine,
    /// The site mapping file `lattice-compat.yaml`.
    Config,
}

impl Source {
    /// The script line, if the setting came from a directive.
    pub fn line(&self) -> Option<usize> {
        match self {
            Source::Sbatch { line } | Source::Lattice { line } | Source::Script { line } => {
                Some(*line)
            }
            _ => None,
        }
    }

    /// `#SBATCH `, `#LATTICE ` or empty: the prefix used when quoting an option.
    pub fn prefix(&self) -> &'static str {
        match self {
            Source::Sbatch { .. } => "#SBATCH ",
            Source::Lattice { .. } => "#LATTICE ",
            _ => "",
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Sbatch { line } => write!(f, "line {line} (#SBATCH)"),
            Source::Lattice { line } => write!(f, "line {line} (#LATTICE)"),
            Source::Script { line } => write!(f, "line {line}"),
            Source::CommandLine => f.write_str("command line"),
            Source::Config => f.write_str("lattice-compat.yaml"),
        }
    }
}

/// A non-fatal problem: the submission goes ahead.
///
/// `Display` gives the seed's wording, e.g.
/// `#SBATCH --mem=64G ignored (Lattice uses full-node scheduling, memory is not constrainable)`;
/// callers print it after `Warning: `.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Warning {
    /// Where the offending option was written.
    pub source: Source,
    /// The option as written, e.g. `--mem=64G` (empty for warnings not tied to one option).
    pub option: String,
    /// The full message (without a `Warning: ` prefix).
    pub message: String,
}

impl Warning {
    /// A warning for an option that is ignored, in the seed's wording.
    pub fn ignored(source: &Source, option: &str, reason: &str) -> Self {
        Warning {
            source: source.clone(),
            option: option.to_string(),
            message: format!("{}{option} ignored ({reason})", source.prefix()),
        }
    }

    /// Any other warning about an option.
    pub fn note(source: &Source, option: &str, message: impl Into<String>) -> Self {
        let message = message.into();
        Warning {
            source: source.clone(),
            option: option.to_string(),
            message: if option.is_empty() {
                message
            } else {
                format!("{}{option}: {message}", source.prefix())
            },
        }
    }

    /// The message with the script line, e.g. `line 4: #SBATCH --mem=64G ignored (...)`.
    pub fn with_location(&self) -> String {
        match self.source.line() {
            Some(l) => format!("line {l}: {}", self.message),
            None => self.message.clone(),
        }
    }
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Why a submission cannot be translated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// An option value does not parse.
    #[error("invalid {option} value {value:?} at {source_}: {message}\n  Hint: {hint}")]
    InvalidValue {
        /// The option, e.g. `--time`.
        option: String,
        /// The value as written.
        value: String,
        /// Where it was written.
        source_: Source,
        /// What is wrong.
        message: String,
        /// What to write instead.
        hint: String,
    },
    /// A directive line cannot be tokenized (e.g. an unmatched quote) or an
    /// option is ambiguous / lacks its argument.
    #[error("{source_}: {message}\n  Hint: {hint}")]
    Syntax {
        /// Where.
        source_: Source,
        /// What is wrong.
        message: String,
        /// What to do.
        hint: String,
    },
    /// `--partition` / `--vcluster` names no known vCluster.
    #[error("vCluster \"{name}\" not found. Available: {}\n  Where: {source_}\n  Hint: use one of the available vClusters, or ask your site admin to map partition \"{name}\" in lattice-compat.yaml", if .available.is_empty() { "(none configured)".to_string() } else { .available.join(", ") })]
    UnknownVCluster {
        /// The partition or vCluster as written.
        name: String,
        /// What the site offers.
        available: Vec<String>,
        /// Where it was written.
        source_: Source,
    },
    /// Two settings contradict each other and no rule resolves them.
    #[error("conflicting options: {message}\n  Hint: {hint}")]
    Conflict {
        /// What conflicts.
        message: String,
        /// What to do.
        hint: String,
    },
    /// Nothing to run (no script and no command).
    #[error("nothing to run: {message}\n  Hint: pass a batch script, or a command after `--` (lattice submit --nodes=1 -- hostname)")]
    NothingToRun {
        /// Detail.
        message: String,
    },
    /// The site mapping file is invalid.
    #[error("lattice-compat.yaml: {message}\n  Hint: {hint}")]
    Config {
        /// What is wrong.
        message: String,
        /// What to do.
        hint: String,
    },
}

impl SubmitError {
    /// The script line the error refers to, if any.
    pub fn line(&self) -> Option<usize> {
        match self {
            SubmitError::InvalidValue { source_, .. }
            | SubmitError::Syntax { source_, .. }
            | SubmitError::UnknownVCluster { source_, .. } => source_.line(),
            _ => None,
        }
    }

    pub(crate) fn invalid(
        option: &str,
        value: &str,
        source: &Source,
        e: ValueError,
    ) -> SubmitError {
        SubmitError::InvalidValue {
            option: option.to_string(),
            value: value.to_string(),
            source_: source.clone(),
            message: e.message,
            hint: e.hint,
        }
    }
}

/// A value-parser error without location; [`SubmitError::InvalidValue`] adds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueError {
    /// What is wrong.
    pub message: String,
    /// What to write instead.
    pub hint: String,
}

impl ValueError {
    pub(crate) fn new(message: impl Into<String>, hint: impl Into<String>) -> Self {
        ValueError {
            message: message.into(),
            hint: hint.into(),
        }
    }
}

impl fmt::Display for ValueError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (hint: {})", self.message, self.hint)
    }
}

impl std::error::Error for ValueError {}
