//! Defaulting and admission checks of an allocation's spec and status; every error
//! names the field path and the fix.

#[allow(unused_imports)]
use super::*;

/// The placeholder of the seed's task-group template (`entrypoint: "python sweep.py
/// --config=${INDEX}"`): each element's entrypoint and arguments carry its index there.
pub const TASK_INDEX_PLACEHOLDER: &str = "${INDEX}";

impl AllocationSpec {
    /// The spec of element `index` of a task group (job array), from the group's spec:
    /// no `taskGroup`, and [`TASK_INDEX_PLACEHOLDER`] in `entrypoint` and `args` replaced
    /// by the index. (Scripts read `$LATTICE_TASK_INDEX` / `$SLURM_ARRAY_TASK_ID`, set by
    /// the agent; a script's own `${INDEX}` is the shell's and left alone.)
    pub fn task_element(&self, index: u64) -> AllocationSpec {
        let mut spec = self.clone();
        spec.task_group = None;
        let i = index.to_string();
        if let Some(e) = spec.entrypoint.as_mut() {
            if e.contains(TASK_INDEX_PLACEHOLDER) {
                *e = e.replace(TASK_INDEX_PLACEHOLDER, &i);
            }
        }
        for a in spec.args.iter_mut() {
            if a.contains(TASK_INDEX_PLACEHOLDER) {
                *a = a.replace(TASK_INDEX_PLACEHOLDER, &i);
            }
        }
        spec
    }

    /// Fill defaults: preemption class, requeue, checkpoint, telemetry.
    pub fn default_fields(&mut self) {
        if self.preemption_class.is_none() {
            self.preemption_class = Some(if self.sensitive {
                SENSITIVE_PREEMPTION_CLASS
            } else {
                DEFAULT_PREEMPTION_CLASS
            });
        }
        let requeue = self.requeue.get_or_insert(Requeue {
            policy: None,
            max_requeue: None,
        });
        if requeue.policy.is_none() {
            requeue.policy = Some(
                if self.sensitive
                    || self.intent.as_deref() == Some("interactive")
                    || self.step_of.is_some()
                {
                    RequeuePolicy::Never
                } else {
                    RequeuePolicy::OnNodeFailure
                },
            );
        }
        if requeue.max_requeue.is_none() {
            requeue.max_requeue = Some(DEFAULT_MAX_REQUEUE);
        }
        let cp = self.checkpoint.get_or_insert_with(Checkpoint::default);
        if cp.strategy == CheckpointStrategy::Signal && cp.signal.is_none() {
            cp.signal = Some("SIGUSR1".to_string());
        }
        if self.telemetry.is_none() {
            self.telemetry = Some(Telemetry {
                mode: if self.sensitive {
                    TelemetryMode::Audit
                } else {
                    TelemetryMode::Prod
                },
                duration: None,
            });
        }
    }

    /// Validate the spec; `p` is the path prefix (`spec`, or `spec.allocations[2].spec` in a Dag).
    pub(crate) fn validate(
        &self,
        p: &str,
        self_name: Option<&str>,
        namespace: Option<&str>,
        errs: &mut Errors,
    ) {
        self.validate_as(p, self_name, namespace, false, errs)
    }

