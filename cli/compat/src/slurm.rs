//! Slurm front-end helpers (pure): `sbatch`/`squeue`/`scancel`/`sinfo`/`sacct`
//! argument translation into `lattice` invocations and `squeue -o` formatting of
//! Allocation JSON. (The `SLURM_*` variables inside workloads are set by the node agent,
//! `lattice-agent`'s `env` module, when the allocation carries
//! [`crate::translate::annotations::SET_SLURM_ENV`] or the agent runs with `--slurm-env`.)

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use crate::directives::{parse_args, Dialect, ParsedOption, SBATCH_OPTIONS};
use crate::error::{Source, SubmitError};
use crate::hostlist;
use crate::translate::annotations;
use crate::values::{parse_slurm_dependency, parse_walltime, Walltime};

/// A translated Slurm command line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Invocation {
    /// `lattice` arguments (without the program name), e.g. `["status", "--user=alice"]`.
    pub argv: Vec<String>,
    /// Options that could not be translated, one message each.
    pub warnings: Vec<String>,
    /// `-o/--format` string to render the result with [`format_squeue`] (squeue/sacct).
    pub format: Option<String>,
    /// `-h/--noheader`.
    pub noheader: bool,
    /// `sbatch --parsable`: print only the id.
    pub parsable: bool,
    /// `sbatch --wait`.
    pub wait: bool,
    /// `scancel -u USER`: only this user's jobs. The argv says `--all-mine`; the caller must
    /// check that USER is the current user (Lattice cancels by user only for yourself).
    pub user: Option<String>,
    /// `scancel --me`: only the current user's jobs (Slurm's `-u $USER`). Without job ids
    /// the argv says `--all-mine`; with ids the caller must drop the ids that are not the
    /// current user's (Slurm ANDs filters with job ids).
    pub me: bool,
    /// `scancel -n NAME`: only jobs with this job name (`spec.tags.name`, else the id).
    /// `lattice cancel` has no such filter: the caller applies it.
    pub name: Option<String>,
    /// `sacct -j IDS -S TIME`: the named jobs, only when they were active at or after
    /// TIME (`lattice status` has no time window: the caller applies it).
    pub since: Option<String>,
    /// `sacct -j IDS -E TIME`: the named jobs, only when they were active before TIME.
    pub until: Option<String>,
}

/// A translated `sbatch` command line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SbatchInvocation {
    /// sbatch options as given; pass them to
    /// [`SubmitFlags::sbatch_args`](crate::SubmitFlags::sbatch_args) so that
    /// they override the script's directives with sbatch semantics.
    pub sbatch_args: Vec<String>,
    /// The script path (None with `--wrap` or when the script comes from stdin).
    pub script: Option<String>,
    /// Arguments after the script (Lattice does not pass them; warned).
    pub script_args: Vec<String>,
    /// `--wrap=CMD`: run `/bin/sh -c CMD`.
    pub wrap: Option<String>,
    /// Equivalent `lattice` arguments (best effort, for display and aliases).
    pub invocation: Invocation,
}

fn long_of(o: &ParsedOption) -> String {
    match &o.value {
        Some(v) => format!("--{}={v}", o.name),
        None => format!("--{}", o.name),
    }
}

