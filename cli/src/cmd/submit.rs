//! `lattice submit SCRIPT | -- CMD ARGS`: `#SBATCH`/`#LATTICE` translation through
//! `lattice-compat`, then a POST of the Allocation.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use lattice_compat::{translate, CompatConfig, SubmitError, SubmitFlags, Translation};
use serde_json::{json, Value};

use crate::cli::{SubmitArgs, SubmitDryRun};
use crate::client::{ClientError, WriteOptions};
use crate::cmd::workload::{self, collection, phase, s, USER_ANNOTATION, USER_LABEL};
use crate::config::ENV_COMPAT_CONFIG;
use crate::errors::{exit, from_status, CliError};
use crate::output::format::{to_json, to_yaml};
use crate::output::OutputFormat;
use crate::{Ctx, Shutdown};

/// The compat file name looked up in the working directory and the config directory.
pub const COMPAT_FILE: &str = "lattice-compat.yaml";

/// Finds and reads `lattice-compat.yaml`: `--compat-config`, `$LATTICE_COMPAT_CONFIG`,
/// `./lattice-compat.yaml`, `~/.config/lattice/lattice-compat.yaml`. None found: empty.
pub fn load_compat(ctx: &Ctx, flag: Option<&Path>) -> Result<CompatConfig, CliError> {
    let explicit: Option<(PathBuf, &str)> = match flag {
        Some(p) => Some((p.to_path_buf(), "--compat-config")),
        None => ctx
            .env
            .get(ENV_COMPAT_CONFIG)
            .map(|p| (PathBuf::from(p), ENV_COMPAT_CONFIG)),
    };
    let path = match explicit {
        Some((p, origin)) => {
            if !p.exists() {
                return Err(CliError::new(
                    format!("read {} (from {origin})", p.display()),
                    "no such file",
                )
                .hint("check the path, or drop it to use ./lattice-compat.yaml")
                .exit_code(exit::USAGE));
            }
            Some(p)
        }
        None => {
            let mut cands = vec![ctx.cwd.join(COMPAT_FILE)];
            if let Some(x) = ctx.env.get("XDG_CONFIG_HOME") {
                cands.push(Path::new(&x).join("lattice").join(COMPAT_FILE));
            }
            if let Some(h) = ctx.env.get("HOME") {
                cands.push(Path::new(&h).join(".config/lattice").join(COMPAT_FILE));
            }
            cands.into_iter().find(|p| p.is_file())
        }
    };
    let Some(path) = path else {
        return Ok(CompatConfig::default());
    };
    let text = std::fs::read_to_string(&path)
        .map_err(|e| CliError::new(format!("read {}", path.display()), e.to_string()))?;
    CompatConfig::from_yaml(&text).map_err(|e| {
        let mut err = compat_error(&format!("read {}", path.display()), &e);
        err.why = err
            .why
            .trim_start_matches("lattice-compat.yaml: ")
            .to_string();
        err
    })
}

/// Renders a translation error (`what — why`, details, `Hint:`).
pub fn compat_error(what: &str, e: &SubmitError) -> CliError {
    let text = e.to_string();
    let mut lines = text.lines();
    let mut err = CliError::new(what, lines.next().unwrap_or_default().trim());
    for l in lines {
        let l = l.trim();
        if let Some(h) = l.strip_prefix("Hint: ") {
            err = err.hint(h);
        } else if !l.is_empty() {
            err = err.detail(l);
        }
    }
    err
}

/// What `submit` reads: the script text, its file name, the command.
struct Job {
    script: String,
    script_name: Option<String>,
}

fn read_script(cwd: &Path, path: &str, stdin: &mut dyn Read) -> Result<Job, CliError> {
    if path == "-" {
        let mut text = String::new();
        stdin
            .read_to_string(&mut text)
            .map_err(|e| CliError::new("read the script from stdin", e.to_string()))?;
        return Ok(Job {
            script: text,
            script_name: None,
        });
    }
    let text = std::fs::read(cwd.join(path)).map_err(|e| {
        let why = if e.kind() == std::io::ErrorKind::NotFound {
            "no such file".to_string()
        } else {
            e.to_string()
        };
        CliError::new(format!("read script {path}"), why).hint(
            "pass the path of a batch script, or a command after `--` (lattice submit -- hostname)",
        )
    })?;
    let text = String::from_utf8(text).map_err(|_| {
        CliError::new(format!("read script {path}"), "it is not UTF-8 text")
            .hint("batch scripts are text files; check that you passed the script, not a binary")
    })?;
    Ok(Job {
        script: text,
        script_name: Some(path.to_string()),
    })
}