    /// [`Self::validate`]; `element`: the allocation is an element of a job array
    /// (labelled [`TASK_INDEX_LABEL`]), which may carry its array's `corresponding`
    /// dependencies without a `taskGroup` of its own.
    pub(crate) fn validate_as(
        &self,
        p: &str,
        self_name: Option<&str>,
        namespace: Option<&str>,
        element: bool,
        errs: &mut Errors,
    ) {
        if let (Some(t), Some(ns)) = (&self.tenant, namespace) {
            if t != ns {
                errs.push(
                    format!("{p}.tenant"),
                    format!("is {:?} but metadata.namespace (the tenant) is {ns:?}; remove spec.tenant or make them equal", truncate(t, 63)),
                );
            }
        } else if let Some(t) = &self.tenant {
            errs.extend(validate_dns1123_label(format_args!("{p}.tenant"), t));
        }
        if let Some(v) = &self.vcluster {
            errs.extend(validate_dns1123_label(format_args!("{p}.vcluster"), v));
        }
        if let Some(pr) = &self.project {
            check_len(errs, format_args!("{p}.project"), pr, 253);
        }
        if let Some(i) = &self.intent {
            check_len(errs, format_args!("{p}.intent"), i, 253);
        }
        for (k, v) in &self.tags {
            if k.is_empty() || k.len() > 63 {
                errs.push(
                    format!("{p}.tags"),
                    format!("tag key {:?} must be 1–63 characters", truncate(k, 70)),
                );
            }
            check_len(
                errs,
                format_args!("{p}.tags[{:?}]", truncate(k, 63)),
                v,
                256,
            );
        }
        for (k, v) in &self.env {
            let valid = !k.is_empty()
                && k.len() <= 255
                && !k.as_bytes()[0].is_ascii_digit()
                && k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !valid {
                errs.push(
                    format!("{p}.env[{:?}]", truncate(k, 63)),
                    "environment variable names must be letters, digits and '_', not starting with a digit (e.g. \"OMP_NUM_THREADS\")",
                );
            }
            check_len(
                errs,
                format_args!("{p}.env[{:?}]", truncate(k, 63)),
                v,
                128 * 1024,
            );
        }
        if let Some(env) = &self.environment {
            let ep = format!("{p}.environment");
            if env.uenv.is_some() && env.image.is_some() {
                errs.push(
                    format!("{ep}.image"),
                    "set either environment.uenv or environment.image, not both (a uenv runs natively, an image runs in a container)",
                );
            }
            if env.view.is_some() && env.uenv.is_none() {
                errs.push(format!("{ep}.view"), "needs environment.uenv: a view is activated from a uenv; set uenv or remove view");
            }
            if let Some(Err(e)) = env.image.as_deref().map(crate::syntax::image::parse) {
                errs.push(format!("{ep}.image"), e);
            }
            let mut count = 0;
            for (field, v) in [("uenv", &env.uenv), ("toolsUenv", &env.tools_uenv)] {
                match v.as_deref().map(crate::syntax::uenv::parse) {
                    Some(Err(e)) => errs.push(format!("{ep}.{field}"), e),
                    Some(Ok(refs)) => count += refs.len(),
                    None => {}
                }
            }
            if count > crate::syntax::uenv::MAX_UENVS {
                errs.push(
                    format!("{ep}.toolsUenv"),
                    format!(
                        "uenv and toolsUenv name {count} images together; at most {}",
                        crate::syntax::uenv::MAX_UENVS
                    ),
                );
            }
            if let Some(Err(e)) = env.view.as_deref().map(crate::syntax::uenv::check_views) {
                errs.push(format!("{ep}.view"), e);
            }
            for (field, v) in [
                ("uenv", &env.uenv),
                ("view", &env.view),
                ("image", &env.image),
                ("toolsUenv", &env.tools_uenv),
            ] {
                if let Some(v) = v {
                    if v.trim().is_empty() || v.chars().any(char::is_whitespace) {
                        errs.push(format!("{ep}.{field}"), format!("{:?} must be non-empty and contain no spaces, e.g. \"prgenv-gnu/24.11:v1\"", truncate(v, 60)));
                    }
                    check_len(errs, format_args!("{ep}.{field}"), v, 512);
                }
            }
        }
        match (&self.entrypoint, &self.script) {
            (None, None) => errs.push(
                format!("{p}.entrypoint"),
                "is required: set spec.entrypoint (e.g. \"/bin/sh\" with args [\"-c\", \"echo hi\"]) or spec.script",
            ),
            (Some(_), Some(_)) => errs.push(
                format!("{p}.script"),
                "set either spec.entrypoint or spec.script, not both",
            ),
            (Some(e), None) => {
                if e.trim().is_empty() {
                    errs.push(format!("{p}.entrypoint"), "is empty; set the command to run, e.g. \"/bin/sh\"");
                }
                check_len(errs, format_args!("{p}.entrypoint"), e, MAX_TEXT_LEN);
            }
            (None, Some(s)) => {
                if s.trim().is_empty() {
                    errs.push(format!("{p}.script"), "is empty; put the batch script's text here");
                }
                check_len(errs, format_args!("{p}.script"), s, MAX_SCRIPT_LEN);
            }
        }
        if self.script.is_some() && !self.args.is_empty() {
            errs.push(
                format!("{p}.args"),
                "args are passed to spec.entrypoint; with spec.script put arguments in the script",
            );
        }
        if self.args.len() > 4096 {
            errs.push(
                format!("{p}.args"),
                format!("has {} entries, the limit is 4096", self.args.len()),
            );
        }
        for (i, a) in self.args.iter().enumerate().take(4096) {
            check_len(errs, format_args!("{p}.args[{i}]"), a, 128 * 1024);
        }
        if let Some(w) = &self.working_dir {
            if !w.starts_with('/') {
                errs.push(
                    format!("{p}.workingDir"),
                    format!(
                        "{:?} must be an absolute path, e.g. \"/scratch/me\"",
                        truncate(w, 60)
                    ),
                );
            }
            check_len(errs, format_args!("{p}.workingDir"), w, MAX_TEXT_LEN);
        }
        self.validate_resources(p, errs);
        self.validate_step_of(p, self_name, errs);
        self.validate_launch(p, errs);
        self.validate_lifecycle(p, errs);
        if let Some(c) = self.preemption_class {
            if !(0..=10).contains(&c) {
                errs.push(
                    format!("{p}.preemptionClass"),
                    format!("must be between 0 and 10, got {c}; use 0 (best effort) … 5 (normal, the default) … 10 (highest, never preempted)"),
                );
            } else if self.sensitive && c != SENSITIVE_PREEMPTION_CLASS {
                errs.push(
                    format!("{p}.preemptionClass"),
                    format!("sensitive allocations are always class 10, got {c}; remove preemptionClass or set it to 10"),
                );
            }
        }
        if let Some(rq) = &self.requeue {
            if let Some(m) = rq.max_requeue {
                if m > MAX_MAX_REQUEUE {
                    errs.push(
                        format!("{p}.requeue.maxRequeue"),
                        format!("must be at most {MAX_MAX_REQUEUE}, got {m}; lower it (the default is {DEFAULT_MAX_REQUEUE})"),
                    );
                }
            }
            if self.sensitive
                && matches!(
                    rq.policy,
                    Some(RequeuePolicy::Always | RequeuePolicy::OnNodeFailure)
                )
            {
                errs.push(
                    format!("{p}.requeue.policy"),
                    "sensitive allocations are never requeued automatically; set policy: never or remove it",
                );
            }
        }
        let mut targets = BTreeSet::new();
        for (i, m) in self.data_mounts.iter().enumerate() {
            let mp = format!("{p}.dataMounts[{i}]");
            if m.source.trim().is_empty() {
                errs.push(
                    format!("{mp}.source"),
                    "is required, e.g. \"s3://datasets/imagenet\" or \"/store/data\"",
                );
            }
            check_len(errs, format_args!("{mp}.source"), &m.source, MAX_TEXT_LEN);
            if !m.target.starts_with('/') {
                errs.push(
                    format!("{mp}.target"),
                    format!(
                        "{:?} must be an absolute path, e.g. \"/data/input\"",
                        truncate(&m.target, 60)
                    ),
                );
            } else if m.target.split('/').any(|c| c == "..") {
                errs.push(
                    format!("{mp}.target"),
                    "must not contain '..'; use a normalized absolute path",
                );
            }
            check_len(errs, format_args!("{mp}.target"), &m.target, MAX_TEXT_LEN);
            if !targets.insert(m.target.as_str()) {
                errs.push(
                    format!("{mp}.target"),
                    format!(
                        "{:?} is mounted twice; give each mount its own target",
                        truncate(&m.target, 60)
                    ),
                );
            }
        }
        if let Some(c) = &self.connectivity {
            if let Some(d) = &c.network_domain {
                errs.extend(validate_dns1123_label(
                    format_args!("{p}.connectivity.networkDomain"),
                    d,
                ));
            }
            let mut names = BTreeSet::new();
            for (i, e) in c.expose.iter().enumerate() {
                let ep = format!("{p}.connectivity.expose[{i}]");
                errs.extend(validate_dns1123_label(format_args!("{ep}.name"), &e.name));
                if !names.insert(e.name.as_str()) {
                    errs.push(
                        format!("{ep}.name"),
                        format!(
                            "{:?} is used twice; port names must be unique",
                            truncate(&e.name, 63)
                        ),
                    );
                }
                if !(1..=65535).contains(&e.port) {
                    errs.push(
                        format!("{ep}.port"),
                        format!("must be between 1 and 65535, got {}", e.port),
                    );
                }
            }
        }
        let mut seen = BTreeSet::new();
        if self.depends_on.len() > 1000 {
            errs.push(
                format!("{p}.dependsOn"),
                format!("has {} entries, the limit is 1000", self.depends_on.len()),
            );
        }
        let mut seen_time = false;
        let mut seen_singleton = false;
        for (i, d) in self.depends_on.iter().enumerate().take(1000) {
            let dp = format!("{p}.dependsOn[{i}]");
            d.validate(&dp, self_name, self.task_group.is_some() || element, errs);
            let duplicate = match d.kind() {
                Some(DependencyKind::Allocation { target, .. }) => match d.task_index {
                    // One element of a job array is a dependency of its own.
                    Some(t) => (!seen.insert(format!("ref:{target}_{t}"))).then(|| {
                        (
                            "taskIndex",
                            format!(
                                "task {t} of {:?} is listed twice; keep one entry per dependency",
                                truncate(target, 63)
                            ),
                        )
                    }),
                    None => (!seen.insert(format!("ref:{target}"))).then(|| {
                        (
                            "ref",
                            format!(
                                "{:?} is listed twice; keep one entry per dependency",
                                truncate(target, 63)
                            ),
                        )
                    }),
                },
                Some(DependencyKind::Symbol { name, .. }) => (!seen
                    .insert(format!("symbol:{name}")))
                .then(|| {
                    (
                        "symbol",
                        format!(
                            "{:?} is listed twice; keep one entry per symbol (inout both reads and writes it)",
                            truncate(name, 63)
                        ),
                    )
                }),
                Some(DependencyKind::BeginTime(_)) => std::mem::replace(&mut seen_time, true)
                    .then(|| {
                        (
                            "beginTime",
                            "is given twice; keep one beginTime".to_string(),
                        )
                    }),
                Some(DependencyKind::Singleton) => std::mem::replace(&mut seen_singleton, true)
                    .then(|| ("singleton", "is given twice; keep one".to_string())),
                Some(DependencyKind::Mutex(name)) => (!seen.insert(format!("mutex:{name}")))
                    .then(|| {
                        (
                            "ref",
                            format!(
                                "mutex {:?} is listed twice; keep one entry per lock",
                                truncate(name, 63)
                            ),
                        )
                    }),
                None => None,
            };
            if let Some((field, msg)) = duplicate {
                errs.push(format!("{dp}.{field}"), msg);
            }
        }
        if let Some(tg) = &self.task_group {
            let tp = format!("{p}.taskGroup");
            if let Err(e) = TaskRange::parse(&tg.range) {
                errs.push(format!("{tp}.range"), e);
            }
            if tg.concurrency == Some(0) {
                errs.push(
                    format!("{tp}.concurrency"),
                    "must be at least 1; remove it for no limit",
                );
            }
            if self.lifecycle.type_ != LifecycleType::Bounded {
                errs.push(
                    tp.clone(),
                    "task groups are batch arrays and need lifecycle.type: bounded",
                );
            }
        }
        if let Some(cp) = &self.checkpoint {
            let cpp = format!("{p}.checkpoint");
            match (cp.strategy, cp.port) {
                (CheckpointStrategy::Grpc, None) => errs.push(format!("{cpp}.port"), "is required for strategy grpc: set the port your checkpoint endpoint listens on (e.g. 9999)"),
                (CheckpointStrategy::Grpc, Some(port)) if !(1..=65535).contains(&port) => {
                    errs.push(format!("{cpp}.port"), format!("must be between 1 and 65535, got {port}"))
                }
                (s, Some(_)) if s != CheckpointStrategy::Grpc => errs.push(format!("{cpp}.port"), "is only used with strategy grpc; remove it"),
                _ => {}
            }
            if let Some(sig) = &cp.signal {
                if cp.strategy != CheckpointStrategy::Signal {
                    errs.push(
                        format!("{cpp}.signal"),
                        "is only used with strategy signal; remove it",
                    );
                } else if !is_signal_name(sig) {
                    errs.push(format!("{cpp}.signal"), format!("{:?} is not a signal name; use e.g. \"SIGUSR1\", \"SIGUSR2\" or \"SIGTERM\"", truncate(sig, 20)));
                }
            }
            if let Some(t) = &cp.timeout {
                if let Err(e) = parse_duration(t) {
                    errs.push(format!("{cpp}.timeout"), e);
                }
            }
        }
        if let Some(t) = &self.telemetry {
            if let Some(d) = &t.duration {
                if let Err(e) = parse_duration(d) {
                    errs.push(format!("{p}.telemetry.duration"), e);
                }
            }
            if self.sensitive && t.mode != TelemetryMode::Audit {
                errs.push(
                    format!("{p}.telemetry.mode"),
                    "sensitive allocations use audit telemetry; set mode: audit or remove it",
                );
            }
        }
        if let Some(pr) = &self.liveness_probe {
            let pp = format!("{p}.livenessProbe");
            if !(1..=65535).contains(&pr.port) {
                errs.push(
                    format!("{pp}.port"),
                    format!("must be between 1 and 65535, got {}", pr.port),
                );
            }
            match (pr.probe_type, &pr.path) {
                (ProbeType::Http, None) => errs.push(
                    format!("{pp}.path"),
                    "is required for http probes, e.g. \"/healthz\"",
                ),
                (ProbeType::Http, Some(path)) if !path.starts_with('/') => errs.push(
                    format!("{pp}.path"),
                    format!(
                        "{:?} must start with '/', e.g. \"/healthz\"",
                        truncate(path, 60)
                    ),
                ),
                (ProbeType::Tcp, Some(_)) => errs.push(
                    format!("{pp}.path"),
                    "is only used by http probes; remove it or set probeType: http",
                ),
                _ => {}
            }
            for (field, v) in [
                ("periodSecs", pr.period_secs),
                ("failureThreshold", pr.failure_threshold),
                ("timeoutSecs", pr.timeout_secs),
            ] {
                if v == 0 {
                    errs.push(format!("{pp}.{field}"), "must be at least 1");
                }
            }
            if pr.timeout_secs > pr.period_secs && pr.period_secs > 0 {
                errs.push(
                    format!("{pp}.timeoutSecs"),
                    format!(
                        "({}) must not exceed periodSecs ({})",
                        pr.timeout_secs, pr.period_secs
                    ),
                );
            }
            if self.lifecycle.type_ == LifecycleType::Bounded {
                errs.push(pp.clone(), "liveness probes apply to services: set lifecycle.type to unbounded or reactive, or remove the probe");
            }
        }
    }