/// Translate `sbatch [OPTIONS] [SCRIPT [ARGS...]]`. Like sbatch, options stop
/// at the first non-option argument (the script).
pub fn sbatch_to_lattice(args: &[String]) -> Result<SbatchInvocation, SubmitError> {
    let mut i = 0;
    // Find where options end: walk tokens the same way getopt would.
    while i < args.len() {
        let a = &args[i];
        if a == "--" {
            break;
        }
        if !a.starts_with('-') || a == "-" {
            break;
        }
        // Does this option consume the next token?
        let needs_next = if let Some(body) = a.strip_prefix("--") {
            !body.contains('=')
                && SBATCH_OPTIONS
                    .iter()
                    .filter(|d| d.long.starts_with(body))
                    .find(|d| d.long == body)
                    .or_else(|| {
                        let c: Vec<_> = SBATCH_OPTIONS
                            .iter()
                            .filter(|d| d.long.starts_with(body))
                            .collect();
                        if c.len() == 1 {
                            Some(c[0])
                        } else {
                            None
                        }
                    })
                    .is_some_and(|d| d.arg == crate::directives::ArgKind::Required)
        } else {
            // last short option of a cluster needs a value when nothing follows it
            let chars: Vec<char> = a[1..].chars().collect();
            let mut need = false;
            for (k, c) in chars.iter().enumerate() {
                if let Some(d) = SBATCH_OPTIONS.iter().find(|d| d.short == Some(*c)) {
                    if d.arg == crate::directives::ArgKind::Required {
                        need = k == chars.len() - 1;
                        break;
                    }
                }
            }
            need
        };
        i += if needs_next { 2 } else { 1 };
    }
    let i = i.min(args.len());
    let opts_tokens: Vec<String> = args[..i].to_vec();
    let mut rest: Vec<String> = args[i..].to_vec();
    if rest.first().is_some_and(|a| a == "--") {
        rest.remove(0);
    }
    let (opts, warns) = parse_args(&opts_tokens, Dialect::Slurm, &Source::CommandLine)?;
    let mut inv = SbatchInvocation {
        sbatch_args: opts_tokens,
        ..Default::default()
    };
    inv.invocation
        .warnings
        .extend(warns.iter().map(|w| w.message.clone()));
    let mut argv = vec!["submit".to_string()];
    for o in &opts {
        let v = o.value.clone().unwrap_or_default();
        match o.name.as_str() {
            "nodes" | "nodelist" | "constraint" | "uenv" | "view" | "output" | "error" => {
                argv.push(long_of(o))
            }
            "time" => match parse_walltime(&v) {
                Ok(Walltime::Seconds(_)) => argv.push(format!("--walltime={v}")),
                _ => inv
                    .invocation
                    .warnings
                    .push(format!("--time={v}: no walltime passed")),
            },
            "partition" => argv.push(format!("--vcluster={v}")),
            "account" => argv.push(format!("--tenant={v}")),
            "job-name" => argv.push(format!("--name={v}")),
            "array" => argv.push(format!("--task-group={v}")),
            "dependency" => match parse_slurm_dependency(&v) {
                // `lattice submit --dependency` takes the Slurm (and Flux) forms as written.
                Ok(_) => argv.push(format!("--dependency={}", v.trim())),
                Err(e) => {
                    return Err(SubmitError::invalid(
                        "--dependency",
                        &v,
                        &Source::CommandLine,
                        e,
                    ))
                }
            },
            "gres" | "gpus-per-node" => argv.push(format!(
                "--constraint=gpu_count={}",
                v.rsplit(':').next().unwrap_or("1")
            )),
            "parsable" => inv.invocation.parsable = true,
            "wait" => inv.invocation.wait = true,
            "test-only" => argv.push("--dry-run".into()),
            "wrap" => inv.wrap = Some(v),
            "exclusive" | "verbose" | "quiet" | "ignore-pbs" => {}
            other => inv.invocation.warnings.push(format!(
                "--{other} has no `lattice submit` flag; it is applied through the sbatch options"
            )),
        }
    }
    if let Some(w) = &inv.wrap {
        argv.extend(["--".to_string(), "/bin/sh".into(), "-c".into(), w.clone()]);
        if !rest.is_empty() {
            inv.invocation
                .warnings
                .push("arguments after --wrap were ignored".into());
        }
    } else if let Some((s, a)) = rest.split_first() {
        inv.script = Some(s.clone());
        inv.script_args = a.to_vec();
        argv.push(s.clone());
        if !a.is_empty() {
            inv.invocation.warnings.push(format!(
                "script arguments {:?} are not passed by Lattice; put them in the script",
                a.join(" ")
            ));
        }
    }
    inv.invocation.argv = argv;
    Ok(inv)
}

/// Map a Slurm job state name or code (`PD`, `PENDING`, `R`, ...) to a
/// Lattice phase name (lowercase), if there is one.
pub fn slurm_state_to_phase(s: &str) -> Option<&'static str> {
    Some(match s.to_ascii_uppercase().as_str() {
        "PD" | "PENDING" => "pending",
        "CF" | "CONFIGURING" => "staging",
        "R" | "RUNNING" => "running",
        "S" | "SUSPENDED" | "PR" | "PREEMPTED" => "suspended",
        "CG" | "COMPLETING" => "checkpointing",
        "CD" | "COMPLETED" => "completed",
        "F" | "FAILED" | "TO" | "TIMEOUT" | "NF" | "NODE_FAIL" | "OOM" | "OUT_OF_MEMORY" | "BF"
        | "BOOT_FAIL" | "DL" | "DEADLINE" => "failed",
        "CA" | "CANCELLED" => "cancelled",
        _ => return None,
    })
}