/// Builds the Allocation for `flags` (+ script): translation, tenant, user annotations.
/// Warnings are returned, not printed.
pub async fn build(
    ctx: &Ctx,
    mut flags: SubmitFlags,
    script: &str,
    compat_flag: Option<&Path>,
    check_server: bool,
) -> Result<Translation, CliError> {
    let mut compat = load_compat(ctx, compat_flag)?;
    if let Some(v) = &ctx.settings.default_vcluster {
        // The user's default beats the site's, but not the script's --partition.
        compat.default_vcluster = Some(v.clone());
    }
    if ctx.settings.tenant_source == crate::config::Source::Flag {
        flags.tenant = Some(ctx.tenant.clone());
    }
    if flags.vcluster.is_none() {
        flags.vcluster = ctx.vcluster.clone();
    }
    if flags.submit_dir.is_none() {
        flags.submit_dir = Some(ctx.cwd.display().to_string());
    }
    let what = match &flags.script_name {
        Some(n) => format!("submit {n}"),
        None if flags.command.is_empty() => "submit".to_string(),
        None => format!("submit {}", flags.command[0]),
    };
    let mut t = match translate(script, &flags, &compat) {
        Ok(t) => t,
        Err(SubmitError::UnknownVCluster {
            name,
            available,
            source_,
        }) => {
            let mut avail = available;
            if check_server {
                if let Some(server) = server_vclusters(ctx, None).await {
                    if !server.is_empty() {
                        avail = server;
                    }
                }
            }
            let directive =
                source_.line().is_some() || name != flags.vcluster.clone().unwrap_or_default();
            return Err(unknown_vcluster(
                &what,
                &name,
                &avail,
                directive.then(|| source_.to_string()).as_deref(),
            ));
        }
        Err(e) => return Err(compat_error(&what, &e)),
    };
    let a = &mut t.allocation;
    if let Some(prog) = flags.command.first() {
        // A command has no script name: name the allocation after the program.
        if s(a, "/metadata/name").is_none() && s(a, "/spec/tags/name").is_none() {
            let base = prog.rsplit('/').next().unwrap_or(prog).to_string();
            a["metadata"]["generateName"] = json!(format!(
                "{}-",
                lattice_compat::translate::sanitize_name(&base, 50)
            ));
            if !a["spec"]["tags"].is_object() {
                a["spec"]["tags"] = json!({});
            }
            a["spec"]["tags"]["name"] = json!(base);
        }
    }
    let ns = s(a, "/metadata/namespace")
        .map(str::to_string)
        .unwrap_or_else(|| ctx.tenant.clone());
    a["metadata"]["namespace"] = json!(ns);
    if let Some(u) = ctx.user() {
        let md = &mut a["metadata"];
        if !md["annotations"].is_object() {
            md["annotations"] = json!({});
        }
        md["annotations"][USER_ANNOTATION] = json!(u);
        if is_label_value(&u) {
            if !md["labels"].is_object() {
                md["labels"] = json!({});
            }
            md["labels"][USER_LABEL] = json!(u);
        }
    }
    if check_server {
        if let Some(v) = s(a, "/spec/vcluster").map(str::to_string) {
            if let Some(known) = server_vclusters(ctx, Some(&ns)).await {
                if !known.is_empty() && !known.contains(&v) {
                    return Err(unknown_vcluster(&what, &v, &known, None));
                }
            }
        }
    }
    Ok(t)
}

fn is_label_value(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.as_bytes()[0].is_ascii_alphanumeric()
        && v.as_bytes()[v.len() - 1].is_ascii_alphanumeric()
}

/// vCluster names the server knows (in `tenant`, or everywhere); `None` when it cannot say.
pub async fn server_vclusters(ctx: &Ctx, tenant: Option<&str>) -> Option<Vec<String>> {
    let list = tokio::time::timeout(
        Duration::from_secs(5),
        ctx.client
            .list(&collection("vclusters", tenant), &Default::default()),
    )
    .await
    .ok()?
    .ok()?;
    let mut names: Vec<String> = list
        .get("items")?
        .as_array()?
        .iter()
        .filter_map(|v| s(v, "/metadata/name").map(str::to_string))
        .collect();
    names.sort();
    names.dedup();
    Some(names)
}