    fn validate_resources(&self, p: &str, errs: &mut Errors) {
        let np = || format!("{p}.resources.nodes");
        match self.resources.nodes {
            NodeCount::Exact(0) => errs.push(np(), "must be at least 1, got 0"),
            NodeCount::Exact(n) if n > MAX_NODES => {
                errs.push(np(), format!("must be at most {MAX_NODES}, got {n}"))
            }
            NodeCount::Range { min, max } => {
                if min == 0 {
                    errs.push(format!("{}.min", np()), "must be at least 1, got 0");
                }
                if min > max {
                    errs.push(
                        format!("{}.min", np()),
                        format!("({min}) must be <= max ({max}); swap them or raise max"),
                    );
                }
                if max > MAX_NODES {
                    errs.push(
                        format!("{}.max", np()),
                        format!("must be at most {MAX_NODES}, got {max}"),
                    );
                }
            }
            _ => {}
        }
        self.validate_node_names(p, errs);
        let c = &self.resources.constraints;
        let cp = || format!("{p}.resources.constraints");
        if let Some(g) = c.gpu_count {
            if g == 0 || g > 64 {
                errs.push(format!("{}.gpuCount", cp()), format!("must be between 1 and 64 GPUs per node, got {g}; remove it for CPU-only work"));
            }
        }
        if let Some(t) = &c.gpu_type {
            if t.trim().is_empty() || t.len() > 64 {
                errs.push(
                    format!("{}.gpuType", cp()),
                    "must be a GPU model name of 1–64 characters, e.g. \"GH200\"",
                );
            }
        }
        if c.memory_gb == Some(0) {
            errs.push(
                format!("{}.memoryGb", cp()),
                "must be at least 1; remove it for no memory constraint",
            );
        }
        let mut feats = BTreeSet::new();
        for (i, f) in c.features.iter().enumerate() {
            if !is_feature_name(f) {
                errs.push(
                    format!("{}.features[{i}]", cp()),
                    format!(
                        "{:?} is not a feature name: {FEATURE_NAME_RULE}",
                        truncate(f, 40)
                    ),
                );
            } else if !feats.insert(f.as_str()) {
                errs.push(
                    format!("{}.features[{i}]", cp()),
                    format!("{f:?} is listed twice"),
                );
            }
        }
        validate_any_of(&c.any_of, &format!("{}.anyOf", cp()), errs);
    }

