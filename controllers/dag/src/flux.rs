//! Flux RFC 26 dependency semantics for standalone jobs.
//!
//! * [`DependencyTracker`] — per-job `dependency-add` / `dependency-remove`
//!   bookkeeping with the RFC's duplicate rules: a duplicate add of an
//!   unsatisfied dependency is silently not posted; a duplicate add of a
//!   satisfied one is a plugin error. Events match by description.
//! * [`SymbolRegistry`] — the `string` scheme: `out:foo` makes later
//!   `in:foo` jobs depend on it; `inout:foo` depends on the current writers
//!   and becomes the only writer (chains); scopes `user` and `global`
//!   (non-owners may only use `in` in global scope).
//! * [`FluxDeps`] — ties schemes to job lifecycle events and raises a fatal
//!   exception on a dependent whose dependency can never be satisfied
//!   (`after` on a job that never ran, `afterok` on a failed job,
//!   `afternotok` on a successful one, `in` on a failed writer). Fatal
//!   exceptions cascade: the dependent becomes inactive without running.
//!
//! Symbol dependencies are satisfied when the writer succeeds.

use std::collections::{BTreeMap, HashMap};

use crate::deps::{Condition, Dependency, FluxDependency, SymbolAccess, SymbolScope};
use crate::Outcome;

/// Result of posting a `dependency-add`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddResult {
    /// The event was posted.
    Posted,
    /// Duplicate of an unsatisfied dependency: not posted, not an error.
    DuplicateIgnored,
}

/// RFC 26 event errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventError {
    /// Duplicate add of a satisfied dependency (RFC 26: plugin error).
    #[error("dependency {0:?} was already satisfied; adding it again is a plugin error")]
    DuplicateSatisfied(String),
    /// Remove without a matching add.
    #[error("dependency-remove {0:?} has no matching dependency-add")]
    UnknownRemove(String),
    /// No such job.
    #[error("job {0} is unknown")]
    UnknownJob(String),
}

/// Per-job dependency events (matched by description).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DependencyTracker {
    /// description → satisfied?
    deps: BTreeMap<String, bool>,
    outstanding: usize,
    fatal: Option<String>,
}

impl DependencyTracker {
    /// Post `dependency-add`.
    pub fn add(&mut self, description: &str) -> Result<AddResult, EventError> {
        match self.deps.get(description) {
            Some(false) => Ok(AddResult::DuplicateIgnored),
            Some(true) => Err(EventError::DuplicateSatisfied(description.to_string())),
            None => {
                self.deps.insert(description.to_string(), false);
                self.outstanding += 1;
                Ok(AddResult::Posted)
            }
        }
    }

    /// Post `dependency-remove`. Returns `false` for a repeated remove.
    pub fn remove(&mut self, description: &str) -> Result<bool, EventError> {
        match self.deps.get_mut(description) {
            Some(sat) if !*sat => {
                *sat = true;
                self.outstanding -= 1;
                Ok(true)
            }
            Some(_) => Ok(false),
            None => Err(EventError::UnknownRemove(description.to_string())),
        }
    }

    /// Raise a fatal exception (first reason wins).
    pub fn raise_fatal(&mut self, reason: impl Into<String>) {
        self.fatal.get_or_insert_with(|| reason.into());
    }

    /// The fatal exception, if any.
    pub fn fatal(&self) -> Option<&str> {
        self.fatal.as_deref()
    }

    /// Unsatisfied dependencies.
    pub fn outstanding(&self) -> usize {
        self.outstanding
    }

    /// All added dependencies removed and no fatal exception: may leave DEPEND.
    pub fn is_satisfied(&self) -> bool {
        self.outstanding == 0 && self.fatal.is_none()
    }
}

/// Who may see a symbol.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum ScopeKey {
    User(String),
    Global,
}

/// Errors from submitting a job with dependencies.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FluxError {
    /// The dependency object is invalid.
    #[error("invalid dependency {uri}: {message}")]
    Invalid {
        /// Compact form.
        uri: String,
        /// Why.
        message: String,
    },
    /// Job id already submitted.
    #[error("job {0} was already submitted")]
    DuplicateJob(String),
    /// Antecedent job unknown.
    #[error("dependency {uri}: job {job} not found; check the job id")]
    UnknownJob {
        /// Compact form.
        uri: String,
        /// The missing job.
        job: String,
    },
    /// A job cannot depend on itself.
    #[error("dependency {0}: a job cannot depend on itself")]
    SelfDependency(String),
    /// Scope policy violation.
    #[error("dependency {0}: only the instance owner may create out/inout dependencies in global scope; use type=in or scope=user")]
    GlobalScopeDenied(String),
    /// Scheme not handled here.
    #[error("dependency {0}: scheme not supported for standalone jobs")]
    Unsupported(String),
}

