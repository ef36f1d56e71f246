//! `translate`: script + flags + site mapping → Allocation manifest + warnings.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::{json, Map, Value};

use crate::config::{CompatConfig, PartitionMatch};
use crate::constraints;
use crate::directives::{
    parse_args, scan_script, Dialect, ParsedOption, BURST_BUFFER_REASON, IGNORE_PBS_PREFIXES,
};
use crate::error::{Source, SubmitError, ValueError, Warning};
use crate::flags::SubmitFlags;
use crate::names::{is_dns1123_label, label_from};
use crate::values::*;

/// Annotation keys written by the translator.
pub mod annotations {
    /// `"first"`: the script runs on the first node only, as Slurm runs a batch script
    /// (set for submissions with `#SBATCH` directives or sbatch options).
    pub use lattice_apis::wellknown::BATCH_HOST_ANNOTATION as BATCH_HOST;
    /// Slurm `--comment`.
    pub use lattice_apis::wellknown::COMMENT_ANNOTATION as COMMENT;
    /// The constraint as written, when it could only be approximated.
    pub use lattice_apis::wellknown::CONSTRAINT_ANNOTATION as CONSTRAINT;
    /// The dependency option as written.
    pub use lattice_apis::wellknown::DEPENDENCY_ANNOTATION as DEPENDENCY;
    /// Slurm `--error` (download path hint).
    pub use lattice_apis::wellknown::ERROR_ANNOTATION as ERROR;
    /// Label: which front-end produced the manifest (`sbatch` or `lattice`).
    pub use lattice_apis::wellknown::FRONTEND_ANNOTATION as FRONTEND;
    /// Task count (`--ntasks`), used by launchers and `SLURM_NTASKS`.
    pub use lattice_apis::wellknown::NTASKS_ANNOTATION as NTASKS;
    /// `--ntasks-per-node`, used by launchers.
    pub use lattice_apis::wellknown::NTASKS_PER_NODE_ANNOTATION as NTASKS_PER_NODE;
    /// Slurm `--output` (download path hint for `lattice logs`).
    pub use lattice_apis::wellknown::OUTPUT_ANNOTATION as OUTPUT;
    /// Site config `set_slurm_env: true`: agents also set `SLURM_*`.
    pub use lattice_apis::wellknown::SET_SLURM_ENV_ANNOTATION as SET_SLURM_ENV;
    /// The Slurm account as written.
    pub use lattice_apis::wellknown::SLURM_ACCOUNT_ANNOTATION as ACCOUNT;
    /// The Slurm partition as written.
    pub use lattice_apis::wellknown::SLURM_PARTITION_ANNOTATION as PARTITION;
    /// The Slurm QOS as written.
    pub use lattice_apis::wellknown::SLURM_QOS_ANNOTATION as QOS;
    /// Directory the submission was made from (`SLURM_SUBMIT_DIR`).
    pub use lattice_apis::wellknown::SUBMIT_DIR_ANNOTATION as SUBMIT_DIR;
}

/// sbatch client-side options found in the script or on the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ClientOptions {
    /// `--parsable`: print only the id.
    pub parsable: bool,
    /// `--wait`: wait for the allocation to finish.
    pub wait: bool,
    /// `--test-only`: validate only (`--dry-run`).
    pub test_only: bool,
    /// `--quiet`.
    pub quiet: bool,
    /// `--hold`: was requested (not supported; warned).
    pub hold: bool,
}

/// The result of [`translate`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Translation {
    /// The Allocation manifest (`lattice.dev/v1alpha1`).
    pub allocation: Value,
    /// One warning per ignored / approximated option: script lines in order, then the
    /// command line's and the site mapping's.
    pub warnings: Vec<Warning>,
    /// sbatch client-side options (`--parsable`, `--wait`, `--test-only`).
    pub client: ClientOptions,
}

#[derive(Debug, Clone)]
enum Target {
    Partition(String, Source),
    VCluster(String, Source),
}

#[derive(Debug, Clone)]
enum Class {
    Qos(String, Source),
    Explicit(i32),
}

#[derive(Default)]
struct State {
    /// Where each option was last set: name -> (source, as written).
    origin: BTreeMap<String, (Source, String)>,
    nodes: Option<NodeCount>,
    /// `--nodelist`: the node names, where and as written.
    nodelist: Option<(Vec<String>, Source, String)>,
    ntasks: Option<(u32, Source, String)>,
    ntasks_per_node: Option<u32>,
    walltime: Option<(Walltime, Source, String)>,
    target: Option<Target>,
    tenant: Option<String>,
    account: Option<String>,
    project: Option<String>,
    name: Option<String>,
    job_name: Option<String>,
    output: Option<String>,
    error: Option<String>,
    constraint: Option<(String, Source, Dialect)>,
    gres: Option<(GresSpec, Source)>,
    gpus_total: Option<(u32, Option<String>, Source)>,
    class: Option<Class>,
    array: Option<ArraySpec>,
    deps: Option<(DependencySpec, Source)>,
    /// `st.deps` came from `lattice submit` flags (which add up).
    deps_from_flags: bool,
    /// Slurm `--begin` as written (parsed in `finish`, against the submission time).
    begin: Option<(String, Source)>,
    uenv: Option<String>,
    view: Option<String>,
    view_source: Option<(Source, String)>,
    tools_uenv: Option<String>,
    image: Option<String>,
    chdir: Option<(String, Source)>,
    env: BTreeMap<String, String>,
    data_mounts: Vec<DataMountSpec>,
    expose: Vec<ExposeSpec>,
    service: bool,
    reactive: bool,
    min_nodes: Option<u32>,
    max_nodes: Option<u32>,
    scale_metric: Option<String>,
    scale_target: Option<Value>,
    checkpoint: Option<String>,
    checkpoint_port: Option<u32>,
    no_preempt: bool,
    sensitive: bool,
    network_domain: Option<String>,
    /// `--requeue` (true) or `--no-requeue` (false), the last one given: where and as written.
    requeue: Option<(bool, Source, String)>,
    comment: Option<String>,
    client: ClientOptions,
    sbatch_used: bool,
}

