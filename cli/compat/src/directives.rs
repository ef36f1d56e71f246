//! Finding and tokenizing `#SBATCH` / `#LATTICE` directives, and getopt-style
//! option parsing, following sbatch's own rules:
//!
//! * Only lines that *start* (column 0) with `#SBATCH` or `#LATTICE`
//!   (case-sensitive) are directives. `# SBATCH`, `  #SBATCH` and `#sbatch`
//!   are ordinary comments.
//! * Directives are read until the first line that is neither blank nor a
//!   comment (a line whose first non-blank character is `#`); the shebang is a
//!   comment. Directives after the first command are ignored (with a warning).
//! * A directive line is split on whitespace; single and double quotes group
//!   (and are removed), a backslash escapes the next character, an unquoted
//!   `#` starts a trailing comment. An unmatched quote is an error naming the line.
//! * There are no continuation lines: a trailing `\` is dropped and the next
//!   line is read on its own (sbatch's `_next_line` does not join lines).
//! * Options are parsed as sbatch's `getopt_long` does: `--opt=value`,
//!   `--opt value`, `-N 4`, `-N4`, clustered short flags (`-vH`), and unique
//!   prefixes of sbatch's long options (`--nod=4` is `--nodes=4`; an
//!   ambiguous prefix such as `--n` is an error listing the candidates).
//! * `#LATTICE` lines use `lattice submit`'s flag names (exact names only),
//!   with or without leading dashes (`#LATTICE nodes=64`, `network_domain=x`).
//! * `#SBATCH hetjob` / `packjob` separate heterogeneous components, which
//!   Lattice does not support: the rest of the header is ignored with a warning.
//! * Nothing in the header is dropped silently: burst-buffer directives (`#DW`, `#BB`,
//!   `#BB_LUA`) get one warning per line, other schedulers' directives that sbatch
//!   reads (`#PBS`, `#BSUB`) one warning per kind naming their lines (none with
//!   `--ignore-pbs`, which asks for them to be ignored).

use serde::Serialize;

use crate::error::{Source, SubmitError, Warning};

/// Whether an option takes an argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArgKind {
    /// A flag.
    None,
    /// Needs a value (`--opt=v` or `--opt v`).
    Required,
    /// Value only as `--opt=v`.
    Optional,
}

/// One option definition.
#[derive(Debug, Clone, Copy)]
pub struct OptDef {
    /// Long name without dashes.
    pub long: &'static str,
    /// Short letter, if any.
    pub short: Option<char>,
    /// Argument kind.
    pub arg: ArgKind,
}

const fn o(long: &'static str, short: Option<char>, arg: ArgKind) -> OptDef {
    OptDef { long, short, arg }
}

use ArgKind::{None as N, Optional as O, Required as R};