/// RFC 26's scope rule: "The instance owner can create a dependency of any type within
/// this scope. A non-instance owner can only create a dependency with the type `in`
/// within this scope" (scope `global`); in scope `user` any type is allowed.
pub fn scope_permits(access: SymbolAccess, scope: SymbolScope, owner: bool) -> bool {
    owner || scope == SymbolScope::User || access == SymbolAccess::In
}

/// Writers of `string`-scheme symbols.
#[derive(Debug, Clone, Default)]
pub struct SymbolRegistry {
    writers: HashMap<(ScopeKey, String), Vec<String>>,
}

impl SymbolRegistry {
    /// Resolve one symbol dependency for `job` (of `user`): returns the
    /// antecedent writers and registers `job` as a writer for out/inout.
    fn resolve(
        &mut self,
        job: &str,
        user: &str,
        name: &str,
        access: SymbolAccess,
        scope: SymbolScope,
    ) -> Vec<String> {
        let key = (
            match scope {
                SymbolScope::User => ScopeKey::User(user.to_string()),
                SymbolScope::Global => ScopeKey::Global,
            },
            name.to_string(),
        );
        let writers = self.writers.entry(key).or_default();
        let antecedents = match access {
            SymbolAccess::Out => Vec::new(),
            SymbolAccess::In | SymbolAccess::Inout => writers.clone(),
        };
        match access {
            SymbolAccess::In => {}
            SymbolAccess::Out => writers.push(job.to_string()),
            SymbolAccess::Inout => {
                writers.clear();
                writers.push(job.to_string());
            }
        }
        antecedents
    }

    /// Forget writers that succeeded (later `in` jobs need not wait for them).
    fn prune(&mut self, job: &str) {
        for w in self.writers.values_mut() {
            w.retain(|j| j != job);
        }
    }
}