fn unknown_vcluster(what: &str, name: &str, avail: &[String], at: Option<&str>) -> CliError {
    let mut e = CliError::new(what, format!("vCluster \"{name}\" not found"));
    e = e.detail(format!(
        "Available: {}",
        if avail.is_empty() {
            "(none configured)".to_string()
        } else {
            avail.join(", ")
        }
    ));
    if let Some(at) = at {
        e = e.detail(format!("Where: {at}"));
    }
    if at.is_some() {
        e.hint(format!(
            "use one of the available vClusters (--vcluster=NAME), or ask your site admin to map \
             partition \"{name}\" in lattice-compat.yaml"
        ))
    } else {
        e.hint("use one of the available vClusters (--vcluster=NAME); `lattice admin vcluster list` shows them")
    }
}

/// Prints the translation's warnings as `Warning: ...` (unless `-q`).
pub fn print_warnings(ctx: &Ctx, t: &Translation, err: &mut dyn Write) -> std::io::Result<()> {
    // `-q`, or sbatch's `--quiet` in the script or its options: only errors are shown.
    if ctx.quiet || t.client.quiet {
        return Ok(());
    }
    for w in &t.warnings {
        writeln!(err, "Warning: {w}")?;
    }
    Ok(())
}

/// POSTs an Allocation; returns the created object.
///
/// First reads the tenant (best effort: a 404, a 403 or any other failure skips the check)
/// and refuses, without posting, an allocation that needs more nodes than the tenant's
/// hard `spec.quota.maxNodes` allows at all: it could never run. (One that only exceeds the
/// current headroom is posted and waits, `waiting for quota headroom`.) A quota rejection
/// by the server gets the same numbers.
pub async fn post(ctx: &Ctx, alloc: &Value, dry_run: bool) -> Result<Value, CliError> {
    let ns = s(alloc, "/metadata/namespace")
        .unwrap_or(&ctx.tenant)
        .to_string();
    let tenant = read_tenant(ctx, &ns).await;
    if let Some(e) = tenant.as_ref().and_then(|t| over_quota(alloc, &ns, t)) {
        return Err(e);
    }
    check_dependencies(ctx, alloc, &ns).await?;
    ctx.client
        .create(
            &collection("allocations", Some(&ns)),
            alloc,
            &WriteOptions { dry_run },
        )
        .await
        .map_err(|e| rejected(alloc, tenant.as_ref(), e))
}

/// Refuses, before posting, a dependency on an allocation that does not exist: `sbatch
/// --dependency=afterok:999` fails ("Job dependency problem") and Flux rejects an unknown
/// job id, rather than queueing a job that waits for nothing forever. (Manifests applied
/// with `lattice apply` may name allocations that come later: declarative order is free,
/// and the allocation waits, `waiting for dependencies`, saying which one is missing.)
/// Refs are names in the tenant, or uids; a lookup that fails for another reason than
/// "not found" is left to the server.
async fn check_dependencies(ctx: &Ctx, alloc: &Value, ns: &str) -> Result<(), CliError> {
    let deps = alloc
        .pointer("/spec/dependsOn")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut uids: Option<Vec<String>> = None;
    for (i, d) in deps.iter().enumerate() {
        // `mutex` names a lock, not an allocation.
        let (Some(r), false) = (d["ref"].as_str(), d["condition"] == "mutex") else {
            continue;
        };
        match ctx
            .client
            .get(&workload::object("allocations", Some(ns), r))
            .await
        {
            Err(e) if e.is_not_found() => {}
            _ => continue,
        }
        if uuid_like(r) {
            if uids.is_none() {
                let list = ctx
                    .client
                    .list(&collection("allocations", Some(ns)), &Default::default())
                    .await
                    .ok();
                uids = Some(
                    list.iter()
                        .flat_map(|l| l["items"].as_array().cloned().unwrap_or_default())
                        .filter_map(|o| s(&o, "/metadata/uid").map(str::to_string))
                        .collect(),
                );
            }
            if uids.as_ref().is_some_and(|u| u.iter().any(|u| u == r)) {
                continue;
            }
        }
        return Err(CliError::new(
            "cannot submit",
            format!("it depends on allocation \"{r}\", which does not exist in tenant \"{ns}\""),
        )
        .detail(format!("Field: spec.dependsOn[{i}].ref"))
        .hint(format!(
            "check the id with `lattice status -t {ns}`; a dependency names an allocation that was \
             already submitted (by name or uid)"
        ))
        .exit_code(exit::NOT_FOUND));
    }
    Ok(())
}

fn uuid_like(s: &str) -> bool {
    s.len() == 36
        && s.bytes().enumerate().all(|(i, b)| {
            matches!(i, 8 | 13 | 18 | 23) == (b == b'-') && (b == b'-' || b.is_ascii_hexdigit())
        })
}