/// Every sbatch long option (Slurm 23.x/24.x), plus the `--uenv` / `--view`
/// extensions and pyxis's `--container-image`. Prefix abbreviations are resolved against this whole table, so
/// an abbreviation is accepted only when sbatch itself would accept it.
pub const SBATCH_OPTIONS: &[OptDef] = &[
    o("account", Some('A'), R),
    o("acctg-freq", None, R),
    o("array", Some('a'), R),
    o("batch", None, R),
    o("bb", None, R),
    o("bbf", None, R),
    o("begin", Some('b'), R),
    o("chdir", Some('D'), R),
    o("cluster-constraint", None, R),
    o("clusters", Some('M'), R),
    o("comment", None, R),
    o("constraint", Some('C'), R),
    o("container", None, R),
    o("container-id", None, R),
    o("container-image", None, R),
    o("contiguous", None, N),
    o("core-spec", Some('S'), R),
    o("cores-per-socket", None, R),
    o("cpu-freq", None, R),
    o("cpus-per-gpu", None, R),
    o("cpus-per-task", Some('c'), R),
    o("deadline", None, R),
    o("delay-boot", None, R),
    o("dependency", Some('d'), R),
    o("distribution", Some('m'), R),
    o("error", Some('e'), R),
    o("exclude", Some('x'), R),
    o("exclusive", None, O),
    o("export", None, R),
    o("export-file", None, R),
    o("extra", None, R),
    o("extra-node-info", Some('B'), R),
    o("get-user-env", None, O),
    o("gid", None, R),
    o("gpu-bind", None, R),
    o("gpu-freq", None, R),
    o("gpus", Some('G'), R),
    o("gpus-per-node", None, R),
    o("gpus-per-socket", None, R),
    o("gpus-per-task", None, R),
    o("gres", None, R),
    o("gres-flags", None, R),
    o("help", Some('h'), N),
    o("hint", None, R),
    o("hold", Some('H'), N),
    o("ignore-pbs", None, N),
    o("input", Some('i'), R),
    o("job-name", Some('J'), R),
    o("kill-on-invalid-dep", None, R),
    o("licenses", Some('L'), R),
    o("mail-type", None, R),
    o("mail-user", None, R),
    o("mcs-label", None, R),
    o("mem", None, R),
    o("mem-bind", None, R),
    o("mem-per-cpu", None, R),
    o("mem-per-gpu", None, R),
    o("mincpus", None, R),
    o("network", None, R),
    o("nice", None, O),
    o("no-kill", Some('k'), O),
    o("no-requeue", None, N),
    o("nodefile", Some('F'), R),
    o("nodelist", Some('w'), R),
    o("nodes", Some('N'), R),
    o("ntasks", Some('n'), R),
    o("ntasks-per-core", None, R),
    o("ntasks-per-gpu", None, R),
    o("ntasks-per-node", None, R),
    o("ntasks-per-socket", None, R),
    o("open-mode", None, R),
    o("output", Some('o'), R),
    o("overcommit", Some('O'), N),
    o("oversubscribe", Some('s'), N),
    o("parsable", None, N),
    o("partition", Some('p'), R),
    o("power", None, R),
    o("prefer", None, R),
    o("priority", None, R),
    o("profile", None, R),
    o("propagate", None, O),
    o("qos", Some('q'), R),
    o("quiet", Some('Q'), N),
    o("reboot", None, N),
    o("requeue", None, N),
    o("reservation", None, R),
    o("resv-ports", None, O),
    o("segment", None, R),
    o("signal", None, R),
    o("sockets-per-node", None, R),
    o("spread-job", None, N),
    o("switches", None, R),
    o("test-only", None, N),
    o("thread-spec", None, R),
    o("threads-per-core", None, R),
    o("time", Some('t'), R),
    o("time-min", None, R),
    o("tmp", None, R),
    o("tres-bind", None, R),
    o("tres-per-task", None, R),
    o("uenv", None, R),
    o("uid", None, R),
    o("usage", None, N),
    o("use-min-nodes", None, N),
    o("verbose", Some('v'), N),
    o("version", Some('V'), N),
    o("view", None, R),
    o("wait", Some('W'), N),
    o("wait-all-nodes", None, R),
    o("wckey", None, R),
    o("wrap", None, R),
];

/// `lattice submit` flags usable in `#LATTICE` directives (exact names).
pub const LATTICE_OPTIONS: &[OptDef] = &[
    o("nodes", Some('N'), R),
    o("nodelist", None, R),
    o("walltime", None, R),
    o("constraint", None, R),
    o("uenv", None, R),
    o("view", None, R),
    o("tools-uenv", None, R),
    o("image", None, R),
    o("vcluster", None, R),
    o("tenant", None, R),
    o("project", None, R),
    o("name", None, R),
    o("task-group", None, R),
    o("depends-on", None, R),
    o("dependency", None, R),
    o("data-mount", None, R),
    o("service", None, N),
    o("expose", None, R),
    o("reactive", None, N),
    o("min-nodes", None, R),
    o("max-nodes", None, R),
    o("scale-metric", None, R),
    o("scale-target", None, R),
    o("preemption-class", None, R),
    o("checkpoint", None, R),
    o("checkpoint-port", None, R),
    o("no-preempt", None, N),
    o("network-domain", None, R),
    o("sensitive", None, N),
    o("env", None, R),
    o("output", None, R),
    o("error", None, R),
];

/// Which option vocabulary a setting was written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Dialect {
    /// sbatch options.
    Slurm,
    /// lattice submit options.
    Lattice,
}