/// Something the caller should record in the job eventlog / act upon.
#[derive(Debug, Clone, PartialEq)]
pub enum FluxEvent {
    /// `dependency-add` posted.
    DependencyAdd {
        /// Dependent job.
        job: String,
        /// Description.
        description: String,
    },
    /// `dependency-remove` posted.
    DependencyRemove {
        /// Dependent job.
        job: String,
        /// Description.
        description: String,
    },
    /// Fatal exception: the job becomes inactive without running.
    Fatal {
        /// Dependent job.
        job: String,
        /// Why, naming the dependency.
        reason: String,
    },
    /// All dependencies satisfied: the job leaves DEPEND.
    Ready {
        /// The job.
        job: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
enum JobPhase {
    Depend,
    Released,
    Running,
    Inactive { outcome: Outcome, started: bool },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Wait {
    Start,
    Finish(Condition),
}

#[derive(Debug)]
struct JobRt {
    phase: JobPhase,
    tracker: DependencyTracker,
}

/// RFC 26 dependency processing for a set of jobs.
#[derive(Debug, Default)]
pub struct FluxDeps {
    jobs: HashMap<String, JobRt>,
    /// antecedent → [(dependent, description, what it waits for)]
    waiters: HashMap<String, Vec<(String, String, Wait)>>,
    /// (begin-time bits, seq) → (job, description)
    timers: BTreeMap<(u64, u64), (String, String)>,
    seq: u64,
    symbols: SymbolRegistry,
}

fn describe(outcome: Outcome, started: bool) -> String {
    match outcome {
        Outcome::Succeeded => "completed successfully".into(),
        Outcome::Failed { exit } => format!("failed with exit code {exit}"),
        Outcome::Cancelled if started => "was cancelled".into(),
        Outcome::Cancelled => "never ran".into(),
    }
}

impl FluxDeps {
    /// Empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Submit `job` (owned by `user`; `owner` = instance owner) with RFC 26
    /// dependency objects at time `now` (epoch seconds). Returns the events
    /// posted; the job is ready when a [`FluxEvent::Ready`] for it appears.
    pub fn submit(
        &mut self,
        job: &str,
        user: &str,
        owner: bool,
        deps: &[FluxDependency],
        now: f64,
    ) -> Result<Vec<FluxEvent>, FluxError> {
        if self.jobs.contains_key(job) {
            return Err(FluxError::DuplicateJob(job.to_string()));
        }
        // Validate everything before touching state.
        let mut parsed = Vec::with_capacity(deps.len());
        for d in deps {
            let uri = d.to_uri();
            let dep = d.to_dependency().map_err(|message| FluxError::Invalid {
                uri: uri.clone(),
                message,
            })?;
            match &dep {
                Dependency::Allocation { target, .. } => {
                    if target == job {
                        return Err(FluxError::SelfDependency(uri));
                    }
                    if !self.jobs.contains_key(target) {
                        return Err(FluxError::UnknownJob {
                            uri,
                            job: target.clone(),
                        });
                    }
                }
                Dependency::Symbol { access, scope, .. } => {
                    if !scope_permits(*access, *scope, owner) {
                        return Err(FluxError::GlobalScopeDenied(uri));
                    }
                }
                Dependency::BeginTime { .. } => {}
            }
            parsed.push((uri, dep));
        }
        self.jobs.insert(
            job.to_string(),
            JobRt {
                phase: JobPhase::Depend,
                tracker: DependencyTracker::default(),
            },
        );
        let mut ev = Vec::new();
        let mut fatal: Option<String> = None;
        for (uri, dep) in parsed {
            match dep {
                Dependency::Allocation {
                    target, condition, ..
                } => {
                    let wait = if condition == Condition::Started {
                        Wait::Start
                    } else {
                        Wait::Finish(condition)
                    };
                    let phase = self.jobs.get(&target).map(|j| j.phase.clone());
                    match phase.map(|p| Self::verdict(&p, wait)) {
                        Some(Some(Ok(()))) => {}
                        Some(Some(Err(why))) => {
                            fatal.get_or_insert(format!(
                                "dependency {uri} can never be satisfied: job {target} {why}"
                            ));
                        }
                        _ => {
                            self.add(job, &uri, &mut ev);
                            self.waiters.entry(target).or_default().push((
                                job.to_string(),
                                uri,
                                wait,
                            ));
                        }
                    }
                }
                Dependency::BeginTime { epoch_seconds } => {
                    if now < epoch_seconds {
                        self.add(job, &uri, &mut ev);
                        self.seq += 1;
                        self.timers
                            .insert((epoch_seconds.to_bits(), self.seq), (job.to_string(), uri));
                    }
                }
                Dependency::Symbol {
                    name,
                    access,
                    scope,
                } => {
                    for w in self.symbols.resolve(job, user, &name, access, scope) {
                        if w == job {
                            continue;
                        }
                        let desc = format!("{uri}@{w}");
                        let phase = self.jobs.get(&w).map(|j| j.phase.clone());
                        match phase.map(|p| Self::verdict(&p, Wait::Finish(Condition::Success))) {
                            Some(Some(Ok(()))) => {}
                            Some(Some(Err(why))) => {
                                fatal.get_or_insert(format!(
                                    "dependency {uri} can never be satisfied: writer job {w} {why}"
                                ));
                            }
                            _ => {
                                self.add(job, &desc, &mut ev);
                                self.waiters.entry(w).or_default().push((
                                    job.to_string(),
                                    desc,
                                    Wait::Finish(Condition::Success),
                                ));
                            }
                        }
                    }
                }
            }
        }
        if let Some(reason) = fatal {
            self.fatal(job, reason, &mut ev);
        } else {
            self.check_ready(job, &mut ev);
        }
        Ok(ev)
    }

    /// `Some(Ok)` satisfied, `Some(Err(why))` never satisfiable, `None` undecided.
    fn verdict(phase: &JobPhase, wait: Wait) -> Option<Result<(), String>> {
        match (phase, wait) {
            (JobPhase::Running, Wait::Start) => Some(Ok(())),
            (JobPhase::Inactive { started, outcome }, Wait::Start) => {
                if *started {
                    Some(Ok(()))
                } else {
                    Some(Err(describe(*outcome, false)))
                }
            }
            (JobPhase::Inactive { outcome, started }, Wait::Finish(c)) => {
                let ok = match c {
                    Condition::Any => true,
                    Condition::Success => *outcome == Outcome::Succeeded,
                    Condition::Failure => *outcome != Outcome::Succeeded,
                    _ => true,
                };
                if ok {
                    Some(Ok(()))
                } else {
                    Some(Err(describe(*outcome, *started)))
                }
            }
            _ => None,
        }
    }

    fn add(&mut self, job: &str, desc: &str, ev: &mut Vec<FluxEvent>) {
        if let Some(j) = self.jobs.get_mut(job) {
            if let Ok(AddResult::Posted) = j.tracker.add(desc) {
                ev.push(FluxEvent::DependencyAdd {
                    job: job.to_string(),
                    description: desc.to_string(),
                });
            }
        }
    }

    fn remove(&mut self, job: &str, desc: &str, ev: &mut Vec<FluxEvent>) {
        if let Some(j) = self.jobs.get_mut(job) {
            if j.phase != JobPhase::Depend {
                return;
            }
            if let Ok(true) = j.tracker.remove(desc) {
                ev.push(FluxEvent::DependencyRemove {
                    job: job.to_string(),
                    description: desc.to_string(),
                });
            }
        }
        self.check_ready(job, ev);
    }

    fn check_ready(&mut self, job: &str, ev: &mut Vec<FluxEvent>) {
        if let Some(j) = self.jobs.get_mut(job) {
            if j.phase == JobPhase::Depend && j.tracker.is_satisfied() {
                j.phase = JobPhase::Released;
                ev.push(FluxEvent::Ready {
                    job: job.to_string(),
                });
            }
        }
    }

    fn fatal(&mut self, job: &str, reason: String, ev: &mut Vec<FluxEvent>) {
        let Some(j) = self.jobs.get_mut(job) else {
            return;
        };
        if j.phase != JobPhase::Depend {
            return;
        }
        j.tracker.raise_fatal(reason.clone());
        ev.push(FluxEvent::Fatal {
            job: job.to_string(),
            reason,
        });
        // The job becomes inactive without running; its dependents react.
        self.inactive(job, Outcome::Cancelled, false, ev);
    }

    /// Re-post `dependency-add` for `job` (e.g. after a restart), with the
    /// RFC's duplicate rules.
    pub fn readd(&mut self, job: &str, description: &str) -> Result<AddResult, EventError> {
        match self.jobs.get_mut(job) {
            Some(j) => j.tracker.add(description),
            None => Err(EventError::UnknownJob(job.to_string())),
        }
    }

    /// The tracker of a job.
    pub fn tracker(&self, job: &str) -> Option<&DependencyTracker> {
        self.jobs.get(job).map(|j| &j.tracker)
    }

    /// True if `job` left DEPEND (and has not failed in DEPEND).
    pub fn is_ready(&self, job: &str) -> bool {
        self.jobs.get(job).is_some_and(|j| {
            matches!(j.phase, JobPhase::Released | JobPhase::Running)
                || matches!(j.phase, JobPhase::Inactive { started: true, .. })
        })
    }

    /// `job` entered RUN and posted `start`.
    pub fn job_started(&mut self, job: &str) -> Vec<FluxEvent> {
        let mut ev = Vec::new();
        if let Some(j) = self.jobs.get_mut(job) {
            if matches!(j.phase, JobPhase::Released | JobPhase::Depend) {
                j.phase = JobPhase::Running;
            }
        }
        let waiting: Vec<(String, String, Wait)> = match self.waiters.get_mut(job) {
            Some(w) => {
                let (start, rest): (Vec<_>, Vec<_>) =
                    w.drain(..).partition(|(_, _, k)| *k == Wait::Start);
                *w = rest;
                start
            }
            None => Vec::new(),
        };
        for (dep, desc, _) in waiting {
            self.remove(&dep, &desc, &mut ev);
        }
        ev
    }

    /// `job` reached INACTIVE with `outcome` (`started`: it posted `start`).
    pub fn job_inactive(&mut self, job: &str, outcome: Outcome, started: bool) -> Vec<FluxEvent> {
        let mut ev = Vec::new();
        self.inactive(job, outcome, started, &mut ev);
        ev
    }

    fn inactive(&mut self, job: &str, outcome: Outcome, started: bool, ev: &mut Vec<FluxEvent>) {
        let mut work = vec![(job.to_string(), outcome, started)];
        while let Some((job, outcome, started)) = work.pop() {
            let Some(j) = self.jobs.get_mut(&job) else {
                continue;
            };
            if matches!(j.phase, JobPhase::Inactive { .. }) {
                continue;
            }
            let started = started || j.phase == JobPhase::Running;
            j.phase = JobPhase::Inactive { outcome, started };
            if outcome == Outcome::Succeeded {
                self.symbols.prune(&job);
            }
            let phase = JobPhase::Inactive { outcome, started };
            for (dep, desc, wait) in self.waiters.remove(&job).unwrap_or_default() {
                match Self::verdict(&phase, wait) {
                    Some(Ok(())) => self.remove(&dep, &desc, ev),
                    Some(Err(why)) => {
                        let Some(d) = self.jobs.get_mut(&dep) else {
                            continue;
                        };
                        if d.phase != JobPhase::Depend {
                            continue;
                        }
                        let reason = format!(
                            "dependency {} can never be satisfied: job {job} {why}",
                            desc.split('@').next().unwrap_or(&desc)
                        );
                        d.tracker.raise_fatal(reason.clone());
                        ev.push(FluxEvent::Fatal {
                            job: dep.clone(),
                            reason,
                        });
                        work.push((dep, Outcome::Cancelled, false));
                    }
                    None => {}
                }
            }
        }
    }

    /// Advance the clock: satisfy `begin-time` dependencies due by `now`.
    pub fn tick(&mut self, now: f64) -> Vec<FluxEvent> {
        let mut ev = Vec::new();
        let now_bits = if now.is_finite() && now >= 0.0 {
            now.to_bits()
        } else {
            0
        };
        let due: Vec<(u64, u64)> = self
            .timers
            .range(..=(now_bits, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            if let Some((job, desc)) = self.timers.remove(&k) {
                self.remove(&job, &desc, &mut ev);
            }
        }
        ev
    }
}