/// The cluster-scoped Tenant object, when it can be read within 5 s.
async fn read_tenant(ctx: &Ctx, name: &str) -> Option<Value> {
    tokio::time::timeout(
        Duration::from_secs(5),
        ctx.client.get(&workload::object("tenants", None, name)),
    )
    .await
    .ok()?
    .ok()
}

/// The smallest number of nodes the allocation can run on (per task for task groups).
fn min_nodes(alloc: &Value) -> u64 {
    match alloc.pointer("/spec/resources/nodes") {
        Some(Value::Number(n)) => n.as_u64().unwrap_or(1),
        Some(Value::Object(o)) => o.get("min").and_then(Value::as_u64).unwrap_or(1),
        _ => 1,
    }
}

/// The seed's quota error: what was rejected, then `Current:` (the tenant's
/// `status.usage.nodes`), `Requested:`, `Limit:` (`spec.quota.maxNodes`) and a hint.
fn quota_error(why: String, alloc: &Value, tenant: Option<&Value>, hint: String) -> CliError {
    let mut err = CliError::new("allocation rejected", why).exit_code(exit::DENIED);
    let num = |p: &str| tenant.and_then(|t| t.pointer(p)).and_then(Value::as_u64);
    if let Some(u) = num("/status/usage/nodes") {
        err = err.detail(format!("Current: {u} nodes in use"));
    }
    err = err.detail(format!(
        "Requested: {} additional nodes",
        workload::node_count(alloc)
    ));
    if let Some(l) = num("/spec/quota/maxNodes") {
        err = err.detail(format!("Limit: {l} nodes"));
    }
    err.hint(hint)
}

/// The client-side check: more nodes than the hard quota allows at all.
fn over_quota(alloc: &Value, tenant_name: &str, tenant: &Value) -> Option<CliError> {
    let limit = tenant.pointer("/spec/quota/maxNodes")?.as_u64()?;
    if min_nodes(alloc) <= limit {
        return None;
    }
    Some(quota_error(
        format!("request exceeds tenant \"{tenant_name}\" max_nodes quota"),
        alloc,
        Some(tenant),
        format!(
            "Request at most {limit} nodes (--nodes={limit}), or ask your tenant admin for a \
             quota increase."
        ),
    ))
}

/// A rejected submission, with the tenant's quota numbers when the server mentions quotas.
fn rejected(alloc: &Value, tenant: Option<&Value>, e: ClientError) -> CliError {
    match &e {
        ClientError::Status { status, .. } => {
            let msg = status.message_or_reason();
            let mut err = from_status("allocation rejected".into(), status);
            if status.code == 422 {
                err.hint = Some(
                    "fix the options or directives that set these fields and submit again".into(),
                );
            }
            if msg.to_lowercase().contains("quota") {
                let q = quota_error(
                    msg,
                    alloc,
                    tenant,
                    "Cancel running allocations or request a quota increase from your tenant admin."
                        .into(),
                );
                err = CliError {
                    exit_code: err.exit_code,
                    ..q
                };
            }
            err
        }
        _ => CliError::from_client("submit allocation", e),
    }
}

/// Polls an allocation until it reaches a terminal phase; `on_change` sees every new phase.
/// Returns the final object, or `None` when interrupted. The first looks come quickly (a
/// step whose output just ended is usually over within milliseconds), then once a second.
pub async fn wait_terminal(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    shutdown: &mut Shutdown,
    on_change: &mut dyn FnMut(&Value) -> std::io::Result<()>,
) -> Result<Option<Value>, CliError> {
    let path = workload::object("allocations", Some(ns), name);
    let mut last = String::new();
    let mut failures = 0;
    let mut pause = Duration::from_millis(25);
    loop {
        match ctx.client.get(&path).await {
            Ok(a) => {
                failures = 0;
                let p = phase(&a).to_string();
                if p != last {
                    on_change(&a)?;
                    last = p.clone();
                }
                if workload::is_terminal(&p) {
                    return Ok(Some(a));
                }
            }
            Err(e) if e.is_not_found() => {
                return Err(workload::not_found(
                    "allocation",
                    name,
                    Some(ns),
                    "lattice status",
                ))
            }
            Err(e) if e.is_transient() && failures < 30 => failures += 1,
            Err(e) => return Err(CliError::from_client(format!("get allocation {name:?}"), e)),
        }
        tokio::select! {
            _ = &mut *shutdown => return Ok(None),
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(1));
    }
}