/// Lattice phase → Slurm (long name, short code).
pub fn phase_to_slurm(phase: &str) -> (&'static str, &'static str) {
    match phase {
        "Pending" => ("PENDING", "PD"),
        "Staging" => ("CONFIGURING", "CF"),
        "Running" => ("RUNNING", "R"),
        "Checkpointing" => ("COMPLETING", "CG"),
        "Suspended" => ("SUSPENDED", "S"),
        "Completed" => ("COMPLETED", "CD"),
        "Failed" => ("FAILED", "F"),
        "Cancelled" => ("CANCELLED", "CA"),
        _ => ("PENDING", "PD"),
    }
}

struct Cursor<'a> {
    args: &'a [String],
    i: usize,
}

impl<'a> Cursor<'a> {
    /// Next option and its value for options that take one (`-u x`, `-ux`, `--user=x`, `--user x`).
    fn value(&mut self, tok: &str, short: &str, long: &str) -> Option<Option<String>> {
        if tok == short || tok == long {
            let v = self.args.get(self.i).cloned();
            self.i += 1;
            return Some(v);
        }
        if let Some(v) = tok.strip_prefix(&format!("{long}=")) {
            return Some(Some(v.to_string()));
        }
        if short.len() == 2 && tok.len() > 2 && tok.starts_with(short) && !tok.starts_with("--") {
            return Some(Some(tok[2..].to_string()));
        }
        None
    }
}

fn need(v: Option<String>, opt: &str) -> Result<String, SubmitError> {
    v.ok_or_else(|| SubmitError::Syntax {
        source_: Source::CommandLine,
        message: format!("option {opt} requires an argument"),
        hint: format!("write {opt} VALUE"),
    })
}

fn states_arg(v: &str, inv: &mut Invocation) -> Option<String> {
    let mut out = Vec::new();
    for s in v.split(',') {
        if s.eq_ignore_ascii_case("all") {
            return None;
        }
        match slurm_state_to_phase(s.trim()) {
            Some(p) if !out.contains(&p) => out.push(p),
            Some(_) => {}
            None => inv.warnings.push(format!(
                "job state {s:?} has no Lattice equivalent; ignored"
            )),
        }
    }
    if out.is_empty() {
        None
    } else {
        Some(format!("--state={}", out.join(",")))
    }
}

fn job_ids(v: &str, inv: &mut Invocation) -> Vec<String> {
    v.split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| {
            let s = s.trim();
            match s.split_once('_') {
                Some((p, t)) => {
                    inv.warnings.push(format!("{s}: single array tasks cannot be addressed; using task group {p} (task {t})"));
                    p.to_string()
                }
                None => s.to_string(),
            }
        })
        .collect()
}