    fn validate_launch(&self, p: &str, errs: &mut Errors) {
        let Some(l) = &self.launch else {
            return;
        };
        let lp = format!("{p}.launch");
        if self.step_of.is_none() {
            errs.push(
                lp.clone(),
                "applies to job steps only (spec.stepOf); start the tasks with `lattice launch` inside the allocation, or remove launch",
            );
        }
        match l.gpus_per_task {
            Some(0) => errs.push(
                format!("{lp}.gpusPerTask"),
                "must be at least 1; remove it to bind no GPUs",
            ),
            Some(n) if n > 1024 => errs.push(
                format!("{lp}.gpusPerTask"),
                format!("{n} is more GPUs than any node has; ask for at most 1024"),
            ),
            _ => {}
        }
    }

    fn validate_step_of(&self, p: &str, self_name: Option<&str>, errs: &mut Errors) {
        let Some(parent) = &self.step_of else {
            return;
        };
        let sp = format!("{p}.stepOf");
        if let Some(e) = validate_dns1123_name(&sp, parent) {
            errs.0.push(e);
            return;
        }
        if self_name == Some(parent.as_str()) {
            errs.push(
                sp.clone(),
                "names the allocation itself; name the allocation to run in",
            );
        }
        if self.lifecycle.type_ != LifecycleType::Bounded {
            errs.push(
                format!("{p}.lifecycle.type"),
                "must be bounded for a step (it ends with its command, within its allocation's walltime); remove it or set bounded",
            );
        }
        if self
            .requeue
            .as_ref()
            .and_then(|r| r.policy)
            .is_some_and(|pol| pol != RequeuePolicy::Never)
        {
            errs.push(
                format!("{p}.requeue.policy"),
                "must be never for a step (a step does not outlive its allocation's attempt); set never or remove it",
            );
        }
        let conflicts = [
            (
                self.task_group.is_some(),
                "taskGroup",
                "launch one step per index instead",
            ),
            (
                !self.depends_on.is_empty(),
                "dependsOn",
                "a step starts as soon as its allocation runs",
            ),
            (
                !self.resources.node_names.is_empty(),
                "resources.nodeNames",
                "a step runs on its allocation's nodes",
            ),
            (
                self.sensitive,
                "sensitive",
                "a step inherits its allocation's isolation",
            ),
        ];
        for (set, field, why) in conflicts {
            if set {
                errs.push(
                    format!("{p}.{field}"),
                    format!("cannot be combined with stepOf ({why}); remove {field}"),
                );
            }
        }
    }