/// One option occurrence, resolved to its canonical long name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ParsedOption {
    /// Canonical long name, e.g. `nodes`.
    pub name: String,
    /// The value, if any.
    pub value: Option<String>,
    /// As written, e.g. `-N 4` or `--mem=64G`.
    pub written: String,
    /// Where.
    pub source: Source,
    /// Vocabulary.
    pub dialect: Dialect,
}

/// The directives of a script.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ScriptDirectives {
    /// Options in file order.
    pub options: Vec<ParsedOption>,
    /// Problems that do not stop the submission.
    pub warnings: Vec<Warning>,
    /// 1-based number of the first line after the directive header (the first command), if any.
    pub first_command_line: Option<usize>,
}

/// Split a script into lines: `(1-based line number, text)`, dropping a
/// trailing `\r`. Like sbatch, a trailing backslash does not continue a line.
fn logical_lines(script: &str) -> Vec<(usize, String)> {
    script
        .split('\n')
        .enumerate()
        .map(|(i, raw)| (i + 1, raw.strip_suffix('\r').unwrap_or(raw).to_string()))
        .collect()
}

/// Tokenize the argument part of a directive line (sbatch's `_get_argument`).
pub fn tokenize_directive(rest: &str, source: &Source) -> Result<Vec<String>, SubmitError> {
    let mut tokens = Vec::new();
    let mut chars = rest.chars();
    let mut cur = String::new();
    let mut in_token = false;
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        if let Some(q) = quote {
            if c == q {
                quote = None;
            } else if c == '\\' {
                // sbatch: a backslash escapes the next character, in quotes too.
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
            } else {
                cur.push(c);
            }
            continue;
        }
        match c {
            '\\' => {
                // An escaped character; a lone trailing backslash is dropped.
                if let Some(n) = chars.next() {
                    in_token = true;
                    cur.push(n);
                }
            }
            '"' | '\'' => {
                in_token = true;
                quote = Some(c);
            }
            '#' => break,
            c if c.is_whitespace() => {
                if in_token {
                    tokens.push(std::mem::take(&mut cur));
                    in_token = false;
                }
            }
            c => {
                in_token = true;
                cur.push(c);
            }
        }
    }
    if let Some(q) = quote {
        return Err(SubmitError::Syntax {
            source_: source.clone(),
            message: format!(
                "unmatched `{q}` in directive {}{}",
                source.prefix(),
                rest.trim()
            ),
            hint: format!("close the quote with a matching {q}, or escape it with a backslash"),
        });
    }
    if in_token {
        tokens.push(cur);
    }
    Ok(tokens)
}

