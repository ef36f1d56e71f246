//! The controller: evaluates reactive allocations on their interval and writes
//! `status.scale` (desired nodes, releasing nodes, the last decision).

#[allow(unused_imports)]
use super::*;

/// In-memory state of one allocation (lost on restart or leader change: the windows
/// then start over, which only delays a decision).
#[derive(Debug, Default)]
struct Memory {
    uid: Option<String>,
    attempt: u32,
    windows: Windows,
    oscillation: Oscillation,
    last_evaluation: Option<Instant>,
    evaluations_since_write: u32,
    /// The explanation [`explain`] wrote (written once per allocation run).
    explained: Option<String>,
}

struct Ctx {
    api: Api<Allocation>,
    /// Every allocation (to see the job steps running on a node before giving it back).
    store: lattice_runtime::reflector::Store<Allocation>,
    source: Option<Arc<dyn MetricSource>>,
    metrics: ControllerMetrics,
    memory: Mutex<HashMap<String, Memory>>,
}

fn key(namespace: Option<&str>, name: &str) -> String {
    format!("{}/{name}", namespace.unwrap_or_default())
}

impl Ctx {
    /// Run `f` on the memory of `a` (reset when the allocation was re-created or
    /// re-bound).
    fn with_memory<R>(&self, a: &Allocation, f: impl FnOnce(&mut Memory) -> R) -> R {
        let mut all = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        let attempt = a.status.as_ref().map(|s| s.attempt).unwrap_or(0);
        let uid = a.uid().map(str::to_string);
        let m = all.entry(key(a.namespace(), a.name_any())).or_default();
        if m.uid != uid || m.attempt != attempt {
            *m = Memory {
                uid,
                attempt,
                ..Default::default()
            };
        }
        f(m)
    }

    /// Whether anything is remembered for `a`.
    fn remembers(&self, a: &Allocation) -> bool {
        let all = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        !all.is_empty() && all.contains_key(&key(a.namespace(), a.name_any()))
    }

    fn forget(&self, namespace: Option<&str>, name: &str) {
        let mut all = self.memory.lock().unwrap_or_else(|e| e.into_inner());
        all.remove(&key(namespace, name));
    }
}

/// Whether the autoscaler evaluates `a`: Running, reactive with a scale policy, not
/// deleting, no cancel requested.
pub fn evaluable(a: &Allocation) -> bool {
    a.phase() == AllocationPhase::Running
        && a.spec.lifecycle.type_ == LifecycleType::Reactive
        && a.spec.lifecycle.scale_policy.is_some()
        && !a.is_deleting()
        && !lifecycle::cancel_requested(a)
        // A preemption in progress cancels scaling (the seed's "Preemption During
        // Scale-Up"); its stop sequence (checkpoint signal first) is the agents'.
        && !lifecycle::preempt_requested(a)
}

/// Why a scale decision must wait on the fresh object, whatever the metric says: a node
/// failed in this attempt (a requeue or failure is under way; giving a node back now
/// would hide it), or — for a scale-down — the node to give back has not reported
/// Running yet (its agent may not know it has it) or runs a job step of the allocation
/// (`step_nodes`: the step would keep running on a released node).
pub fn scale_blocked(st: &AllocationStatus, d: &Decision, step_nodes: &[String]) -> Option<String> {
    let failed = st.assigned_nodes.iter().find(|n| {
        st.node_states
            .get(*n)
            .is_some_and(|r| r.attempt == st.attempt && r.phase == NodeTaskPhase::Failed)
    });
    if let Some(n) = failed {
        return Some(format!(
            "node {n} failed; no scaling until the allocation recovers"
        ));
    }
    let Decision::ScaleDown { desired, .. } = d else {
        return None;
    };
    for n in st.assigned_nodes.iter().skip(*desired as usize) {
        let running = st
            .node_states
            .get(n)
            .is_some_and(|r| r.attempt == st.attempt && r.phase == NodeTaskPhase::Running);
        if !running {
            return Some(format!(
                "scale-down waits: node {n} has not reported its process running yet"
            ));
        }
        if step_nodes.contains(n) {
            return Some(format!(
                "scale-down waits: a job step of the allocation runs on node {n}"
            ));
        }
    }
    None
}

/// `fresh` is still the object `seen` was (same uid and attempt) and still evaluable.
fn same_run(fresh: &Allocation, seen: &Allocation) -> bool {
    evaluable(fresh)
        && fresh.uid() == seen.uid()
        && fresh.status.as_ref().map(|s| s.attempt) == seen.status.as_ref().map(|s| s.attempt)
}