/// Translate `squeue` (`-u/--user`, `--me`, `-j/--jobs`, `-t/--states`,
/// `-p/--partition`, `-A/--account`, `-h/--noheader`, `-o/--format`,
/// `-a`, `-l`) into `lattice status ... -o json` plus the format to print with.
pub fn squeue_to_lattice(args: &[String]) -> Result<Invocation, SubmitError> {
    let mut inv = Invocation {
        argv: vec!["status".into()],
        ..Default::default()
    };
    let mut c = Cursor { args, i: 0 };
    let mut ids = Vec::new();
    while c.i < args.len() {
        let tok = args[c.i].clone();
        c.i += 1;
        if tok == "-h" || tok == "--noheader" {
            inv.noheader = true;
        } else if tok == "--me"
            || tok == "-a"
            || tok == "--all"
            || tok == "-l"
            || tok == "--long"
            || tok == "-r"
            || tok == "--array"
        {
        } else if let Some(v) = c.value(&tok, "-u", "--user") {
            let v = need(v, "--user")?;
            inv.argv.push(format!("--user={v}"));
        } else if let Some(v) = c.value(&tok, "-j", "--jobs") {
            ids.extend(job_ids(&need(v, "--jobs")?, &mut inv));
        } else if let Some(v) = c.value(&tok, "-t", "--states") {
            if let Some(s) = states_arg(&need(v, "--states")?, &mut inv) {
                inv.argv.push(s);
            }
        } else if let Some(v) = c.value(&tok, "-p", "--partition") {
            inv.argv
                .push(format!("--vcluster={}", need(v, "--partition")?));
        } else if let Some(v) = c.value(&tok, "-A", "--account") {
            inv.argv.push(format!("--tenant={}", need(v, "--account")?));
        } else if let Some(v) = c.value(&tok, "-o", "--format") {
            inv.format = Some(need(v, "--format")?);
        } else if let Some(v) = c.value(&tok, "-n", "--name") {
            inv.warnings.push(format!(
                "--name={} filtering is not supported; showing all",
                v.unwrap_or_default()
            ));
        } else {
            inv.warnings
                .push(format!("squeue option {tok} is not supported; ignored"));
        }
    }
    if ids.iter().any(|_| true) {
        let mut a = vec!["status".to_string()];
        a.extend(ids);
        a.extend(inv.argv.drain(1..));
        inv.argv = a;
    }
    if !inv
        .argv
        .iter()
        .any(|a| a.starts_with("--user=") || a.starts_with("--tenant="))
        && args.iter().all(|a| a != "--me")
    {
        // squeue shows everyone's jobs; `lattice status` shows your own unless --all.
        inv.argv.push("--all".into());
    }
    inv.argv.extend(["-o".into(), "json".into()]);
    Ok(inv)
}

/// Translate `scancel ID... | -u USER [-t STATE] | -n NAME`.
///
/// `-u USER` becomes `--all-mine` with [`Invocation::user`] set (the caller refuses another
/// user's name); `--me` sets [`Invocation::me`] (the same, for the current user);
/// `-n NAME` sets [`Invocation::name`] (the caller filters by job name). With job ids the
/// filters narrow the named jobs (Slurm ANDs them).
/// Filters Lattice cannot apply (`-p`, `-q`, `-A`, `-w`, ...) and `--signal` are errors,
/// never ignored: dropping a filter would cancel more jobs than asked for.
pub fn scancel_to_lattice(args: &[String]) -> Result<Invocation, SubmitError> {
    let mut inv = Invocation {
        argv: vec!["cancel".into()],
        ..Default::default()
    };
    let mut c = Cursor { args, i: 0 };
    let mut ids = Vec::new();
    let mut state = None;
    let refuse = |message: String, hint: &str| SubmitError::Syntax {
        source_: Source::CommandLine,
        message,
        hint: hint.to_string(),
    };
    while c.i < args.len() {
        let tok = args[c.i].clone();
        c.i += 1;
        if tok.is_empty() {
            continue;
        }
        if let Some(v) = c.value(&tok, "-u", "--user") {
            let u = need(v, "--user")?;
            if u.trim().is_empty() || u.contains(',') {
                return Err(refuse(
                    format!("--user={u}: give exactly one user name"),
                    "scancel -u $USER",
                ));
            }
            inv.user = Some(u.trim().to_string());
        } else if tok == "--me" {
            inv.me = true;
        } else if let Some(v) = c
            .value(&tok, "-n", "--name")
            .or_else(|| c.value(&tok, "-n", "--jobname"))
        {
            let n = need(v, "--name")?;
            if n.trim().is_empty() {
                return Err(refuse("--name needs a job name".into(), "scancel -n NAME"));
            }
            inv.name = Some(n.trim().to_string());
        } else if let Some(v) = c.value(&tok, "-t", "--state") {
            state = states_arg(&need(v, "--state")?, &mut inv);
        } else if matches!(
            tok.as_str(),
            "-Q" | "--quiet"
                | "-v"
                | "--verbose"
                | "-f"
                | "--full"
                | "-b"
                | "--batch"
                | "-H"
                | "--hurry"
        ) {
        } else if let Some(v) = c.value(&tok, "-s", "--signal") {
            return Err(refuse(
                format!(
                    "--signal={} is not supported: Lattice cannot send a signal without cancelling",
                    v.unwrap_or_default()
                ),
                "drop --signal to cancel the job; for a checkpoint before preemption submit with --checkpoint=signal",
            ));
        } else if let Some((opt, v)) = [
            ("-A", "--account"),
            ("-p", "--partition"),
            ("-q", "--qos"),
            ("-w", "--nodelist"),
            ("-R", "--reservation"),
            ("-M", "--clusters"),
            ("", "--wckey"),
        ]
        .iter()
        .find_map(|(s, l)| c.value(&tok, s, l).map(|v| (*l, v)))
        {
            return Err(refuse(
                format!(
                    "{opt}={} is not supported as a filter; nothing was cancelled",
                    v.unwrap_or_default()
                ),
                "name the jobs instead: scancel $(squeue -h -o %i ...) or scancel JOBID...",
            ));
        } else if tok == "-i" || tok == "--interactive" {
            return Err(refuse(
                format!("{tok} (confirm each job) is not supported; nothing was cancelled"),
                "list the jobs with squeue and name the ones to cancel: scancel JOBID...",
            ));
        } else if tok.starts_with('-') && tok != "-" {
            return Err(refuse(
                format!("unknown scancel option {tok}; nothing was cancelled"),
                "scancel JOBID... | -u $USER [-t STATE] | -n NAME",
            ));
        } else {
            ids.extend(job_ids(&tok, &mut inv));
        }
    }
    inv.argv.extend(ids.iter().cloned());
    if ids.is_empty() {
        if !inv.me && inv.user.is_none() && inv.name.is_none() && state.is_none() {
            return Err(SubmitError::Syntax {
                source_: Source::CommandLine,
                message: "no job id given".into(),
                hint: "scancel JOBID [JOBID...], scancel -u $USER or scancel -n NAME".into(),
            });
        }
        inv.argv.push("--all-mine".into());
    }
    if let Some(s) = state {
        inv.argv.push(s);
    }
    Ok(inv)
}