/// Why an sbatch option is ignored, in the seed's wording where it has one.
/// `None` for options that are translated.
pub fn unsupported_reason(slurm_option: &str) -> Option<&'static str> {
    Some(match slurm_option {
        "mem" | "mem-per-cpu" | "mem-per-gpu" => {
            "Lattice uses full-node scheduling, memory is not constrainable"
        }
        "mail-type" | "mail-user" => "use `lattice watch` for event notifications",
        "cpus-per-task" | "cpus-per-gpu" | "mincpus" | "cores-per-socket" | "sockets-per-node"
        | "threads-per-core" | "ntasks-per-core" | "ntasks-per-socket" | "ntasks-per-gpu"
        | "extra-node-info" | "core-spec" | "thread-spec" | "hint" | "distribution"
        | "mem-bind" | "cpu-freq" | "gpu-bind" | "gpu-freq" | "gpus-per-socket"
        | "gpus-per-task" | "tres-bind" | "tres-per-task" | "overcommit" | "oversubscribe"
        | "spread-job" | "use-min-nodes" | "tmp" | "contiguous" => {
            "Lattice uses full-node scheduling; every allocated node is entirely yours"
        }
        "exclude" | "nodefile" | "switches" => {
            "Lattice places allocations itself, packing them into dragonfly groups"
        }
        "licenses" => "not applicable; use --constraint features",
        "clusters" | "cluster-constraint" => {
            "multi-cluster submission is handled by federation (lattice submit --site)"
        }
        "reservation" => "reservations are not supported; sensitive claims provide dedicated nodes",
        "bb" | "bbf" => BURST_BUFFER_REASON,
        "deadline" | "time-min" | "priority" | "nice" | "hold" => {
            "not supported by the Lattice scheduler"
        }
        "signal" => "use --checkpoint=signal to receive SIGUSR1 before preemption",
        "acctg-freq" | "profile" => {
            "telemetry is always collected; use `lattice top` and `lattice watch`"
        }
        "network" => "Slingshot VNIs are managed by Lattice; use --network-domain to share one",
        "kill-on-invalid-dep" => {
            "Lattice cancels allocations whose dependencies can no longer be met"
        }
        "open-mode" | "input" => "logs always go to the persistent store; use `lattice logs`",
        "uid" | "gid" => "allocations always run as the submitting user",
        "get-user-env" | "propagate" | "export-file" => {
            "the submitting shell's environment and limits are not propagated; use --env"
        }
        "wrap" => "--wrap is only meaningful on the sbatch command line",
        "help" | "usage" | "version" => "not meaningful in a batch script",
        "verbose" => "sbatch's own logging; it does not change the job",
        "wckey" | "mcs-label" | "power" | "reboot" | "delay-boot" | "container"
        | "container-id" | "prefer" | "extra" | "segment" | "resv-ports" | "gres-flags"
        | "batch" | "wait-all-nodes" | "no-kill" => "not supported by Lattice",
        _ => return None,
    })
}

fn bad(opt: &ParsedOption, e: ValueError) -> SubmitError {
    SubmitError::invalid(
        &format!("--{}", opt.name),
        opt.value.as_deref().unwrap_or(""),
        &opt.source,
        e,
    )
}

fn val(opt: &ParsedOption) -> &str {
    opt.value.as_deref().unwrap_or("")
}

