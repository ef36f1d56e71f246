//! `lattice logs ID`: `GET .../allocations/{id}/log` (text/plain, streamed as it arrives).

use std::io::Write;
use std::time::Duration;

use serde_json::json;

use crate::cli::LogsArgs;
use crate::client::ClientError;
use crate::cmd::workload::{self, is_terminal, object, parse_when, phase, rfc3339};
use crate::errors::{exit, CliError};
use crate::output::OutputFormat;
use crate::{Ctx, Shutdown};

/// The log endpoint's query for `args`.
pub fn query(ctx: &Ctx, args: &LogsArgs) -> Result<Vec<(String, String)>, CliError> {
    let mut q: Vec<(String, String)> = Vec::new();
    if args.follow {
        q.push(("follow".into(), "true".into()));
    }
    if let Some(n) = args.tail {
        q.push(("tailLines".into(), n.to_string()));
    }
    let stream = if args.stderr {
        "stderr"
    } else if args.stdout {
        "stdout"
    } else {
        "all"
    };
    q.push(("stream".into(), stream.into()));
    if let Some(n) = &args.node {
        q.push(("node".into(), n.clone()));
    }
    let now = ctx.now();
    if let Some(s) = &args.since {
        q.push(("sinceTime".into(), rfc3339(parse_when("--since", s, now)?)));
    }
    if let Some(u) = &args.until {
        q.push(("untilTime".into(), rfc3339(parse_when("--until", u, now)?)));
    }
    if args.timestamps {
        q.push(("timestamps".into(), "true".into()));
    }
    if args.label {
        q.push(("prefix".into(), "true".into()));
    } else if args.no_prefix {
        q.push(("prefix".into(), "false".into()));
    }
    Ok(q)
}

/// True for the 404 a server without the log endpoint answers (a route it does not know),
/// as opposed to the log endpoint's own "no logs (yet)" answers, which say why.
fn is_missing_endpoint(e: &ClientError) -> bool {
    match e {
        ClientError::Status { status, .. } if status.code == 404 => {
            let m = status.message.trim();
            m.is_empty() || m.contains("could not find the requested resource")
        }
        _ => false,
    }
}

/// How often `--follow` looks again at an allocation that has not started yet.
const START_POLL: Duration = Duration::from_millis(250);