    fn validate_node_names(&self, p: &str, errs: &mut Errors) {
        let names = &self.resources.node_names;
        if names.is_empty() {
            return;
        }
        let np = format!("{p}.resources.nodeNames");
        let mut seen = BTreeSet::new();
        for (i, n) in names.iter().enumerate() {
            let e = validate_dns1123_name(format_args!("{np}[{i}]"), n);
            if e.is_some() {
                errs.extend(e);
            } else if !seen.insert(n.as_str()) {
                errs.push(format!("{np}[{i}]"), format!("{n:?} is listed twice"));
            }
        }
        match self.resources.nodes {
            NodeCount::Exact(n) if n as usize == names.len() => {}
            NodeCount::Exact(n) => errs.push(
                format!("{p}.resources.nodes"),
                format!(
                    "is {n} but resources.nodeNames names {} node(s); set nodes: {} or change the list",
                    names.len(),
                    names.len()
                ),
            ),
            NodeCount::Range { .. } => errs.push(
                format!("{p}.resources.nodes"),
                format!(
                    "must be an exact count with resources.nodeNames: set nodes: {}",
                    names.len()
                ),
            ),
        }
        if self.task_group.is_some() {
            errs.push(
                np,
                "cannot be combined with taskGroup (every element would claim the same nodes); submit one allocation per claim",
            );
        }
    }