fn apply(st: &mut State, opt: &ParsedOption, warns: &mut Vec<Warning>) -> Result<(), SubmitError> {
    let v = val(opt);
    st.origin
        .insert(opt.name.clone(), (opt.source.clone(), opt.written.clone()));
    let text = |s: &str| -> Result<String, SubmitError> {
        let t = s.trim();
        if t.is_empty() {
            return Err(bad(
                opt,
                ValueError::new("the value is empty", format!("write --{}=VALUE", opt.name)),
            ));
        }
        Ok(t.to_string())
    };
    if opt.dialect == Dialect::Slurm {
        st.sbatch_used = true;
        if let Some(reason) = unsupported_reason(&opt.name) {
            if opt.name == "hold" {
                st.client.hold = true;
            }
            warns.push(Warning::ignored(&opt.source, &opt.written, reason));
            return Ok(());
        }
    }
    match (opt.dialect, opt.name.as_str()) {
        (_, "nodes") => st.nodes = Some(parse_nodes(v).map_err(|e| bad(opt, e))?),
        (_, "nodelist") => {
            if opt.dialect == Dialect::Slurm && v.contains('/') {
                // sbatch reads the node names from a file when the value has a '/'.
                return Err(bad(
                    opt,
                    ValueError::new(
                        "a value with '/' names a file for sbatch, which reads the node names from it; Lattice does not read node-list files",
                        "write the node names in Slurm hostlist syntax (e.g. nid[001-004]) instead, or pass them on the command line: --nodelist=\"$(paste -sd, FILE)\"",
                    ),
                ));
            }
            // The same hostlist expansion and checks as `lattice submit --nodelist`.
            st.nodelist = Some((
                parse_nodelist(v).map_err(|e| bad(opt, e))?,
                opt.source.clone(),
                opt.written.clone(),
            ))
        }
        (Dialect::Slurm, "ntasks") => {
            st.ntasks = Some((
                parse_count(v, "task count").map_err(|e| bad(opt, e))?,
                opt.source.clone(),
                opt.written.clone(),
            ))
        }
        (Dialect::Slurm, "ntasks-per-node") => {
            st.ntasks_per_node = Some(parse_count(v, "tasks per node").map_err(|e| bad(opt, e))?)
        }
        (Dialect::Slurm, "time") | (Dialect::Lattice, "walltime") => {
            st.walltime = Some((
                parse_walltime(v).map_err(|e| bad(opt, e))?,
                opt.source.clone(),
                opt.written.clone(),
            ))
        }
        (Dialect::Slurm, "partition") => {
            st.target = Some(Target::Partition(text(v)?, opt.source.clone()))
        }
        (Dialect::Lattice, "vcluster") => {
            st.target = Some(Target::VCluster(text(v)?, opt.source.clone()))
        }
        (Dialect::Slurm, "account") => {
            st.account = Some(text(v)?);
            st.tenant = None;
        }
        (Dialect::Lattice, "tenant") => {
            st.tenant = Some(text(v)?);
            st.account = None;
        }
        (Dialect::Lattice, "project") => st.project = Some(text(v)?),
        (Dialect::Slurm, "job-name") => {
            st.job_name = Some(text(v)?);
            st.name = None;
        }
        (Dialect::Lattice, "name") => {
            st.name = Some(text(v)?);
            st.job_name = None;
        }
        (_, "output") => st.output = Some(text(v)?),
        (_, "error") => st.error = Some(text(v)?),
        (_, "constraint") => {
            parse_constraint(v).map_err(|e| bad(opt, e))?;
            st.constraint = Some((v.trim().to_string(), opt.source.clone(), opt.dialect));
        }
        (Dialect::Slurm, "gres") => {
            let g = parse_gres(v).map_err(|e| bad(opt, e))?;
            for other in &g.other {
                warns.push(Warning::ignored(&opt.source, &format!("--gres={other}"), "GRES other than GPUs are not needed with full-node scheduling; use --constraint features"));
            }
            st.gres = Some((g, opt.source.clone()));
            st.gpus_total = None;
        }
        (Dialect::Slurm, "gpus-per-node") => {
            st.gres = Some((
                parse_gpus_per_node(v).map_err(|e| bad(opt, e))?,
                opt.source.clone(),
            ));
            st.gpus_total = None;
        }
        (Dialect::Slurm, "gpus") => {
            let g = parse_gpus_per_node(v).map_err(|e| bad(opt, e))?;
            st.gpus_total = Some((g.gpu_count.unwrap_or(1), g.gpu_type, opt.source.clone()));
            st.gres = None;
        }
        (Dialect::Slurm, "qos") => st.class = Some(Class::Qos(text(v)?, opt.source.clone())),
        (Dialect::Lattice, "preemption-class") => {
            st.class = Some(Class::Explicit(
                parse_preemption_class(v).map_err(|e| bad(opt, e))?,
            ))
        }
        (Dialect::Slurm, "array") | (Dialect::Lattice, "task-group") => {
            st.array = Some(parse_array(v).map_err(|e| bad(opt, e))?)
        }
        (Dialect::Slurm, "dependency") => {
            st.deps = Some((
                parse_slurm_dependency(v).map_err(|e| bad(opt, e))?,
                opt.source.clone(),
            ))
        }
        (Dialect::Slurm, "begin") => st.begin = Some((text(v)?, opt.source.clone())),
        (Dialect::Lattice, "depends-on" | "dependency") => {
            let d = if opt.name == "dependency" {
                parse_slurm_dependency(v)
            } else {
                parse_depends_on(v)
            }
            .map_err(|e| bad(opt, e))?;
            // `lattice submit --depends-on ... --dependency ...` (or several --dependency
            // flags): the command line's dependencies add up; they replace the script's.
            match &mut st.deps {
                Some((prev, src)) if *src == opt.source && st.deps_from_flags => {
                    prev.merge(d).map_err(|e| bad(opt, e))?
                }
                _ => st.deps = Some((d, opt.source.clone())),
            }
            st.deps_from_flags = true;
        }
        (Dialect::Slurm, "exclusive") => {
            // Lattice always gives an allocation whole nodes of its own: at least what
            // `--exclusive`, `=user` and `=mcs` ask for. Other forms (`=topo`: a whole
            // topology segment) are not honoured.
            match opt.value.as_deref().map(str::trim) {
                None | Some("" | "user" | "mcs") => {}
                Some(_) => warns.push(Warning::ignored(
                    &opt.source,
                    &opt.written,
                    "Lattice allocates whole nodes but does not reserve topology segments; use --constraint=topology=tight to pack into few groups",
                )),
            }
        }
        (_, "uenv") => st.uenv = Some(text(v)?),
        (_, "view") => {
            st.view = Some(text(v)?);
            st.view_source = Some((opt.source.clone(), opt.written.clone()));
        }
        (Dialect::Lattice, "tools-uenv") => st.tools_uenv = Some(text(v)?),
        (Dialect::Lattice, "image") => st.image = Some(text(v)?),
        (Dialect::Slurm, "container-image") => {
            // pyxis/enroot write `[USER@][REGISTRY#]IMAGE[:TAG]`.
            let raw = text(v)?;
            let image = pyxis_image(&raw);
            if image != raw {
                warns.push(Warning::note(
                    &opt.source,
                    &opt.written,
                    format!("the pyxis image {raw} runs as the OCI image {image}"),
                ));
            }
            st.image = Some(image);
        }
        (Dialect::Slurm, "chdir") => st.chdir = Some((text(v)?, opt.source.clone())),
        (Dialect::Slurm, "export") => {
            let mut names = Vec::new();
            let mut all = false;
            for item in v.split(',') {
                let item = item.trim();
                // NONE / NIL: nothing is forwarded, as Lattice always does.
                if item.is_empty()
                    || item.eq_ignore_ascii_case("NONE")
                    || item.eq_ignore_ascii_case("NIL")
                {
                    continue;
                }
                if item.eq_ignore_ascii_case("ALL") {
                    all = true;
                    continue;
                }
                if item.contains('=') {
                    let (k, val) = parse_env_pair(item).map_err(|e| bad(opt, e))?;
                    st.env.insert(k, val);
                } else {
                    names.push(item.to_string());
                }
            }
            if all {
                warns.push(Warning::note(&opt.source, &opt.written, "sbatch would copy the submitting shell's whole environment (ALL); Lattice does not forward the submit environment, set what the job needs with --env KEY=VALUE"));
            } else if !names.is_empty() {
                warns.push(Warning::note(&opt.source, &opt.written, format!("{} would be copied from the submitting shell by sbatch; Lattice does not forward the submit environment, set them with --env KEY=VALUE", names.join(", "))));
            }
        }
        (Lattice, "env") => {
            let (k, val) = parse_env_pair(v).map_err(|e| bad(opt, e))?;
            st.env.insert(k, val);
        }
        (Dialect::Slurm, "requeue" | "no-requeue") => {
            st.requeue = Some((
                opt.name == "requeue",
                opt.source.clone(),
                opt.written.clone(),
            ))
        }
        (Dialect::Slurm, "comment") => st.comment = Some(v.to_string()),
        (Dialect::Slurm, "parsable") => st.client.parsable = true,
        (Dialect::Slurm, "wait") => st.client.wait = true,
        (Dialect::Slurm, "test-only") => st.client.test_only = true,
        (Dialect::Slurm, "quiet") => st.client.quiet = true,
        // Honoured by `translate`, which drops the #PBS / #BSUB warnings.
        (Dialect::Slurm, "ignore-pbs") => {}
        (Lattice, "data-mount") => st
            .data_mounts
            .push(parse_data_mount(v).map_err(|e| bad(opt, e))?),
        (Lattice, "expose") => st.expose.push(parse_expose(v).map_err(|e| bad(opt, e))?),
        (Lattice, "service") => st.service = true,
        (Lattice, "reactive") => st.reactive = true,
        (Lattice, "min-nodes") => {
            st.min_nodes = Some(parse_count(v, "node count").map_err(|e| bad(opt, e))?)
        }
        (Lattice, "max-nodes") => {
            st.max_nodes = Some(parse_count(v, "node count").map_err(|e| bad(opt, e))?)
        }
        (Lattice, "scale-metric") => st.scale_metric = Some(text(v)?),
        (Lattice, "scale-target") => {
            st.scale_target = Some(parse_scale_target(v).map_err(|e| bad(opt, e))?)
        }
        (Lattice, "checkpoint") => {
            st.checkpoint = Some(parse_checkpoint(v).map_err(|e| bad(opt, e))?)
        }
        (Lattice, "checkpoint-port") => {
            let p = parse_count(v, "port").map_err(|e| bad(opt, e))?;
            if p > 65535 {
                return Err(bad(
                    opt,
                    ValueError::new(
                        format!("{p} is not a port"),
                        "use a port between 1 and 65535, e.g. 9999",
                    ),
                ));
            }
            st.checkpoint_port = Some(p);
        }
        (Lattice, "no-preempt") => st.no_preempt = true,
        (Lattice, "network-domain") => st.network_domain = Some(text(v)?),
        (Lattice, "sensitive") => st.sensitive = true,
        _ => warns.push(Warning::ignored(
            &opt.source,
            &opt.written,
            "unknown option",
        )),
    }
    Ok(())
}