/// `status.scale`, initialised on first sight (`desiredNodes` = assigned nodes).
fn scale_of(st: &mut AllocationStatus) -> &mut ScaleStatus {
    let assigned = st.assigned_nodes.len() as u32;
    st.scale.get_or_insert_with(|| ScaleStatus {
        desired_nodes: assigned,
        ..Default::default()
    })
}

/// Register the autoscaler (always: without a metric source it only explains that it
/// does not scale).
pub fn register(
    host: &mut lattice_runtime::ControllerHost,
    config: AutoscalerConfig,
    metrics: ControllerMetrics,
) {
    host.register("autoscaler", move |hc: HostContext| {
        let source = config.metric_source.clone();
        let metrics = metrics.clone();
        async move {
            let controller = hc.controller::<Allocation>();
            let ctx = Arc::new(Ctx {
                api: Api::all(hc.client.clone()),
                store: controller.store(),
                source,
                metrics,
                memory: Mutex::new(HashMap::new()),
            });
            let forget = ctx.clone();
            let mine = ctx.clone();
            controller
                // Only reactive allocations with a scale policy are ever evaluated;
                // the rest of a busy kind need not wake this controller. One it still
                // remembers comes in, so that its memory is dropped.
                .filter(move |a: &Allocation| {
                    (a.spec.lifecycle.type_ == LifecycleType::Reactive
                        && a.spec.lifecycle.scale_policy.is_some())
                        || mine.remembers(a)
                })
                .on_deleted(move |r: ObjectRef| {
                    forget.forget(r.namespace.as_deref(), &r.name);
                    async {}
                })
                .run(reconcile, ctx)
                .await;
        }
    });
}