    fn validate_lifecycle(&self, p: &str, errs: &mut Errors) {
        let lp = || format!("{p}.lifecycle");
        if let Some(w) = &self.lifecycle.walltime {
            match parse_duration(w) {
                Ok(0) => errs.push(
                    format!("{}.walltime", lp()),
                    format!("must be longer than zero; {DURATION_FORMATS}"),
                ),
                Ok(_) => {}
                Err(e) => errs.push(format!("{}.walltime", lp()), e),
            }
        }
        match (self.lifecycle.type_, &self.lifecycle.scale_policy) {
            (LifecycleType::Reactive, None) => errs.push(
                format!("{}.scalePolicy", lp()),
                "is required for reactive allocations: set {minNodes, maxNodes, metric, target}, e.g. {minNodes: 1, maxNodes: 8, metric: gpu_utilization, target: 0.8}",
            ),
            (LifecycleType::Reactive, Some(sp)) => {
                let sp_p = || format!("{}.scalePolicy", lp());
                if sp.min_nodes == 0 {
                    errs.push(format!("{}.minNodes", sp_p()), "must be at least 1");
                }
                if sp.min_nodes > sp.max_nodes {
                    errs.push(format!("{}.minNodes", sp_p()), format!("({}) must be <= maxNodes ({}); swap them or raise maxNodes", sp.min_nodes, sp.max_nodes));
                }
                if sp.max_nodes > MAX_NODES {
                    errs.push(format!("{}.maxNodes", sp_p()), format!("must be at most {MAX_NODES}, got {}", sp.max_nodes));
                }
                if sp.metric.trim().is_empty() || sp.metric.len() > 256 {
                    errs.push(format!("{}.metric", sp_p()), "must name a metric (1–256 characters), e.g. \"gpu_utilization\"");
                } else if let Err(e) = crate::metric::MetricSelector::parse(&sp.metric) {
                    errs.push(format!("{}.metric", sp_p()), e);
                }
                match &sp.target {
                    ScaleTarget::Number(n) if !n.is_finite() || *n < 0.0 => {
                        errs.push(format!("{}.target", sp_p()), format!("must be a non-negative number, got {n}"))
                    }
                    ScaleTarget::Text(t) if t.trim().is_empty() || t.len() > 64 => {
                        errs.push(format!("{}.target", sp_p()), "must be a number (0.8) or a value with a unit (\"100ms\")")
                    }
                    _ => {}
                }
                for (field, v) in [
                    ("cooldown", &sp.cooldown),
                    ("evaluationInterval", &sp.evaluation_interval),
                    ("scaleUpWindow", &sp.scale_up_window),
                    ("scaleDownWindow", &sp.scale_down_window),
                ] {
                    if let Some(d) = v {
                        if let Err(e) = parse_duration(d) {
                            errs.push(format!("{}.{field}", sp_p()), e);
                        }
                    }
                }
                if let Some(t) = sp.scale_down_threshold {
                    if !(t.is_finite() && (0.0..=1.0).contains(&t)) {
                        errs.push(
                            format!("{}.scaleDownThreshold", sp_p()),
                            format!("must be between 0 and 1 (a fraction of the target), got {t}"),
                        );
                    }
                }
            }
            (t, Some(_)) => errs.push(
                format!("{}.scalePolicy", lp()),
                format!("is only used by reactive allocations, but lifecycle.type is {}; set type: reactive or remove scalePolicy", match t { LifecycleType::Bounded => "bounded", LifecycleType::Unbounded => "unbounded", LifecycleType::Reactive => "reactive" }),
            ),
            _ => {}
        }
    }
}