/// Read the directive header of a script.
pub fn scan_script(script: &str) -> Result<ScriptDirectives, SubmitError> {
    let mut out = ScriptDirectives::default();
    if script.contains("\r\n") {
        out.warnings.push(Warning::note(
            &Source::CommandLine,
            "",
            "the script has DOS line breaks (\\r\\n); they were removed (sbatch rejects such scripts; run dos2unix)",
        ));
    }
    let lines = logical_lines(script);
    let mut in_header = true;
    let mut late: Vec<usize> = Vec::new();
    let mut foreign: Vec<(&str, Vec<usize>)> = Vec::new();
    let mut het = false;
    for (n, line) in &lines {
        let (magic, rest) = if let Some(r) = line.strip_prefix("#SBATCH") {
            (Some(Dialect::Slurm), r)
        } else if let Some(r) = line.strip_prefix("#LATTICE") {
            (Some(Dialect::Lattice), r)
        } else {
            (None, line.as_str())
        };
        if !in_header {
            if magic.is_some() || is_burst_buffer(line) {
                late.push(*n);
            }
            continue;
        }
        let Some(dialect) = magic else {
            let t = line.trim_start();
            if t.is_empty() || t.starts_with('#') {
                if is_burst_buffer(line) {
                    out.warnings.push(Warning::ignored(
                        &Source::Script { line: *n },
                        line.trim_end(),
                        BURST_BUFFER_REASON,
                    ));
                } else if let Some(p) = IGNORE_PBS_PREFIXES.iter().find(|p| line.starts_with(**p)) {
                    match foreign.iter_mut().find(|(q, _)| q == p) {
                        Some((_, v)) => v.push(*n),
                        None => foreign.push((p, vec![*n])),
                    }
                }
                continue;
            }
            in_header = false;
            out.first_command_line = Some(*n);
            continue;
        };
        if het {
            continue;
        }
        let source = match dialect {
            Dialect::Slurm => Source::Sbatch { line: *n },
            Dialect::Lattice => Source::Lattice { line: *n },
        };
        let tokens = tokenize_directive(rest, &source)?;
        if dialect == Dialect::Slurm
            && tokens.first().is_some_and(|t| {
                t.eq_ignore_ascii_case("hetjob") || t.eq_ignore_ascii_case("packjob")
            })
        {
            het = true;
            out.warnings.push(Warning::note(&source, "", "heterogeneous jobs (#SBATCH hetjob) are not supported; directives after this line were ignored (submit separate allocations with --depends-on instead)"));
            continue;
        }
        let (opts, warns) = parse_args(&tokens, dialect, &source)?;
        out.options.extend(opts);
        out.warnings.extend(warns);
    }
    for (prefix, at) in foreign {
        let l: Vec<String> = at.iter().map(|n| n.to_string()).collect();
        out.warnings.push(Warning {
            source: Source::Script { line: at[0] },
            option: prefix.to_string(),
            message: format!(
                "{prefix} directives on line(s) {} are not supported and were ignored; use #SBATCH or #LATTICE",
                l.join(", ")
            ),
        });
    }
    if !late.is_empty() {
        let l: Vec<String> = late.iter().map(|n| n.to_string()).collect();
        let first = out.first_command_line.unwrap_or(0);
        out.warnings.push(Warning::note(
            &Source::Sbatch { line: late[0] },
            "",
            format!(
                "directives on line(s) {} come after the first command (line {first}) and were ignored, as sbatch does; move them above it",
                l.join(", ")
            ),
        ));
    }
    Ok(out)
}

/// Other schedulers' directives that sbatch reads unless `--ignore-pbs` is given;
/// Lattice never reads them (one warning per kind names their lines).
pub const IGNORE_PBS_PREFIXES: &[&str] = &["#PBS", "#BSUB"];

/// Why burst-buffer directives (`#DW`, `#BB`, `#BB_LUA`) are ignored.
pub const BURST_BUFFER_REASON: &str =
    "burst buffers are not supported; use --data-mount to pre-stage data to the hot tier";

/// A burst-buffer directive line: Cray DataWarp's `#DW` or Slurm's `#BB` / `#BB_LUA`,
/// followed by its arguments.
fn is_burst_buffer(line: &str) -> bool {
    ["#DW", "#BB_LUA", "#BB"].iter().any(|p| {
        line.strip_prefix(p)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(char::is_whitespace))
    })
}

/// Resolve a long option name: exact match, else (Slurm only) a unique prefix.
fn resolve_long(
    name: &str,
    dialect: Dialect,
    source: &Source,
) -> Result<Option<&'static OptDef>, SubmitError> {
    let table = match dialect {
        Dialect::Slurm => SBATCH_OPTIONS,
        Dialect::Lattice => LATTICE_OPTIONS,
    };
    if let Some(d) = table.iter().find(|d| d.long == name) {
        return Ok(Some(d));
    }
    if dialect == Dialect::Lattice || name.is_empty() {
        return Ok(None);
    }
    let cands: Vec<&OptDef> = table.iter().filter(|d| d.long.starts_with(name)).collect();
    match cands.len() {
        0 => Ok(None),
        1 => Ok(Some(cands[0])),
        _ => Err(SubmitError::Syntax {
            source_: source.clone(),
            message: format!(
                "option '--{name}' is ambiguous; possibilities: {}",
                cands
                    .iter()
                    .map(|d| format!("--{}", d.long))
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            hint: "write the option name in full".into(),
        }),
    }
}