/// Translate `sinfo [-N] [-p PART] [-t STATES] [-n NODES] [-h] [-o FMT]`.
pub fn sinfo_to_lattice(args: &[String]) -> Result<Invocation, SubmitError> {
    let mut inv = Invocation {
        argv: vec!["nodes".into()],
        ..Default::default()
    };
    let mut c = Cursor { args, i: 0 };
    let mut nodes = Vec::new();
    let mut extra = Vec::new();
    while c.i < args.len() {
        let tok = args[c.i].clone();
        c.i += 1;
        if tok == "-N"
            || tok == "--Node"
            || tok == "-l"
            || tok == "--long"
            || tok == "-a"
            || tok == "--all"
            || tok == "-s"
            || tok == "--summarize"
        {
            if tok == "-l" || tok == "--long" {
                extra.extend(["-o".to_string(), "wide".to_string()]);
            }
        } else if tok == "-h" || tok == "--noheader" {
            inv.noheader = true;
        } else if let Some(v) = c.value(&tok, "-p", "--partition") {
            extra.push(format!("--vcluster={}", need(v, "--partition")?));
        } else if let Some(v) = c.value(&tok, "-t", "--states") {
            let v = need(v, "--states")?;
            let mut st = Vec::new();
            for s in v.split(',') {
                let m = match s.trim().to_ascii_lowercase().trim_end_matches('*') {
                    "idle" | "mix" | "mixed" => "ready",
                    "alloc" | "allocated" => "allocated",
                    "drain" | "drng" | "draining" => "draining",
                    "drained" => "drained",
                    "down" => "down",
                    other => {
                        inv.warnings.push(format!(
                            "node state {other:?} has no Lattice equivalent; ignored"
                        ));
                        continue;
                    }
                };
                if !st.contains(&m) {
                    st.push(m);
                }
            }
            if !st.is_empty() {
                extra.push(format!("--state={}", st.join(",")));
            }
        } else if let Some(v) = c.value(&tok, "-n", "--nodes") {
            let v = need(v, "--nodes")?;
            match hostlist::expand(&v, 10_000) {
                Some(h) => nodes.extend(h),
                None => inv
                    .warnings
                    .push(format!("node list {v:?} could not be expanded; ignored")),
            }
        } else if let Some(v) = c.value(&tok, "-o", "--format") {
            inv.format = v;
            inv.warnings.push(
                "sinfo --format is not translated; `lattice nodes` prints its own columns".into(),
            );
        } else {
            inv.warnings
                .push(format!("sinfo option {tok} is not supported; ignored"));
        }
    }
    inv.argv.extend(nodes);
    inv.argv.extend(extra);
    Ok(inv)
}