use Dialect::Lattice;

/// DNS-1123 label of at most `max` characters built from a free-form name (for
/// `generateName` and hints): [`label_from`], or `job` when nothing is left of it.
pub fn sanitize_name(s: &str, max: usize) -> String {
    let mut out = label_from(s).unwrap_or_default();
    out.truncate(max);
    while out.ends_with('-') {
        out.pop();
    }
    if out.is_empty() {
        "job".to_string()
    } else {
        out
    }
}

/// The tenant of a Slurm account: the site's mapping, else the account's own name, made
/// a valid tenant name (with a warning) when it is not one.
fn account_tenant(
    st: &State,
    account: &str,
    compat: &CompatConfig,
    warns: &mut Vec<Warning>,
) -> Result<String, SubmitError> {
    if let Some(t) = compat.accounts.get(account) {
        // `CompatConfig::from_yaml` checks the mapping; a config built in code may not.
        if !is_dns1123_label(t) {
            return Err(SubmitError::Config {
                message: format!("accounts.{account}: {t:?} is not a valid tenant name"),
                hint: format!(
                    "write e.g. {:?} (lowercase letters, digits and '-')",
                    sanitize_name(t, 63)
                ),
            });
        }
        return Ok(t.clone());
    }
    if is_dns1123_label(account) {
        return Ok(account.to_string());
    }
    let Some(t) = label_from(account) else {
        return Err(reject(
            st,
            &["account"],
            account,
            "is not a valid tenant name and has no letter or digit to make one of".into(),
            "map the account to a tenant under `accounts:` in lattice-compat.yaml, or pass --tenant".into(),
        ));
    };
    let src = origin_source(st, "account");
    warns.push(Warning::note(
        &src,
        &format!("--account={account}"),
        format!("account {account:?} is not a valid tenant name; using tenant {t:?} (map it under accounts: in lattice-compat.yaml to choose another)"),
    ));
    Ok(t)
}

/// The vCluster of a Slurm `--partition` (a list: the first the site knows).
fn partition_vcluster(
    st: &State,
    partitions: &str,
    src: &Source,
    compat: &CompatConfig,
    warns: &mut Vec<Warning>,
) -> Result<String, SubmitError> {
    let written = format!("--partition={partitions}");
    let parts: Vec<&str> = partitions
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect();
    let Some((part, found)) = parts
        .iter()
        .find_map(|part| compat.map_partition(part).map(|m| (*part, m)))
    else {
        return Err(SubmitError::UnknownVCluster {
            name: partitions.to_string(),
            available: compat.available_vclusters(),
            source_: src.clone(),
        });
    };
    let v = found.vcluster().to_string();
    if !is_dns1123_label(&v) {
        return Err(match found {
            PartitionMatch::Mapped(_) => SubmitError::Config {
                message: format!("partitions.{part}: {v:?} is not a valid vCluster name"),
                hint: format!(
                    "write e.g. {:?} (lowercase letters, digits and '-')",
                    sanitize_name(&v, 63)
                ),
            },
            _ => reject(
                st,
                &["partition"],
                part,
                "is not a valid vCluster name and has no letter or digit to make one of".into(),
                "map the partition under `partitions:` in lattice-compat.yaml, or pass --vcluster=NAME".into(),
            ),
        });
    }
    if parts.len() > 1 {
        warns.push(Warning::note(
            src,
            &written,
            format!("several partitions were listed; using vCluster \"{v}\""),
        ));
    }
    if let PartitionMatch::Normalized(_) = found {
        warns.push(Warning::note(
            src,
            &written,
            format!("partition {part:?} is not a valid vCluster name; using vCluster {v:?} (map it under partitions: in lattice-compat.yaml to choose another)"),
        ));
    }
    Ok(v)
}

/// Where an option was last set (the command line if it was not).
fn origin_source(st: &State, name: &str) -> Source {
    st.origin
        .get(name)
        .map(|(s, _)| s.clone())
        .unwrap_or(Source::CommandLine)
}

/// An error for a value the API server would reject, located where the option was written.
/// A pyxis/enroot image reference (`[USER@][REGISTRY#]IMAGE[:TAG]`) as an OCI one.
fn pyxis_image(raw: &str) -> String {
    let rest = match raw.split_once('@') {
        // `user@registry#image`: a user for credentials (Lattice pulls anonymously);
        // `image@sha256:...` is a digest and stays.
        Some((_, r)) if raw.contains('#') && !raw.starts_with("sha256:") => r,
        _ => raw,
    };
    rest.replacen('#', "/", 1)
}

fn reject(st: &State, names: &[&str], value: &str, message: String, hint: String) -> SubmitError {
    let (source, option) = names
        .iter()
        .find_map(|n| {
            st.origin
                .get(*n)
                .map(|(s, _)| (s.clone(), format!("--{n}")))
        })
        .unwrap_or((
            Source::CommandLine,
            format!("--{}", names.first().copied().unwrap_or("")),
        ));
    SubmitError::InvalidValue {
        option,
        value: value.to_string(),
        source_: source,
        message,
        hint,
    }
}