/// Streams an allocation's log to `out`. Returns when the server ends the body (or on
/// Ctrl-C); `Ok(false)` when interrupted. With `--follow`, an allocation that has not
/// started yet (no node, or its agent has no output yet) is waited for, with a note on
/// `err`; without it, that is an error saying so.
pub async fn stream(
    ctx: &Ctx,
    tenant: &str,
    args: &LogsArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    shutdown: &mut Shutdown,
) -> Result<bool, CliError> {
    let q = query(ctx, args)?;
    let obj = object("allocations", Some(tenant), &args.id);
    let path = format!("{obj}/log");
    let what = format!("get logs of allocation {:?}", args.id);
    let mut announced = false;
    let mut body = loop {
        let e0 = match ctx.client.get_stream(&path, &q).await {
            Ok(b) => break b,
            Err(e) => e,
        };
        if !matches!(e0.code(), Some(400 | 404)) {
            return Err(CliError::from_client(what, e0));
        }
        // No such allocation, one that has not started, or a server without the endpoint?
        let a = match ctx.client.get(&obj).await {
            Ok(a) => a,
            Err(e2) if e2.is_not_found() => {
                return Err(workload::not_found(
                    "allocation",
                    &args.id,
                    Some(tenant),
                    "lattice status --all",
                ))
            }
            Err(_) => return Err(CliError::from_client(what, e0)),
        };
        if is_missing_endpoint(&e0) {
            return Err(CliError::new(
                what,
                format!(
                    "the server has no log endpoint (404 for {})",
                    path.rsplit_once("/allocations/")
                        .map(|x| x.1)
                        .unwrap_or(&path)
                ),
            )
            .hint("upgrade lattice-server; logs are served at .../allocations/NAME/log"));
        }
        let p = phase(&a).to_string();
        let why = match &e0 {
            ClientError::Status { status, .. } => status.message_or_reason(),
            other => other.to_string(),
        };
        if is_terminal(&p) {
            // It ended without output that can still be served (never ran, node gone...).
            return Err(CliError::new(what, why).detail(format!("State: {p}")));
        }
        if let Some(n) = &args.node {
            let assigned: Vec<&str> = a
                .pointer("/status/assignedNodes")
                .and_then(serde_json::Value::as_array)
                .map(|v| v.iter().filter_map(serde_json::Value::as_str).collect())
                .unwrap_or_default();
            if !assigned.is_empty() && !assigned.contains(&n.as_str()) {
                // --node names a node the allocation is not on: waiting would not help.
                return Err(CliError::new(what, why)
                    .hint(format!(
                        "its nodes are {}; `lattice status {} -o wide` shows them",
                        assigned.join(", "),
                        args.id
                    ))
                    .exit_code(exit::USAGE));
            }
        }
        if !args.follow {
            return Err(CliError::new(
                what,
                format!("allocation {} has not started yet ({p})", args.id),
            )
            .detail(format!("Server: {why}"))
            .hint(format!(
                "`lattice logs {} --follow` waits for it to start and streams its output",
                args.id
            )));
        }
        if !announced && !ctx.quiet {
            writeln!(err, "Waiting for allocation {} to start ({p}) ...", args.id)?;
            err.flush()?;
            announced = true;
        }
        tokio::select! {
            _ = &mut *shutdown => return Ok(false),
            _ = tokio::time::sleep(START_POLL) => {}
        }
    };
    let json_lines = ctx.output == Some(OutputFormat::Json);
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let chunk = tokio::select! {
            _ = &mut *shutdown => return Ok(false),
            c = body.next() => c,
        };
        match chunk {
            Some(Ok(bytes)) => {
                if json_lines {
                    pending.extend_from_slice(&bytes);
                    while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                        let line: Vec<u8> = pending.drain(..=pos).collect();
                        let text = String::from_utf8_lossy(&line[..line.len() - 1]).to_string();
                        writeln!(out, "{}", json!({"id": args.id, "line": text}))?;
                    }
                } else {
                    out.write_all(&bytes)?;
                }
                out.flush()?;
            }
            Some(Err(e)) => {
                return Err(CliError::from_client(
                    format!("stream logs of allocation {:?}", args.id),
                    e,
                ))
            }
            None => break,
        }
    }
    if json_lines && !pending.is_empty() {
        let text = String::from_utf8_lossy(&pending).to_string();
        writeln!(out, "{}", json!({"id": args.id, "line": text}))?;
    }
    out.flush()?;
    Ok(true)
}

/// Runs `logs`.
pub async fn run(
    ctx: &mut Ctx,
    args: &LogsArgs,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    if args.id.is_empty() {
        return Err(CliError::new("logs", "no allocation given")
            .hint("lattice logs ID [--follow]")
            .exit_code(exit::USAGE));
    }
    let tenant = ctx.tenant.clone();
    if args.download {
        let a = workload::get_allocation(ctx, &tenant, &args.id).await?;
        for line in download(ctx, &tenant, &a, &mut shutdown).await? {
            writeln!(out, "{line}")?;
        }
        return Ok(0);
    }
    // Ctrl-C while following ends it normally, like `watch`.
    stream(ctx, &tenant, args, out, err, &mut shutdown).await?;
    Ok(0)
}

/// Annotation with the submission's `--error` path (download hint).
pub use lattice_apis::wellknown::ERROR_ANNOTATION;
/// Annotation with the submission's `--output` path (download hint).
pub use lattice_apis::wellknown::OUTPUT_ANNOTATION;
/// Slurm's default output file name.
pub const DEFAULT_OUTPUT: &str = "slurm-%j.out";