/// Translate `sacct [-j IDS] [-u USER] [-S START] [-E END] [-X] [-n] [-P] [-o FMT]`.
pub fn sacct_to_lattice(args: &[String]) -> Result<Invocation, SubmitError> {
    let mut inv = Invocation {
        argv: vec!["history".into()],
        ..Default::default()
    };
    let mut c = Cursor { args, i: 0 };
    let mut ids = Vec::new();
    let mut rest = Vec::new();
    let (mut since, mut until) = (None, None);
    while c.i < args.len() {
        let tok = args[c.i].clone();
        c.i += 1;
        if tok == "-X"
            || tok == "--allocations"
            || tok == "-a"
            || tok == "--allusers"
            || tok == "-b"
            || tok == "--brief"
            || tok == "-l"
            || tok == "--long"
        {
        } else if tok == "-n" || tok == "--noheader" {
            inv.noheader = true;
        } else if tok == "-P" || tok == "--parsable2" || tok == "-p" || tok == "--parsable" {
            inv.parsable = true;
        } else if let Some(v) = c.value(&tok, "-j", "--jobs") {
            ids.extend(job_ids(&need(v, "--jobs")?, &mut inv));
        } else if let Some(v) = c.value(&tok, "-u", "--user") {
            rest.push(format!("--user={}", need(v, "--user")?));
        } else if let Some(v) = c.value(&tok, "-S", "--starttime") {
            since = Some(need(v, "--starttime")?);
        } else if let Some(v) = c.value(&tok, "-E", "--endtime") {
            until = Some(need(v, "--endtime")?);
        } else if let Some(v) = c.value(&tok, "-o", "--format") {
            inv.format = v;
        } else if let Some(v) = c.value(&tok, "-s", "--state") {
            if let Some(s) = states_arg(&need(v, "--state")?, &mut inv) {
                rest.push(s);
            }
        } else {
            inv.warnings
                .push(format!("sacct option {tok} is not supported; ignored"));
        }
    }
    if !ids.is_empty() {
        // Specific jobs: `lattice status` shows them in any phase. It has no time window,
        // so -S/-E travel in `since`/`until` for the caller to apply.
        inv.argv = vec!["status".into()];
        inv.argv.extend(ids);
        inv.since = since;
        inv.until = until;
    } else {
        rest.splice(
            0..0,
            since
                .map(|v| format!("--since={v}"))
                .into_iter()
                .chain(until.map(|v| format!("--until={v}"))),
        );
    }
    inv.argv.extend(rest);
    inv.argv.extend(["-o".into(), "json".into()]);
    Ok(inv)
}

// ---------------------------------------------------------------- squeue format

/// `squeue`'s default format.
pub const SQUEUE_DEFAULT_FORMAT: &str = "%.18i %.9P %.8j %.8u %.2t %.10M %.6D %R";

fn s<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    Some(cur)
}

fn st<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    s(v, path).and_then(Value::as_str)
}

fn time(v: &Value, path: &[&str]) -> Option<DateTime<Utc>> {
    st(v, path)
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
}

/// Slurm's elapsed-time style: `M:SS`, `H:MM:SS`, `D-HH:MM:SS`.
pub fn slurm_duration(secs: u64) -> String {
    let (d, h, m, s) = (
        secs / 86_400,
        (secs / 3600) % 24,
        (secs / 60) % 60,
        secs % 60,
    );
    if d > 0 {
        format!("{d}-{h:02}:{m:02}:{s:02}")
    } else if h > 0 {
        format!("{h}:{m:02}:{s:02}")
    } else {
        format!("{m}:{s:02}")
    }
}

/// The user who submitted an allocation, from well-known annotations/labels.
pub fn alloc_user(a: &Value) -> String {
    for path in [
        [
            "metadata",
            "annotations",
            lattice_apis::wellknown::USER_ANNOTATION,
        ],
        [
            "metadata",
            "annotations",
            lattice_apis::wellknown::SUBMITTED_BY_ANNOTATION,
        ],
        ["metadata", "labels", lattice_apis::wellknown::USER_LABEL],
        ["spec", "tags", "user"],
    ] {
        if let Some(u) = st(a, &path) {
            return u.to_string();
        }
    }
    "-".into()
}