fn is_signal_name(s: &str) -> bool {
    matches!(
        s.trim_start_matches("SIG"),
        "USR1"
            | "USR2"
            | "TERM"
            | "INT"
            | "HUP"
            | "QUIT"
            | "CONT"
            | "STOP"
            | "TSTP"
            | "WINCH"
            | "ALRM"
    )
}

impl AllocationStatus {
    pub(super) fn validate(&self, errs: &mut Errors) {
        let mut seen = BTreeSet::new();
        for (i, n) in self.assigned_nodes.iter().enumerate() {
            if let Some(e) = validate_dns1123_name(format_args!("status.assignedNodes[{i}]"), n) {
                errs.0.push(e);
            } else if !seen.insert(n.as_str()) {
                errs.push(
                    format!("status.assignedNodes[{i}]"),
                    format!("node {n:?} is assigned twice"),
                );
            }
        }
        if let (Some(s), Some(e)) = (self.start_time, self.end_time) {
            if e < s {
                errs.push("status.endTime", "is before status.startTime");
            }
        }
        if let Some(v) = self.vni {
            if v == 0 || v > 0x00FF_FFFF {
                errs.push(
                    "status.vni",
                    format!("must be between 1 and 16777215, got {v}"),
                );
            }
        }
    }
}

/// `resources.constraints.anyOf`: at most [`MAX_ANY_OF_GROUPS`] groups, each of 1 to
/// [`MAX_ANY_OF_ALTERNATIVES`] distinct feature names.
fn validate_any_of(groups: &[Vec<String>], path: &str, errs: &mut Errors) {
    if groups.len() > MAX_ANY_OF_GROUPS {
        errs.push(
            path.to_string(),
            format!(
                "has {} groups, the limit is {MAX_ANY_OF_GROUPS}; move features every node needs to `features` or drop groups",
                groups.len()
            ),
        );
        return;
    }
    for (g, group) in groups.iter().enumerate() {
        let gp = format!("{path}[{g}]");
        if group.is_empty() {
            errs.push(
                gp,
                "is empty: a group lists the features of which a node needs at least one, e.g. [a100, h100]; remove the empty group",
            );
            continue;
        }
        if group.len() > MAX_ANY_OF_ALTERNATIVES {
            errs.push(
                gp,
                format!(
                    "has {} features, the limit is {MAX_ANY_OF_ALTERNATIVES} alternatives per group",
                    group.len()
                ),
            );
            continue;
        }
        let mut seen = BTreeSet::new();
        for (i, f) in group.iter().enumerate() {
            if !is_feature_name(f) {
                errs.push(
                    format!("{gp}[{i}]"),
                    format!(
                        "{:?} is not a feature name: {FEATURE_NAME_RULE}",
                        truncate(f, 40)
                    ),
                );
            } else if !seen.insert(f.as_str()) {
                errs.push(
                    format!("{gp}[{i}]"),
                    format!("{f:?} is listed twice in this group"),
                );
            }
        }
    }
}