fn is_dns_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

/// Translate a batch script (its `#SBATCH`/`#LATTICE` directives), the
/// command-line flags (which win) and the site mapping into an Allocation
/// manifest plus warnings.
pub fn translate(
    script: &str,
    cli_overrides: &SubmitFlags,
    compat: &CompatConfig,
) -> Result<Translation, SubmitError> {
    let mut warns = Vec::new();
    let mut st = State::default();
    let mut options: Vec<ParsedOption> = Vec::new();
    if !script.trim().is_empty() {
        let d = scan_script(script)?;
        options.extend(d.options);
        warns.extend(d.warnings);
    }
    if !cli_overrides.sbatch_args.is_empty() {
        let (o, w) = parse_args(
            &cli_overrides.sbatch_args,
            Dialect::Slurm,
            &Source::CommandLine,
        )?;
        options.extend(o);
        warns.extend(w);
    }
    for (name, value) in cli_overrides.to_pairs() {
        let written = match &value {
            Some(v) => format!("--{name}={v}"),
            None => format!("--{name}"),
        };
        options.push(ParsedOption {
            name: name.to_string(),
            value,
            written,
            source: Source::CommandLine,
            dialect: Lattice,
        });
    }
    for opt in &options {
        apply(&mut st, opt, &mut warns)?;
    }
    // sbatch reads #PBS / #BSUB directives unless told not to; Lattice never does, and
    // with `--ignore-pbs` that is what was asked for.
    if options
        .iter()
        .any(|o| o.dialect == Dialect::Slurm && o.name == "ignore-pbs")
    {
        warns.retain(|w| {
            !(matches!(w.source, Source::Script { .. })
                && IGNORE_PBS_PREFIXES.contains(&w.option.as_str()))
        });
    }
    finish(st, script, cli_overrides, compat, warns)
}