async fn reconcile(a: Arc<Allocation>, ctx: Arc<Ctx>) -> Result<Action, lattice_runtime::Error> {
    if !evaluable(&a) {
        ctx.forget(a.namespace(), a.name_any());
        return Ok(Action::await_change());
    }
    let Some(sp) = a.spec.lifecycle.scale_policy.as_ref() else {
        return Ok(Action::await_change());
    };
    let api = ctx.api.for_obj(&a);
    let Some(source) = ctx.source.clone() else {
        return explain(&ctx, &api, &a, NO_SOURCE_MESSAGE).await;
    };
    let policy = match Policy::from_spec(sp) {
        Ok(p) => p,
        Err(msg) => return explain(&ctx, &api, &a, &msg).await,
    };

    // Evaluate at most once per interval, whatever else triggers a reconcile.
    let wait = ctx.with_memory(&a, |m| {
        m.explained = None;
        m.last_evaluation.and_then(|t| {
            let since = t.elapsed();
            (since < policy.evaluation_interval).then(|| policy.evaluation_interval - since)
        })
    });
    if let Some(wait) = wait {
        return Ok(Action::requeue(wait));
    }

    let queried = tokio::time::timeout(QUERY_DEADLINE, source.query(&a, &policy.metric))
        .await
        .unwrap_or_else(|_| Err(format!("the query took longer than {QUERY_DEADLINE:?}")));
    let now = Utc::now();
    let stamp = now_truncated();
    let requeue = Action::requeue(policy.evaluation_interval);

    let value = match queried {
        Ok(v) => v,
        Err(err) => {
            ctx.metrics.autoscaling_metric_query_failures.inc();
            ctx.with_memory(&a, |m| {
                m.last_evaluation = Some(Instant::now());
                // Never scale on a window that spans an outage.
                m.windows.reset();
            });
            let mut failures = 0;
            let mut alert = false;
            api.update_status_with_retry(a.name_any(), 5, |cur| {
                if !same_run(cur, &a) {
                    return false;
                }
                let scale = scale_of(cur.status.get_or_insert_with(Default::default));
                alert = record_failure(scale);
                failures = scale.metric_failures;
                true
            })
            .await?;
            ctx.with_memory(&a, |m| m.evaluations_since_write = 0);
            if failures > 0 {
                warn!(
                    allocation = %a.object_ref(), metric = %policy.metric, failures, error = %err,
                    "autoscaling: metric query failed; skipping this evaluation (no scaling without a value)"
                );
            }
            if alert {
                error!(
                    allocation = %a.object_ref(), metric = %policy.metric, failures, error = %err,
                    "alert: autoscaling metric query failed {failures} times in a row; the allocation stays at its current size (lattice_autoscaling_metric_query_failures_total)"
                );
            }
            return Ok(requeue);
        }
    };

    let (windows, write_due) = ctx.with_memory(&a, |m| {
        m.last_evaluation = Some(Instant::now());
        m.windows.observe(&policy, value, now);
        m.evaluations_since_write += 1;
        (
            m.windows,
            m.evaluations_since_write >= WRITE_EVERY_EVALUATIONS,
        )
    });

    // Nodes running a live job step of this allocation (never given back under it).
    let step_nodes: Vec<String> = ctx
        .store
        .find(|s| {
            s.spec.step_of.as_deref() == a.metadata.name.as_deref()
                && s.namespace() == a.namespace()
                && !s.phase().is_terminal()
        })
        .iter()
        .filter_map(|s| s.status.as_ref())
        .flat_map(|st| st.assigned_nodes.iter().cloned())
        .collect();
    let mut decided: Option<Decision> = None;
    let mut wrote = false;
    api.update_status_with_retry(a.name_any(), 5, |cur| {
        decided = None;
        wrote = false;
        if !same_run(cur, &a) {
            return false;
        }
        let st = cur.status.get_or_insert_with(Default::default);
        let first_sight = st.scale.is_none();
        let before = st.scale.clone().unwrap_or_default();
        let releasing_before = st.releasing_nodes.len();
        record_success(scale_of(st), value, stamp);
        let assigned = st.assigned_nodes.len() as u32;
        let mut d = decide(
            &policy,
            st.scale.as_ref().expect("initialised"),
            assigned,
            &windows,
            value,
            now,
        );
        if let Some(why) = scale_blocked(st, &d, &step_nodes) {
            if d.direction().is_some() {
                debug!(allocation = %a.object_ref(), %why, "autoscaling: decision held");
            }
            d = Decision::Hold(HoldReason::Blocked);
        }
        apply(st, &d, stamp);
        let after = st.scale.as_ref().expect("initialised");
        let changed = first_sight
            || after.last_value != before.last_value
            || after.metric_failures != before.metric_failures
            || after.desired_nodes != before.desired_nodes
            || after.message != before.message
            || st.releasing_nodes.len() != releasing_before
            || before.last_evaluation_time.is_none();
        decided = Some(d);
        wrote = changed || write_due;
        wrote
    })
    .await?;

    if wrote {
        ctx.with_memory(&a, |m| m.evaluations_since_write = 0);
    }
    match decided {
        Some(d @ (Decision::ScaleUp { .. } | Decision::ScaleDown { .. })) => {
            let dir = d.direction().expect("a scale event");
            let oscillating = ctx.with_memory(&a, |m| {
                m.windows.reset();
                m.oscillation.record(dir)
            });
            ctx.metrics.record_scale_event(dir.as_str());
            if let Decision::ScaleUp { message, .. } | Decision::ScaleDown { message, .. } = &d {
                info!(allocation = %a.object_ref(), direction = dir.as_str(), "{message}");
            }
            if oscillating {
                ctx.metrics.autoscaling_oscillation_alerts.inc();
                warn!(
                    allocation = %a.object_ref(), metric = %policy.metric,
                    cooldown = ?policy.cooldown, target = %policy.target_text,
                    "alert: autoscaling oscillates (scale directions alternated more than {OSCILLATION_ALERT_ALTERNATIONS} times in a row); raise scalePolicy.cooldown or adjust the target"
                );
            }
        }
        Some(Decision::Hold(reason)) => {
            debug!(allocation = %a.object_ref(), value, ?reason, "autoscaling: no change");
        }
        None => {}
    }
    Ok(requeue)
}

/// Write `message` into `status.scale.message` once (initialising the scale state), and
/// wait for a change.
async fn explain(
    ctx: &Ctx,
    api: &Api<Allocation>,
    a: &Allocation,
    message: &str,
) -> Result<Action, lattice_runtime::Error> {
    let done = ctx.with_memory(a, |m| m.explained.as_deref() == Some(message));
    let current = a
        .status
        .as_ref()
        .and_then(|s| s.scale.as_ref())
        .and_then(|s| s.message.as_deref());
    if done || current == Some(message) {
        ctx.with_memory(a, |m| m.explained = Some(message.to_string()));
        return Ok(Action::await_change());
    }
    api.update_status_with_retry(a.name_any(), 5, |cur| {
        if !same_run(cur, a) {
            return false;
        }
        let scale = scale_of(cur.status.get_or_insert_with(Default::default));
        if scale.message.as_deref() == Some(message) {
            return false;
        }
        scale.message = Some(message.to_string());
        true
    })
    .await?;
    ctx.with_memory(a, |m| m.explained = Some(message.to_string()));
    Ok(Action::await_change())
}