/// Runs `submit`.
pub async fn run(
    ctx: &mut Ctx,
    args: &SubmitArgs,
    stdin: &mut dyn Read,
    out: &mut dyn Write,
    err: &mut dyn Write,
    mut shutdown: Shutdown,
) -> Result<i32, CliError> {
    let mut flags = args.flags.clone();
    let job = match (&args.script, args.command.is_empty()) {
        (Some(p), _) => read_script(&ctx.cwd, p, stdin)?,
        (None, false) => Job {
            script: String::new(),
            script_name: None,
        },
        (None, true) => {
            return Err(CliError::new("submit", "nothing to run")
                .hint(
                    "pass a batch script (lattice submit train.sh) or a command after `--` \
                       (lattice submit --nodes=1 -- hostname)",
                )
                .exit_code(exit::USAGE))
        }
    };
    flags.command = args.command.clone();
    flags.script_name = job.script_name.clone();
    let client_only = args.dry_run == Some(SubmitDryRun::Client);
    let t = build(
        ctx,
        flags,
        &job.script,
        args.compat_config.as_deref(),
        !client_only,
    )
    .await?;
    print_warnings(ctx, &t, err)?;
    let fmt = ctx.output_or(OutputFormat::Yaml);
    let print_obj = |out: &mut dyn Write, v: &Value| -> std::io::Result<()> {
        match fmt {
            OutputFormat::Json => out.write_all(to_json(v).as_bytes()),
            _ => out.write_all(to_yaml(v).as_bytes()),
        }
    };
    match args.dry_run {
        Some(SubmitDryRun::Client) => {
            print_obj(out, &t.allocation)?;
            return Ok(0);
        }
        Some(SubmitDryRun::Server) => {
            let v = post(ctx, &t.allocation, true).await?;
            print_obj(out, &v)?;
            return Ok(0);
        }
        None => {}
    }
    if t.client.test_only {
        print_obj(out, &t.allocation)?;
        return Ok(0);
    }
    let ns = s(&t.allocation, "/metadata/namespace")
        .unwrap_or(&ctx.tenant)
        .to_string();
    let created = post(ctx, &t.allocation, false).await?;
    let name = workload::name(&created).to_string();
    match fmt {
        OutputFormat::Json if ctx.output.is_some() => {
            out.write_all(to_json(&created).as_bytes())?
        }
        OutputFormat::Yaml if ctx.output.is_some() => {
            out.write_all(to_yaml(&created).as_bytes())?
        }
        _ if args.parsable || t.client.parsable || ctx.quiet => writeln!(out, "{name}")?,
        _ => writeln!(out, "Submitted allocation {name}")?,
    }
    out.flush()?;
    if args.wait || t.client.wait {
        return wait_and_report(ctx, &ns, &name, &mut shutdown, err, Download::IfHinted).await;
    }
    Ok(0)
}

/// Whether [`wait_and_report`] writes the output to the submission's `--output` /
/// `--error` files once the allocation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Download {
    /// Only when the submission named a file (`lattice submit --wait`).
    IfHinted,
    /// Always, `slurm-%j.out` by default (`sbatch --wait`, as Slurm leaves that file).
    Always,
}

/// Waits for the allocation to end; 0 when it Completed.
pub async fn wait_and_report(
    ctx: &Ctx,
    ns: &str,
    name: &str,
    shutdown: &mut Shutdown,
    err: &mut dyn Write,
    download: Download,
) -> Result<i32, CliError> {
    let quiet = ctx.quiet;
    let mut show = |a: &Value| -> std::io::Result<()> {
        if !quiet {
            writeln!(err, "Allocation {} is {}", workload::name(a), phase(a))?;
        }
        Ok(())
    };
    let Some(a) = wait_terminal(ctx, ns, name, shutdown, &mut show).await? else {
        return Ok(130);
    };
    let hinted = [
        crate::cmd::logs::OUTPUT_ANNOTATION,
        crate::cmd::logs::ERROR_ANNOTATION,
    ]
    .iter()
    .any(|k| {
        a.pointer(&format!("/metadata/annotations/{}", k.replace('/', "~1")))
            .is_some()
    });
    if download == Download::Always || hinted {
        match crate::cmd::logs::download(ctx, ns, &a, shutdown).await {
            Ok(lines) => {
                if ctx.verbose {
                    for l in lines {
                        writeln!(err, "{l}")?;
                    }
                }
            }
            Err(e) if !quiet => writeln!(err, "warning: output not written to a file: {e}")?,
            Err(_) => {}
        }
    }
    Ok(if phase(&a) == "Completed" {
        0
    } else {
        exit::ERROR
    })
}