/// Parse option tokens getopt_long-style. Unknown options and stray
/// arguments become warnings; ambiguous prefixes and missing arguments are errors.
pub fn parse_args(
    tokens: &[String],
    dialect: Dialect,
    source: &Source,
) -> Result<(Vec<ParsedOption>, Vec<Warning>), SubmitError> {
    let table = match dialect {
        Dialect::Slurm => SBATCH_OPTIONS,
        Dialect::Lattice => LATTICE_OPTIONS,
    };
    let mut opts = Vec::new();
    let mut warns = Vec::new();
    let mut i = 0;
    let mut only_positional = false;
    let missing = |name: &str| SubmitError::Syntax {
        source_: source.clone(),
        message: format!("option '--{name}' requires an argument"),
        hint: format!("write --{name}=VALUE"),
    };
    while i < tokens.len() {
        let tok = tokens[i].as_str();
        i += 1;
        // `#LATTICE nodes=64`: a bare key=value or flag name.
        let lattice_bare;
        let tok = if dialect == Dialect::Lattice && !tok.starts_with('-') && !only_positional {
            lattice_bare = format!("--{}", tok);
            lattice_bare.as_str()
        } else {
            tok
        };
        if only_positional || !tok.starts_with('-') || tok == "-" {
            warns.push(Warning::ignored(
                source,
                tok,
                "not an option; directives only take options",
            ));
            continue;
        }
        if tok == "--" {
            only_positional = true;
            continue;
        }
        if let Some(body) = tok.strip_prefix("--") {
            let (name, val) = match body.split_once('=') {
                Some((n, v)) => (n, Some(v.to_string())),
                None => (body, None),
            };
            let name_norm = if dialect == Dialect::Lattice {
                name.replace('_', "-")
            } else {
                name.to_string()
            };
            let Some(def) = resolve_long(&name_norm, dialect, source)? else {
                warns.push(Warning::ignored(source, tok, "unknown option"));
                continue;
            };
            let mut written = tok.to_string();
            let value = match (def.arg, val) {
                (ArgKind::None, Some(_)) => {
                    warns.push(Warning::note(
                        source,
                        tok,
                        format!("--{} takes no value; the value was ignored", def.long),
                    ));
                    None
                }
                (ArgKind::None, None) => None,
                (ArgKind::Optional, v) => v,
                (ArgKind::Required, Some(v)) => Some(v),
                (ArgKind::Required, None) => {
                    let v = tokens.get(i).ok_or_else(|| missing(def.long))?.clone();
                    i += 1;
                    written = format!("{tok} {v}");
                    Some(v)
                }
            };
            opts.push(ParsedOption {
                name: def.long.to_string(),
                value,
                written,
                source: source.clone(),
                dialect,
            });
            continue;
        }
        // Short options, possibly clustered.
        let body: Vec<char> = tok[1..].chars().collect();
        let mut j = 0;
        while j < body.len() {
            let c = body[j];
            j += 1;
            let Some(def) = table.iter().find(|d| d.short == Some(c)) else {
                warns.push(Warning::ignored(source, &format!("-{c}"), "unknown option"));
                continue;
            };
            match def.arg {
                ArgKind::None | ArgKind::Optional => {
                    opts.push(ParsedOption {
                        name: def.long.to_string(),
                        value: None,
                        written: format!("-{c}"),
                        source: source.clone(),
                        dialect,
                    });
                }
                ArgKind::Required => {
                    let rest: String = body[j..].iter().collect();
                    let (value, written) = if rest.is_empty() {
                        let v = tokens.get(i).ok_or_else(|| missing(def.long))?.clone();
                        i += 1;
                        (v.clone(), format!("-{c} {v}"))
                    } else if let Some(v) = rest.strip_prefix('=') {
                        warns.push(Warning::note(source, &format!("-{c}{rest}"), format!("sbatch reads this as the value \"{rest}\"; using \"{v}\" (write -{c} {v} or --{}={v})", def.long)));
                        (v.to_string(), format!("-{c}{rest}"))
                    } else {
                        (rest.clone(), format!("-{c}{rest}"))
                    };
                    opts.push(ParsedOption {
                        name: def.long.to_string(),
                        value: Some(value),
                        written,
                        source: source.clone(),
                        dialect,
                    });
                    j = body.len();
                }
            }
        }
    }
    Ok((opts, warns))
}