/// Expands Slurm's file name patterns in `pattern` for allocation `a`: `%%`, `%j`/`%J`
/// (job id), `%x` (job name), `%u` (user), `%A` (array job id, else the job id), `%a`
/// (array index, else `4294967294` as Slurm does), `%N` (first node), `%n`/`%t` (0),
/// `%s` (`batch`); a number after `%` zero-pads (`%4a`). A `\` anywhere disables
/// expansion (Slurm's rule).
pub fn expand_filename(pattern: &str, a: &serde_json::Value) -> String {
    if pattern.contains('\\') {
        return pattern.replace('\\', "");
    }
    let ann = |k: &str| {
        a.pointer(&format!("/metadata/annotations/{}", k.replace('/', "~1")))
            .and_then(serde_json::Value::as_str)
    };
    let label = |k: &str| {
        a.pointer(&format!("/metadata/labels/{}", k.replace('/', "~1")))
            .and_then(serde_json::Value::as_str)
    };
    let id = workload::name(a);
    let job_name = a
        .pointer("/spec/tags/name")
        .and_then(serde_json::Value::as_str)
        .unwrap_or(id);
    let user = ann(workload::USER_ANNOTATION).unwrap_or("unknown");
    let index = label(lattice_apis::wellknown::TASK_INDEX_LABEL);
    let group = label(lattice_apis::wellknown::TASK_GROUP_LABEL).unwrap_or(id);
    let first_node = a
        .pointer("/status/assignedNodes/0")
        .and_then(serde_json::Value::as_str)
        .or_else(|| {
            a.pointer("/status/nodeStates")
                .and_then(serde_json::Value::as_object)
                .and_then(|m| m.keys().next().map(String::as_str))
        })
        .unwrap_or("unknown");
    let mut out = String::new();
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut width = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            width.push(*d);
            chars.next();
        }
        let Some(k) = chars.next() else {
            out.push('%');
            out.push_str(&width);
            break;
        };
        let v = match k {
            '%' => "%".to_string(),
            'j' | 'J' => id.to_string(),
            'x' => job_name.to_string(),
            'u' => user.to_string(),
            'A' => group.to_string(),
            'a' => index.unwrap_or("4294967294").to_string(),
            'N' => first_node.to_string(),
            'n' | 't' => "0".to_string(),
            's' => "batch".to_string(),
            other => format!("%{width}{other}"),
        };
        let w: usize = width.parse().unwrap_or(0);
        if k != '%' && v.chars().all(|ch| ch.is_ascii_digit()) && v.len() < w {
            out.push_str(&"0".repeat(w - v.len()));
        }
        out.push_str(&v);
    }
    out
}

/// Where `--download` writes a file named by allocation `a`'s submission: `pattern`
/// expanded (see [`expand_filename`]), relative paths under `base`. For someone else's
/// allocation (its `lattice.dev/user` is not `me`; the annotations and the job name are
/// theirs to choose) the path must stay in the current directory `cwd`: relative paths
/// are taken from `cwd` (not their submission directory), and absolute ones or ones with
/// a `..` component are replaced by their file name in `cwd`. Returns the path and, when
/// it was replaced, a note saying so.
pub fn download_path(
    pattern: &str,
    a: &serde_json::Value,
    base: &std::path::Path,
    cwd: &std::path::Path,
    trusted: bool,
) -> (std::path::PathBuf, Option<String>) {
    use std::path::{Component, Path, PathBuf};
    let expanded = expand_filename(pattern, a);
    let p = Path::new(&expanded);
    if trusted {
        return (base.join(p), None);
    }
    let escapes = p
        .components()
        .any(|c| !matches!(c, Component::Normal(_) | Component::CurDir));
    if !escapes {
        return (cwd.join(p), None);
    }
    let file = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            _ => None,
        })
        .next_back()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(format!("slurm-{}.out", workload::name(a))));
    let path = cwd.join(file);
    let note = format!(
        "Note: allocation {} belongs to {}, not you: its output path {expanded:?} is not used outside the current directory; writing {} instead",
        workload::name(a),
        a.pointer("/metadata/annotations/lattice.dev~1user")
            .and_then(serde_json::Value::as_str)
            .unwrap_or("an unknown user"),
        path.display()
    );
    (path, Some(note))
}