fn node_count(a: &Value) -> u64 {
    if let Some(n) = s(a, &["status", "assignedNodes"])
        .and_then(Value::as_array)
        .filter(|n| !n.is_empty())
    {
        return n.len() as u64;
    }
    match s(a, &["spec", "resources", "nodes"]) {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(1),
        Some(Value::Object(o)) => o.get("min").and_then(Value::as_u64).unwrap_or(1),
        _ => 1,
    }
}

fn assigned(a: &Value) -> Vec<String> {
    s(a, &["status", "assignedNodes"])
        .and_then(Value::as_array)
        .map(|v| {
            v.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn elapsed(a: &Value, now: DateTime<Utc>) -> u64 {
    match time(a, &["status", "startTime"]) {
        Some(start) => {
            let end = time(a, &["status", "endTime"]).unwrap_or(now);
            (end - start).num_seconds().max(0) as u64
        }
        None => 0,
    }
}

fn limit_secs(a: &Value) -> Option<u64> {
    st(a, &["spec", "lifecycle", "walltime"]).and_then(|w| match parse_walltime(w) {
        Ok(Walltime::Seconds(s)) => Some(s),
        _ => None,
    })
}

fn field(a: &Value, c: char, now: DateTime<Utc>) -> String {
    let phase = st(a, &["status", "phase"]).unwrap_or("Pending");
    let id = st(a, &["metadata", "name"]).unwrap_or("").to_string();
    match c {
        'i' | 'A' => id,
        'j' => st(a, &["spec", "tags", "name"])
            .map(str::to_string)
            .unwrap_or(id),
        'T' => phase_to_slurm(phase).0.into(),
        't' => phase_to_slurm(phase).1.into(),
        'u' => alloc_user(a),
        'M' => slurm_duration(elapsed(a, now)),
        'l' => limit_secs(a)
            .map(slurm_duration)
            .unwrap_or_else(|| "UNLIMITED".into()),
        'L' => match limit_secs(a) {
            Some(l) => slurm_duration(l.saturating_sub(elapsed(a, now))),
            None => "UNLIMITED".into(),
        },
        'D' => node_count(a).to_string(),
        'N' => hostlist::compress(&assigned(a)),
        'P' => st(a, &["spec", "vcluster"]).unwrap_or("").into(),
        'a' => st(a, &["metadata", "namespace"]).unwrap_or("").into(),
        'q' => st(a, &["metadata", "annotations", annotations::QOS])
            .map(str::to_string)
            .or_else(|| s(a, &["spec", "preemptionClass"]).map(|c| c.to_string()))
            .unwrap_or_else(|| "normal".into()),
        'r' => st(a, &["status", "reason"]).unwrap_or("None").into(),
        'R' => {
            let nodes = assigned(a);
            if matches!(phase, "Pending" | "Suspended") || nodes.is_empty() {
                format!(
                    "({})",
                    st(a, &["status", "reason"]).unwrap_or(if phase == "Pending" {
                        "None"
                    } else {
                        phase
                    })
                )
            } else {
                hostlist::compress(&nodes)
            }
        }
        'V' => st(a, &["status", "submitTime"])
            .or(st(a, &["metadata", "creationTimestamp"]))
            .map(trim_ts)
            .unwrap_or_else(|| "N/A".into()),
        'S' => st(a, &["status", "startTime"])
            .map(trim_ts)
            .unwrap_or_else(|| "N/A".into()),
        'e' => st(a, &["status", "endTime"])
            .map(trim_ts)
            .unwrap_or_else(|| "N/A".into()),
        'K' => st(a, &["spec", "taskGroup", "range"])
            .unwrap_or("N/A")
            .into(),
        'F' => id,
        'Z' => st(a, &["spec", "workingDir"]).unwrap_or("").into(),
        'o' => {
            if st(a, &["spec", "script"]).is_some() {
                "(script)".into()
            } else {
                st(a, &["spec", "entrypoint"]).unwrap_or("").into()
            }
        }
        'E' => s(a, &["spec", "dependsOn"])
            .and_then(Value::as_array)
            .map(|d| {
                d.iter()
                    .map(|e| {
                        format!(
                            "{}:{}",
                            dep_kind(
                                e.get("condition")
                                    .and_then(Value::as_str)
                                    .unwrap_or("success")
                            ),
                            e.get("ref").and_then(Value::as_str).unwrap_or("")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            })
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| "(null)".into()),
        _ => String::new(),
    }
}

fn dep_kind(c: &str) -> &'static str {
    match c {
        "failure" => "afternotok",
        "any" => "afterany",
        "corresponding" => "aftercorr",
        _ => "afterok",
    }
}

fn trim_ts(t: &str) -> String {
    // squeue prints 2026-03-05T10:00:12 (no zone).
    t.trim_end_matches('Z')
        .split('.')
        .next()
        .unwrap_or(t)
        .chars()
        .take(19)
        .collect()
}

fn header(c: char) -> &'static str {
    match c {
        'i' | 'A' => "JOBID",
        'j' => "NAME",
        'T' => "STATE",
        't' => "ST",
        'u' => "USER",
        'M' => "TIME",
        'l' => "TIME_LIMIT",
        'L' => "TIME_LEFT",
        'D' => "NODES",
        'N' => "NODELIST",
        'P' => "PARTITION",
        'a' => "ACCOUNT",
        'q' => "QOS",
        'r' => "REASON",
        'R' => "NODELIST(REASON)",
        'V' => "SUBMIT_TIME",
        'S' => "START_TIME",
        'e' => "END_TIME",
        'K' => "ARRAY_TASK_ID",
        'F' => "ARRAY_JOB_ID",
        'Z' => "WORK_DIR",
        'o' => "COMMAND",
        'E' => "DEPENDENCY",
        _ => "",
    }
}

enum Piece {
    Lit(String),
    Field {
        c: char,
        width: Option<usize>,
        right: bool,
    },
}

fn parse_format(fmt: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut lit = String::new();
    let chars: Vec<char> = fmt.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '%' {
            lit.push(chars[i]);
            i += 1;
            continue;
        }
        i += 1;
        if i < chars.len() && chars[i] == '%' {
            lit.push('%');
            i += 1;
            continue;
        }
        let mut right = false;
        if i < chars.len() && chars[i] == '.' {
            right = true;
            i += 1;
        }
        if i < chars.len() && chars[i] == '-' {
            i += 1;
        }
        let mut w = String::new();
        while i < chars.len() && chars[i].is_ascii_digit() && w.len() < 4 {
            w.push(chars[i]);
            i += 1;
        }
        if i < chars.len() {
            if !lit.is_empty() {
                out.push(Piece::Lit(std::mem::take(&mut lit)));
            }
            out.push(Piece::Field {
                c: chars[i],
                width: w.parse().ok(),
                right,
            });
            i += 1;
        }
    }
    if !lit.is_empty() {
        out.push(Piece::Lit(lit));
    }
    out
}

fn pad(v: &str, width: Option<usize>, right: bool) -> String {
    match width {
        None | Some(0) => v.to_string(),
        Some(w) => {
            let t: String = v.chars().take(w).collect();
            if right {
                format!("{t:>w$}")
            } else {
                format!("{t:<w$}")
            }
        }
    }
}

/// Render allocations as `squeue -o FORMAT` would (one line per allocation,
/// a header line unless `noheader`). Supports `%i %j %T %t %u %M %l %L %D %N
/// %P %a %q %r %R %V %S %e %K %F %Z %o %E %A %%` with `%[.][-][width]X`
/// (`.` right-justifies; values are truncated to the width, as squeue does).
/// `None` uses squeue's default format.
pub fn format_squeue(
    allocs: &[Value],
    format: Option<&str>,
    noheader: bool,
    now: DateTime<Utc>,
) -> String {
    let pieces = parse_format(format.unwrap_or(SQUEUE_DEFAULT_FORMAT));
    let mut out = String::new();
    let line = |get: &dyn Fn(char) -> String| -> String {
        let mut l = String::new();
        for p in &pieces {
            match p {
                Piece::Lit(t) => l.push_str(t),
                Piece::Field { c, width, right } => l.push_str(&pad(&get(*c), *width, *right)),
            }
        }
        l.trim_end().to_string()
    };
    if !noheader {
        out.push_str(&line(&|c| header(c).to_string()));
        out.push('\n');
    }
    for a in allocs {
        out.push_str(&line(&|c| field(a, c, now)));
        out.push('\n');
    }
    out
}

/// Output of `sbatch` for an id: `Submitted batch job ID`, or just `ID` with `--parsable`.
pub fn sbatch_output(id: &str, parsable: bool) -> String {
    if parsable {
        id.to_string()
    } else {
        format!("Submitted batch job {id}")
    }
}