fn finish(
    mut st: State,
    script: &str,
    flags: &SubmitFlags,
    compat: &CompatConfig,
    mut warns: Vec<Warning>,
) -> Result<Translation, SubmitError> {
    let mut meta = Map::new();
    let mut spec = Map::new();
    let mut ann: BTreeMap<String, String> = BTreeMap::new();
    let cl = Source::CommandLine;

    // --- what to run
    if !script.trim().is_empty() {
        if !flags.command.is_empty() {
            return Err(SubmitError::Conflict {
                message: "both a script and a command after `--` were given".into(),
                hint: "pass either a script file or `-- CMD ARGS...`".into(),
            });
        }
        spec.insert("script".into(), json!(script));
    } else if let Some((prog, args)) = flags.command.split_first() {
        spec.insert("entrypoint".into(), json!(prog));
        if !args.is_empty() {
            spec.insert("args".into(), json!(args));
        }
    } else {
        return Err(SubmitError::NothingToRun {
            message: "the script is empty and no command was given".into(),
        });
    }

    // --- identity
    let display_name = st.name.clone().or_else(|| st.job_name.clone()).or_else(|| {
        flags
            .script_name
            .as_ref()
            .map(|p| p.rsplit('/').next().unwrap_or(p).to_string())
    });
    match (&st.name, &display_name) {
        (Some(n), _) => {
            if !is_dns_name(n) {
                return Err(SubmitError::InvalidValue {
                    option: "--name".into(),
                    value: n.clone(),
                    source_: cl.clone(),
                    message: "allocation names must be lowercase letters, digits, '-' and '.', starting and ending with a letter or digit".into(),
                    hint: format!("use e.g. \"{}\"", sanitize_name(n, 63)),
                });
            }
            meta.insert("name".into(), json!(n));
        }
        (None, Some(d)) => {
            meta.insert(
                "generateName".into(),
                json!(format!("{}-", sanitize_name(d, 50))),
            );
        }
        (None, None) => {
            meta.insert("generateName".into(), json!("sbatch-"));
        }
    }
    // `--tenant` is Lattice's own flag: a valid tenant name as written, or an error. A
    // Slurm account is the site's to map; unmapped, it is made a valid name if need be.
    let tenant = match (&st.tenant, &st.account) {
        (Some(t), _) => {
            if !is_dns1123_label(t) {
                return Err(reject(
                    &st,
                    &["tenant"],
                    t,
                    "is not a valid tenant name (lowercase letters, digits and '-', at most 63 characters)".into(),
                    format!("tenant names are DNS labels, e.g. \"{}\"", sanitize_name(t, 63)),
                ));
            }
            Some(t.clone())
        }
        (None, Some(a)) => {
            ann.insert(annotations::ACCOUNT.into(), a.clone());
            Some(account_tenant(&st, a, compat, &mut warns)?)
        }
        (None, None) => None,
    };
    if let Some(t) = &tenant {
        meta.insert("namespace".into(), json!(t));
    }
    let mut tags = Map::new();
    if let Some(d) = &display_name {
        tags.insert(
            "name".into(),
            json!(d.chars().take(256).collect::<String>()),
        );
    }
    if let Some(p) = &st.project {
        spec.insert("project".into(), json!(p));
    }

    // --- vCluster
    // As for tenants: `--vcluster` is taken as written, a Slurm partition is the site's to
    // map and otherwise made a valid vCluster name if need be.
    let vcluster = match &st.target {
        Some(Target::VCluster(v, src)) => {
            if !is_dns1123_label(v) {
                return Err(reject(
                    &st,
                    &["vcluster"],
                    v,
                    "is not a valid vCluster name (lowercase letters, digits and '-', at most 63 characters)".into(),
                    format!("use e.g. --vcluster={}", sanitize_name(v, 63)),
                ));
            }
            // Only checked when the site lists its vClusters explicitly.
            if !compat.vclusters.is_empty() && !compat.available_vclusters().contains(v) {
                return Err(SubmitError::UnknownVCluster {
                    name: v.clone(),
                    available: compat.available_vclusters(),
                    source_: src.clone(),
                });
            }
            Some(v.clone())
        }
        Some(Target::Partition(p, src)) => {
            ann.insert(annotations::PARTITION.into(), p.clone());
            Some(partition_vcluster(&st, p, src, compat, &mut warns)?)
        }
        None => compat.default_vcluster.clone(),
    };
    if let Some(v) = vcluster {
        if !is_dns1123_label(&v) {
            return Err(SubmitError::Config {
                message: format!("default_vcluster: {v:?} is not a valid vCluster name"),
                hint: format!(
                    "write e.g. {:?} (lowercase letters, digits and '-')",
                    sanitize_name(&v, 63)
                ),
            });
        }
        spec.insert("vcluster".into(), json!(v));
    }

    // --- environment
    if st.view.is_some() && st.uenv.is_none() {
        let (src, written) = st
            .view_source
            .clone()
            .unwrap_or((cl.clone(), "--view".into()));
        warns.push(Warning::note(
            &src,
            &written,
            "a view needs a uenv (--uenv); the view was ignored",
        ));
        st.view = None;
    }
    for (name, v) in [
        ("uenv", &st.uenv),
        ("view", &st.view),
        ("tools-uenv", &st.tools_uenv),
    ] {
        if let Some(v) = v {
            if v.chars().any(char::is_whitespace) || v.len() > 512 {
                return Err(reject(
                    &st,
                    &[name],
                    v,
                    "must not contain spaces (and be at most 512 characters)".into(),
                    "write e.g. --uenv=prgenv-gnu/24.11:v1".into(),
                ));
            }
            // The API's grammar, checked here so the error names the script's line.
            let checked = match name {
                "view" => lattice_apis::syntax::uenv::check_views(v),
                _ => lattice_apis::syntax::uenv::parse(v).map(drop),
            };
            if let Err(e) = checked {
                return Err(reject(
                    &st,
                    &[name],
                    v,
                    e,
                    "write e.g. --uenv=prgenv-gnu/24.11:v1 --view=default".into(),
                ));
            }
        }
    }
    if let Some(p) = &st.project {
        if p.len() > 253 {
            return Err(reject(
                &st,
                &["project"],
                p,
                "is longer than 253 characters".into(),
                "use a shorter project name".into(),
            ));
        }
    }
    if let Some(i) = &st.image {
        if let Err(e) = lattice_apis::syntax::image::parse(i) {
            return Err(reject(
                &st,
                &["image"],
                i,
                e,
                "write e.g. --image=ubuntu:24.04 or --image=ghcr.io/acme/train:v3".into(),
            ));
        }
    }
    let mut envo = Map::new();
    for (k, v) in [
        ("uenv", &st.uenv),
        ("view", &st.view),
        ("image", &st.image),
        ("toolsUenv", &st.tools_uenv),
    ] {
        if let Some(v) = v {
            envo.insert(k.into(), json!(v));
        }
    }
    if !envo.is_empty() {
        spec.insert("environment".into(), Value::Object(envo));
    }
    // working directory
    let wd = match &st.chdir {
        Some((d, _)) if d.starts_with('/') => Some(d.clone()),
        Some((d, src)) => match &flags.submit_dir {
            Some(base) => Some(format!(
                "{}/{}",
                base.trim_end_matches('/'),
                d.trim_start_matches("./")
            )),
            None => {
                warns.push(Warning::note(
                    src,
                    &format!("--chdir={d}"),
                    "a relative directory needs the submit directory; ignored",
                ));
                None
            }
        },
        None => flags.submit_dir.clone().filter(|d| d.starts_with('/')),
    };
    if let Some(w) = wd {
        spec.insert("workingDir".into(), json!(w));
    }
    if let Some(d) = &flags.submit_dir {
        ann.insert(annotations::SUBMIT_DIR.into(), d.clone());
    }
    // A Slurm batch script runs once, on the first node (the others hold the allocation
    // for its `srun` steps): not once per node as a Lattice entrypoint does.
    if st.sbatch_used {
        ann.insert(annotations::BATCH_HOST.into(), "first".into());
    }
    if !st.env.is_empty() {
        spec.insert("env".into(), json!(st.env));
    }

    // --- lifecycle
    // `#SBATCH -w a,b (line 3 (#SBATCH))` / `--nodelist=a,b`: the nodelist as quoted in errors.
    let nodelist_written = st.nodelist.as_ref().map(|(_, src, w)| match src.line() {
        Some(_) => format!("{}{w} ({src})", src.prefix()),
        None => w.clone(),
    });
    if let Some(written) = &nodelist_written {
        if st.reactive {
            return Err(SubmitError::Conflict {
                message: format!("{written} and --reactive were both given"),
                hint: "a reactive service scales over nodes the scheduler picks; drop one".into(),
            });
        }
        if st.array.is_some() {
            return Err(SubmitError::Conflict {
                message: format!(
                    "{written} and a task group (--array / --task-group) were both given"
                ),
                hint: "every task would claim the same nodes; submit one allocation per claim"
                    .into(),
            });
        }
    }
    if st.service && st.reactive {
        return Err(SubmitError::Conflict {
            message: "--service and --reactive were both given".into(),
            hint: "--reactive is an autoscaled service; keep one".into(),
        });
    }
    let mut life = Map::new();
    if st.reactive {
        life.insert("type".into(), json!("reactive"));
        let (min, max, metric, target) = match (st.min_nodes, st.max_nodes, &st.scale_metric, &st.scale_target) {
            (Some(a), Some(b), Some(m), Some(t)) => (a, b, m.clone(), t.clone()),
            _ => {
                return Err(SubmitError::Conflict {
                    message: "--reactive needs --min-nodes, --max-nodes, --scale-metric and --scale-target".into(),
                    hint: "e.g. --reactive --min-nodes=1 --max-nodes=8 --scale-metric=gpu_utilization --scale-target=0.8".into(),
                })
            }
        };
        if min > max {
            return Err(SubmitError::Conflict {
                message: format!("--min-nodes={min} is greater than --max-nodes={max}"),
                hint: "swap them or raise --max-nodes".into(),
            });
        }
        life.insert(
            "scalePolicy".into(),
            json!({"minNodes": min, "maxNodes": max, "metric": metric, "target": target}),
        );
        if st.nodes.is_none() {
            st.nodes = Some(if min == max {
                NodeCount::Exact(min)
            } else {
                NodeCount::Range { min, max }
            });
        }
    } else {
        if st.service {
            life.insert("type".into(), json!("unbounded"));
        }
        if st.min_nodes.is_some()
            || st.max_nodes.is_some()
            || st.scale_metric.is_some()
            || st.scale_target.is_some()
        {
            warns.push(Warning::note(&cl, "", "--min-nodes/--max-nodes/--scale-metric/--scale-target only apply with --reactive; ignored"));
        }
    }
    if let Some((w, src, written)) = &st.walltime {
        match w.to_hms() {
            Some(h) => {
                life.insert("walltime".into(), json!(h));
            }
            None => warns.push(Warning::note(
                src,
                written,
                "no time limit requested; the vCluster's default walltime applies",
            )),
        }
    }
    if st.array.is_some() && (st.service || st.reactive) {
        return Err(SubmitError::Conflict {
            message: "a task group (--array / --task-group) cannot be a service".into(),
            hint: "drop --service/--reactive, or the array".into(),
        });
    }
    if !life.is_empty() {
        spec.insert("lifecycle".into(), Value::Object(life));
    }

    // --- resources
    let mut resources = Map::new();
    if let (Some((names, src, _)), Some(written)) = (&st.nodelist, &nodelist_written) {
        let listed = names.len();
        let exactly = if matches!(src, Source::Sbatch { .. }) {
            " (Lattice claims exactly the listed nodes; it does not add others as sbatch may)"
        } else {
            ""
        };
        let given = st
            .origin
            .get("nodes")
            .map(|(src, w)| format!("{}{w} ({src})", src.prefix()))
            .unwrap_or_else(|| "--nodes".into());
        match st.nodes {
            None => st.nodes = Some(NodeCount::Exact(listed as u32)),
            Some(NodeCount::Exact(n)) if n as usize == listed => {}
            Some(NodeCount::Exact(n)) => {
                return Err(SubmitError::Conflict {
                    message: format!("{given} asks for {n} nodes but {written} names {listed}"),
                    hint: format!(
                        "drop --nodes (the list sets it), or make them agree: --nodes={listed}{exactly}"
                    ),
                })
            }
            Some(NodeCount::Range { min, max }) => {
                return Err(SubmitError::Conflict {
                    message: format!(
                        "{given} asks for {min}-{max} nodes but {written} names exactly {listed}"
                    ),
                    hint: format!(
                        "drop --nodes (the list sets it), or write --nodes={listed}{exactly}"
                    ),
                })
            }
        }
        resources.insert("nodeNames".into(), json!(names));
    }
    let nodes = match st.nodes {
        Some(n) => n,
        None => match &st.ntasks {
            Some((nt, src, written)) => {
                let nt = *nt;
                let tpn = st.ntasks_per_node.or(compat.default_tasks_per_node);
                match tpn {
                    Some(t) => NodeCount::Exact(nt.div_ceil(t).max(1)),
                    None => {
                        warns.push(Warning::note(src, written, "without --nodes or --ntasks-per-node the node count is unknown; requesting 1 node (add --nodes or --ntasks-per-node)"));
                        NodeCount::Exact(1)
                    }
                }
            }
            None => NodeCount::Exact(1),
        },
    };
    resources.insert("nodes".into(), json!(nodes));
    if let Some((n, _, _)) = &st.ntasks {
        ann.insert(annotations::NTASKS.into(), n.to_string());
    } else if let (Some(t), NodeCount::Exact(n)) = (st.ntasks_per_node, nodes) {
        ann.insert(
            annotations::NTASKS.into(),
            (u64::from(t) * u64::from(n)).to_string(),
        );
    }
    if let Some(t) = st.ntasks_per_node {
        ann.insert(annotations::NTASKS_PER_NODE.into(), t.to_string());
    }
    let mut cb = constraints::Built::default();
    if let Some((c, src, _)) = &st.constraint {
        let e = parse_constraint(c).map_err(|e| SubmitError::invalid("--constraint", c, src, e))?;
        cb = constraints::build(&e, nodes.max() > 1)
            .map_err(|e| SubmitError::invalid("--constraint", c, src, e))?;
        for n in &cb.notes {
            warns.push(Warning::note(src, &format!("--constraint={c}"), n.clone()));
        }
        if !cb.notes.is_empty() {
            ann.insert(annotations::CONSTRAINT.into(), c.clone());
        }
    }
    let gpu = match (&st.gres, &st.gpus_total) {
        (Some((g, src)), _) => g.gpu_count.map(|c| (c, g.gpu_type.clone(), src.clone())),
        (None, Some((total, ty, src))) => {
            let n = nodes.min().max(1);
            let per = total.div_ceil(n);
            if per * n != *total {
                warns.push(Warning::note(src, &format!("--gpus={total}"), format!("{total} GPUs over {n} nodes is not a whole number per node; requesting {per} GPUs per node")));
            }
            Some((per, ty.clone(), src.clone()))
        }
        _ => None,
    };
    if let Some((count, ty, src)) = gpu {
        if let Some(prev) = cb.fields.get("gpuCount").and_then(Value::as_u64) {
            if prev != u64::from(count) {
                warns.push(Warning::note(&src, "", format!("the constraint asks for {prev} GPUs per node but the GPU request for {count}; using {count}")));
            }
        }
        cb.fields.insert("gpuCount".into(), json!(count));
        if let Some(t) = ty {
            cb.fields.insert("gpuType".into(), json!(t));
        }
    }
    if !cb.fields.is_empty() {
        resources.insert("constraints".into(), Value::Object(cb.fields));
    }
    spec.insert("resources".into(), Value::Object(resources));

    // --- preemption, checkpoint, requeue, sensitivity
    let mut class: Option<i32> = match &st.class {
        Some(Class::Explicit(c)) => Some(*c),
        Some(Class::Qos(q, src)) => {
            ann.insert(annotations::QOS.into(), q.clone());
            match compat.qos.get(q) {
                Some(c) => Some(*c),
                None => {
                    let known: Vec<&str> = compat.qos.keys().map(String::as_str).collect();
                    warns.push(Warning::note(src, &format!("--qos={q}"), format!(
                        "QOS \"{q}\" has no preemption-class mapping in lattice-compat.yaml{}; using the default class 5",
                        if known.is_empty() { String::new() } else { format!(" (mapped: {})", known.join(", ")) }
                    )));
                    None
                }
            }
        }
        None => None,
    };
    let mut cp = Map::new();
    if let Some(s) = &st.checkpoint {
        cp.insert("strategy".into(), json!(s));
    }
    if st.no_preempt {
        if st.checkpoint.as_deref().is_some_and(|s| s != "none") {
            return Err(SubmitError::Conflict {
                message: "--no-preempt with a checkpoint strategy".into(),
                hint: "--no-preempt means no checkpointing; drop one of them".into(),
            });
        }
        cp.insert("strategy".into(), json!("none"));
        let c = class.unwrap_or(5);
        if c < 7 {
            if class.is_some() {
                warns.push(Warning::note(
                    &cl,
                    "--no-preempt",
                    format!("preemption class {c} raised to 7 so the allocation is not preempted"),
                ));
            }
            class = Some(7);
        }
    }
    match (
        cp.get("strategy").and_then(Value::as_str),
        st.checkpoint_port,
    ) {
        (Some("grpc"), Some(p)) => {
            cp.insert("port".into(), json!(p));
        }
        (Some("grpc"), None) => {
            return Err(SubmitError::Conflict {
                message: "--checkpoint=grpc needs --checkpoint-port".into(),
                hint: "add --checkpoint-port=PORT (e.g. 9999)".into(),
            })
        }
        (_, Some(_)) => warns.push(Warning::note(
            &cl,
            "--checkpoint-port",
            "only used with --checkpoint=grpc; ignored",
        )),
        _ => {}
    }
    if st.sensitive {
        spec.insert("sensitive".into(), json!(true));
        if class.is_some_and(|c| c != 10) {
            warns.push(Warning::note(&cl, "--sensitive", "sensitive allocations are always preemption class 10; the requested class was ignored"));
        }
        class = None;
        // Sensitive work is never requeued automatically (`never` is its default).
        if let Some((true, src, written)) = st.requeue.take() {
            warns.push(Warning::ignored(
                &src,
                &written,
                "sensitive allocations are never requeued automatically",
            ));
        }
    }
    if let Some(c) = class {
        spec.insert("preemptionClass".into(), json!(c));
    }
    if !cp.is_empty() {
        spec.insert("checkpoint".into(), Value::Object(cp));
    }
    // Slurm's `--requeue` requeues a batch job after a node failure (and a preemption,
    // which Lattice always requeues); `--no-requeue` never.
    match st.requeue {
        Some((true, ..)) => {
            spec.insert("requeue".into(), json!({"policy": "on_node_failure"}));
        }
        Some((false, ..)) => {
            spec.insert("requeue".into(), json!({"policy": "never"}));
        }
        None => {}
    }

    // --- data & networking
    if !st.data_mounts.is_empty() {
        let mut seen = std::collections::BTreeSet::new();
        let mut v = Vec::new();
        for m in &st.data_mounts {
            if !seen.insert(m.target.clone()) {
                return Err(SubmitError::Conflict {
                    message: format!("{} is the target of two --data-mount options", m.target),
                    hint: "give each mount its own target path".into(),
                });
            }
            v.push(json!({"source": m.source, "target": m.target, "access": if m.read_write { "read-write" } else { "read-only" }, "tierHint": "hot"}));
        }
        spec.insert("dataMounts".into(), json!(v));
    }
    let mut conn = Map::new();
    if let Some(d) = &st.network_domain {
        if !is_dns1123_label(d) {
            return Err(reject(
                &st,
                &["network-domain"],
                d,
                "is not a valid network domain name (lowercase letters, digits and '-')".into(),
                format!("use e.g. --network-domain={}", sanitize_name(d, 63)),
            ));
        }
        conn.insert("networkDomain".into(), json!(d));
    }
    if !st.expose.is_empty() {
        let v: Vec<Value> = st.expose.iter().map(|e| json!({"name": e.name, "port": e.port, "protocol": if e.udp { "udp" } else { "tcp" }})).collect();
        conn.insert("expose".into(), json!(v));
    }
    if !conn.is_empty() {
        spec.insert("connectivity".into(), Value::Object(conn));
    }

    // --- task group & dependencies
    if let Some(a) = &st.array {
        let mut tg = Map::new();
        tg.insert("range".into(), json!(a.range));
        if let Some(l) = a.limit {
            tg.insert("concurrency".into(), json!(l));
        }
        spec.insert("taskGroup".into(), Value::Object(tg));
    }
    let mut begin_entry = None;
    if let Some((b, src)) = &st.begin {
        use chrono::TimeZone;
        let now = flags
            .now
            .and_then(|t| chrono::Local.timestamp_opt(t, 0).single())
            .unwrap_or_else(chrono::Local::now);
        let t = parse_begin(b, now).map_err(|e| SubmitError::invalid("--begin", b, src, e))?;
        match &mut st.deps {
            // One beginTime per allocation: the later of --begin and begin-time.
            Some((d, _)) => d.begin_time = Some(d.begin_time.map_or(t as f64, |x| x.max(t as f64))),
            None => begin_entry = Some(json!({ "beginTime": t as f64 })),
        }
    }
    if let Some(e) = begin_entry {
        spec.insert("dependsOn".into(), json!([e]));
    }
    if let Some((d, src)) = &st.deps {
        ann.insert(annotations::DEPENDENCY.into(), d.raw.clone());
        let opt = format!("--dependency={}", d.raw);
        for n in &d.notes {
            warns.push(Warning::note(src, &opt, n.clone()));
        }
        if d.singleton && display_name.is_none() {
            warns.push(Warning::note(
                src,
                &opt,
                "singleton serializes jobs by name and user, but this job has no name; set --job-name (or --name)",
            ));
        }
        let (entries, notes) = d.depends_on(st.array.is_some());
        for n in notes {
            warns.push(Warning::note(src, &opt, n));
        }
        if !entries.is_empty() {
            spec.insert("dependsOn".into(), json!(entries));
        }
    }

    // --- annotations & labels
    if let Some(o) = &st.output {
        ann.insert(annotations::OUTPUT.into(), o.clone());
    }
    if let Some(e) = &st.error {
        ann.insert(annotations::ERROR.into(), e.clone());
    }
    if let Some(c) = &st.comment {
        ann.insert(annotations::COMMENT.into(), c.clone());
    }
    if compat.set_slurm_env {
        ann.insert(annotations::SET_SLURM_ENV.into(), "true".into());
    }
    if !tags.is_empty() {
        spec.insert("tags".into(), Value::Object(tags));
    }
    meta.insert(
        "labels".into(),
        json!({annotations::FRONTEND: if st.sbatch_used { "sbatch" } else { "lattice" }}),
    );
    if !ann.is_empty() {
        meta.insert("annotations".into(), json!(ann));
    }

    let allocation = json!({
        "apiVersion": "lattice.dev/v1alpha1",
        "kind": "Allocation",
        "metadata": Value::Object(meta),
        "spec": Value::Object(spec),
    });
    // Script lines in order, then the command line and the site mapping (stable: an
    // option's warnings keep their order).
    warns.sort_by_key(|w| w.source.line().unwrap_or(usize::MAX));
    Ok(Translation {
        allocation,
        warnings: warns,
        client: st.client,
    })
}