/// Downloads an allocation's output to the files its submission named (see
/// [`expand_filename`] and [`download_path`]); returns one line per file written (and
/// one per note).
pub async fn download(
    ctx: &Ctx,
    tenant: &str,
    a: &serde_json::Value,
    shutdown: &mut Shutdown,
) -> Result<Vec<String>, CliError> {
    let id = workload::name(a).to_string();
    let hint = |k: &str| {
        a.pointer(&format!("/metadata/annotations/{}", k.replace('/', "~1")))
            .and_then(serde_json::Value::as_str)
            .filter(|v| !v.trim().is_empty())
            .map(str::to_string)
    };
    // Only the submitter's own paths are followed anywhere.
    let me = ctx.user();
    let trusted = me.is_some() && hint(workload::USER_ANNOTATION) == me;
    let base = hint(lattice_apis::wellknown::SUBMIT_DIR_ANNOTATION)
        .filter(|_| trusted)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| ctx.cwd.clone());
    let mut lines = Vec::new();
    let mut resolve = |p: &str| {
        let (path, note) = download_path(p, a, &base, &ctx.cwd, trusted);
        lines.extend(note);
        path
    };
    let out_path = resolve(&hint(OUTPUT_ANNOTATION).unwrap_or_else(|| DEFAULT_OUTPUT.into()));
    let err_path = hint(ERROR_ANNOTATION).map(|e| resolve(&e));
    // The files hold the output as the job wrote it: no `node| ` prefixes.
    let parts: Vec<(std::path::PathBuf, LogsArgs)> = match err_path {
        Some(e) if e != out_path => vec![
            (
                out_path,
                LogsArgs {
                    id: id.clone(),
                    stdout: true,
                    no_prefix: true,
                    ..Default::default()
                },
            ),
            (
                e,
                LogsArgs {
                    id: id.clone(),
                    stderr: true,
                    no_prefix: true,
                    ..Default::default()
                },
            ),
        ],
        _ => vec![(
            out_path,
            LogsArgs {
                id: id.clone(),
                no_prefix: true,
                ..Default::default()
            },
        )],
    };
    for (path, la) in parts {
        let mut buf: Vec<u8> = Vec::new();
        let mut sink: Vec<u8> = Vec::new();
        if !stream(ctx, tenant, &la, &mut buf, &mut sink, shutdown).await? {
            return Err(CliError::new("logs --download", "interrupted").exit_code(130));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| {
                CliError::new(
                    format!("logs --download: create {}", dir.display()),
                    e.to_string(),
                )
            })?;
        }
        std::fs::write(&path, &buf).map_err(|e| {
            CliError::new(
                format!("logs --download: write {}", path.display()),
                e.to_string(),
            )
        })?;
        lines.push(format!(
            "Wrote {} bytes of {} output to {}",
            buf.len(),
            if la.stdout {
                "standard"
            } else if la.stderr {
                "error"
            } else {
                "the"
            },
            path.display()
        ));
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_file_name_patterns() {
        let a = json!({
            "metadata": {"name": "sweep-7", "annotations": {"lattice.dev/user": "alice"},
                         "labels": {"lattice.dev/task-group": "sweep", "lattice.dev/task-index": "7"}},
            "spec": {"tags": {"name": "train"}},
            "status": {"assignedNodes": ["n3", "n4"]}
        });
        assert_eq!(expand_filename("slurm-%j.out", &a), "slurm-sweep-7.out");
        assert_eq!(expand_filename("%x_%A_%a.log", &a), "train_sweep_7.log");
        assert_eq!(
            expand_filename("%u/%N-%3a-%%.txt", &a),
            "alice/n3-007-%.txt"
        );
        assert_eq!(expand_filename("out-%q", &a), "out-%q");
        assert_eq!(expand_filename("odd%", &a), "odd%");
        assert_eq!(
            expand_filename("a\\b-%j", &a),
            "ab-%j",
            "a backslash disables patterns"
        );
        let plain = json!({"metadata": {"name": "j1"}});
        assert_eq!(expand_filename("%x-%a-%N", &plain), "j1-4294967294-unknown");
    }

    #[test]
    fn someone_elses_paths_stay_in_the_current_directory() {
        use std::path::{Path, PathBuf};
        let a = json!({
            "metadata": {"name": "j9", "annotations": {"lattice.dev/user": "bob"}},
            "spec": {"tags": {"name": "../../.ssh/authorized_keys"}}
        });
        let (base, cwd) = (Path::new("/home/bob/run"), Path::new("/home/alice/here"));
        // One's own job: its paths as they are.
        assert_eq!(
            download_path("/tmp/out-%j.txt", &a, base, cwd, true),
            (PathBuf::from("/tmp/out-j9.txt"), None)
        );
        assert_eq!(
            download_path("logs/%j.out", &a, base, cwd, true).0,
            PathBuf::from("/home/bob/run/logs/j9.out")
        );
        // Someone else's: relative paths from here, nothing outside it.
        assert_eq!(
            download_path("logs/%j.out", &a, base, cwd, false),
            (PathBuf::from("/home/alice/here/logs/j9.out"), None)
        );
        for (pattern, want) in [
            ("/home/alice/.bashrc", "/home/alice/here/.bashrc"),
            ("../x/../../evil", "/home/alice/here/evil"),
            ("%x", "/home/alice/here/authorized_keys"),
            ("/", "/home/alice/here/slurm-j9.out"),
            ("..", "/home/alice/here/slurm-j9.out"),
        ] {
            let (path, note) = download_path(pattern, &a, base, cwd, false);
            assert_eq!(path, PathBuf::from(want), "{pattern}");
            let note = note.unwrap_or_default();
            assert!(note.contains("belongs to bob"), "{pattern}: {note}");
        }
    }
}
