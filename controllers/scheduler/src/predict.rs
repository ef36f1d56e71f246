//! Runtime prediction: how long a job will really run, learned from the runtimes of the
//! same user's (and the same user's same job name's) finished jobs.
//!
//! Users' walltime requests are poor estimates (most jobs use a fraction of what they
//! request), so reservations and backfill checks made on them leave holes that shorter
//! jobs could have filled. With prediction on, the cycle plans on predicted runtimes:
//! a pending job's reservation and backfill check, a running job's expected end. The
//! **kill time never changes**: a job still runs until its own walltime (the agent
//! enforces `status.walltimeSeconds`, stamped from the request), so a wrong guess costs
//! other jobs some waiting, never a user their work. A prediction is never above the
//! walltime, and a running job that outlives its prediction gets a corrected one
//! ([`Correction`]).
//!
//! An estimator is a [`RuntimeEstimator`]: a name and one pure function over a
//! [`RuntimeHistory`]. Every estimator is registered in [`ESTIMATORS`], the one list the
//! profile's `prediction.estimator` names are resolved against.
//!
//! ```
//! use lattice_scheduler::predict::{self, RuntimeHistory, RuntimeKey};
//!
//! let mut h = RuntimeHistory::default();
//! let key = RuntimeKey { user: Some(7), name: Some(1) };
//! h.record(key, 600, 3600);
//! h.record(key, 1000, 3600);
//! let est = predict::estimator("user-last2").expect("registered");
//! // The mean of the user's last two runtimes, never above the request.
//! assert_eq!(est.predict(&h, &key, 3600), Some(800));
//! assert_eq!(est.predict(&h, &key, 700), Some(700));
//! ```

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::model::Time;

/// Who ran a job, for its runtime history: the user and the job's name, each as a dense
/// id the caller interns exactly (the live adapter from the `lattice.dev/user`
/// annotation and `spec.tags.name`, `rm-replay` from the SWF user and executable
/// numbers). `None`: unknown, no history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct RuntimeKey {
    pub user: Option<u32>,
    pub name: Option<u32>,
}

/// Runtimes kept per user and per (user, job name): the estimators use at most this many
/// (the newest first).
pub const RECENT: usize = 4;

/// The newest runs of one user or one (user, job name), newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Recent {
    /// `(runtime_s, walltime_s)` of the newest runs, newest first; only `len` are valid.
    runs: [(u32, u32); RECENT],
    len: u8,
}

impl Recent {
    /// `(runtime_s, walltime_s)` of the kept runs, newest first.
    pub fn runs(&self) -> &[(u32, u32)] {
        &self.runs[..usize::from(self.len)]
    }

    fn push(&mut self, runtime_s: u32, walltime_s: u32) {
        self.runs.copy_within(0..RECENT - 1, 1);
        self.runs[0] = (runtime_s, walltime_s);
        self.len = (usize::from(self.len) + 1).min(RECENT) as u8;
    }
}

/// What finished jobs ran for, per user and per (user, job name). Fed by `rm-replay` as
/// jobs end and by the live scheduler from the store (written by the release controller
/// when an allocation's nodes come back).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RuntimeHistory {
    users: HashMap<u32, Recent>,
    jobs: HashMap<(u32, u32), Recent>,
}

/// Seconds as the history keeps them (a u32 holds 136 years).
fn secs(s: i64) -> u32 {
    s.clamp(0, i64::from(u32::MAX)) as u32
}

impl RuntimeHistory {
    /// A job of `key` ran `runtime_s` seconds of the `walltime_s` it requested.
    pub fn record(&mut self, key: RuntimeKey, runtime_s: i64, walltime_s: i64) {
        let (r, w) = (secs(runtime_s), secs(walltime_s));
        if let Some(u) = key.user {
            self.users.entry(u).or_default().push(r, w);
            if let Some(n) = key.name {
                self.jobs.entry((u, n)).or_default().push(r, w);
            }
        }
    }

    /// Runs of `user`, oldest first, as read back from the store (the newest `RECENT` are
    /// kept).
    pub fn load_user(&mut self, user: u32, runs: &[(i64, i64)]) {
        let e = self.users.entry(user).or_default();
        for &(r, w) in runs {
            e.push(secs(r), secs(w));
        }
    }

    /// Runs of `user`'s jobs called `name`, oldest first (as [`Self::load_user`]).
    pub fn load_job(&mut self, user: u32, name: u32, runs: &[(i64, i64)]) {
        let e = self.jobs.entry((user, name)).or_default();
        for &(r, w) in runs {
            e.push(secs(r), secs(w));
        }
    }

    /// The user's newest runs, newest first (empty without history).
    pub fn user(&self, user: u32) -> &[(u32, u32)] {
        self.users.get(&user).map_or(&[], Recent::runs)
    }

    /// The newest runs of the user's jobs with this name, newest first.
    pub fn job(&self, user: u32, name: u32) -> &[(u32, u32)] {
        self.jobs.get(&(user, name)).map_or(&[], Recent::runs)
    }

    /// Users with history.
    pub fn users(&self) -> usize {
        self.users.len()
    }

    /// (user, job name) pairs with history.
    pub fn jobs(&self) -> usize {
        self.jobs.len()
    }
}

/// A runtime estimator: from a job's history key and its walltime request, how long it
/// will run. Implementations are pure and stateless; their state is the history.
pub trait RuntimeEstimator: Sync {
    /// The name profiles use (`prediction.estimator`).
    fn name(&self) -> &'static str;
    /// One line for `lattice admin vcluster show` and the docs.
    fn describe(&self) -> &'static str;
    /// The predicted runtime in seconds, at least 1 and never above `walltime_s`; `None`
    /// when the history says nothing about this job (the walltime is planned on).
    fn predict(&self, history: &RuntimeHistory, key: &RuntimeKey, walltime_s: i64) -> Option<i64>;
}

/// Mean of the newest two runtimes (one when only one is known).
fn mean_last2(runs: &[(u32, u32)]) -> Option<i64> {
    match runs {
        [] => None,
        [a] => Some(i64::from(a.0)),
        [a, b, ..] => Some((i64::from(a.0) + i64::from(b.0) + 1) / 2),
    }
}

fn capped(p: Option<i64>, walltime_s: i64) -> Option<i64> {
    p.map(|p| p.clamp(1, walltime_s.max(1)))
}

/// Tsafrir, Etsion and Feitelson (EASY++): the mean of the user's last two runtimes.
struct UserLast2;

impl RuntimeEstimator for UserLast2 {
    fn name(&self) -> &'static str {
        "user-last2"
    }
    fn describe(&self) -> &'static str {
        "mean of the user's last two runtimes, capped by the walltime"
    }
    fn predict(&self, h: &RuntimeHistory, key: &RuntimeKey, walltime_s: i64) -> Option<i64> {
        capped(mean_last2(h.user(key.user?)), walltime_s)
    }
}

/// The same, from the user's runs of the same job name when there are any (a user's
/// different applications run for very different times), else from all the user's runs.
struct UserJobLast2;

impl RuntimeEstimator for UserJobLast2 {
    fn name(&self) -> &'static str {
        "user-job-last2"
    }
    fn describe(&self) -> &'static str {
        "mean of the last two runtimes of the user's jobs of the same name (else of all the \
         user's jobs), capped by the walltime"
    }
    fn predict(&self, h: &RuntimeHistory, key: &RuntimeKey, walltime_s: i64) -> Option<i64> {
        let user = key.user?;
        let by_name = key.name.map_or(&[][..], |n| h.job(user, n));
        let runs = if by_name.is_empty() {
            h.user(user)
        } else {
            by_name
        };
        capped(mean_last2(runs), walltime_s)
    }
}

/// The walltime × the mean fraction of their walltimes the user's last two jobs ran.
/// Users request in round numbers and scale requests with the work; the fraction they
/// over-ask by is steadier than the runtime itself.
fn fraction_last2(runs: &[(u32, u32)], walltime_s: i64) -> Option<i64> {
    let used = |r: &(u32, u32)| f64::from(r.0) / f64::from(r.1.max(1));
    let n = runs.len().min(2);
    if n == 0 {
        return None;
    }
    let mean = runs[..n].iter().map(used).sum::<f64>() / n as f64;
    Some((mean.min(1.0) * walltime_s as f64).ceil() as i64)
}

/// The walltime scaled by the user's recent fraction used.
struct UserFraction2;

impl RuntimeEstimator for UserFraction2 {
    fn name(&self) -> &'static str {
        "user-fraction2"
    }
    fn describe(&self) -> &'static str {
        "the walltime times the mean fraction of their walltimes the user's last two jobs ran"
    }
    fn predict(&self, h: &RuntimeHistory, key: &RuntimeKey, walltime_s: i64) -> Option<i64> {
        capped(fraction_last2(h.user(key.user?), walltime_s), walltime_s)
    }
}

/// The same, from the user's runs of the same job name when there are any.
struct UserJobFraction2;

impl RuntimeEstimator for UserJobFraction2 {
    fn name(&self) -> &'static str {
        "user-job-fraction2"
    }
    fn describe(&self) -> &'static str {
        "the walltime times the mean fraction of their walltimes the last two of the user's \
         jobs of the same name (else of all the user's jobs) ran"
    }
    fn predict(&self, h: &RuntimeHistory, key: &RuntimeKey, walltime_s: i64) -> Option<i64> {
        let user = key.user?;
        let by_name = key.name.map_or(&[][..], |n| h.job(user, n));
        let runs = if by_name.is_empty() {
            h.user(user)
        } else {
            by_name
        };
        capped(fraction_last2(runs, walltime_s), walltime_s)
    }
}

/// Every estimator, by name: the one place an estimator is registered.
pub static ESTIMATORS: &[&dyn RuntimeEstimator] =
    &[&UserLast2, &UserJobLast2, &UserFraction2, &UserJobFraction2];

/// The registered estimator called `name`.
pub fn estimator(name: &str) -> Option<&'static dyn RuntimeEstimator> {
    ESTIMATORS.iter().copied().find(|e| e.name() == name)
}

/// What a running job's prediction becomes once it has run longer than predicted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Correction {
    /// The walltime: the job is planned on as if never predicted (EASY's assumption).
    #[default]
    Walltime,
    /// Tsafrir et al.: the expired prediction grows by 1 min, then 5 min, 15 min, 30 min,
    /// 1 h, 2 h, 5 h, 10 h, 20 h, 50 h, 100 h, … each time it expires, capped by the
    /// walltime.
    Gradual,
    /// The expired prediction doubles each time it expires, capped by the walltime.
    Double,
}

/// The steps of [`Correction::Gradual`], in seconds; the last one repeats.
const GRADUAL_STEPS: [i64; 11] = [
    60, 300, 900, 1800, 3600, 7200, 18_000, 36_000, 72_000, 180_000, 360_000,
];

impl Correction {
    /// The runtime planned on for a job predicted to run `predicted_s` that has run
    /// `elapsed_s` of its `walltime_s`: the prediction while it has not expired, then the
    /// correction; always above the elapsed time unless the walltime itself is reached,
    /// never above the walltime.
    pub fn runtime(self, predicted_s: i64, elapsed_s: i64, walltime_s: i64) -> i64 {
        let wall = walltime_s.max(1);
        let p = predicted_s.clamp(1, wall);
        if elapsed_s < p {
            return p;
        }
        let corrected = match self {
            Correction::Walltime => wall,
            Correction::Gradual => {
                let mut c = p;
                let mut k = 0;
                while c <= elapsed_s && c < wall {
                    c = c.saturating_add(GRADUAL_STEPS[k.min(GRADUAL_STEPS.len() - 1)]);
                    k += 1;
                }
                c
            }
            Correction::Double => {
                let mut c = p;
                while c <= elapsed_s && c < wall {
                    c = c.saturating_mul(2);
                }
                c
            }
        };
        corrected.min(wall)
    }
}

/// When the reservations plan running work to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RunningEnds {
    /// At its kill time (start + walltime): the latest it can end. A reservation then
    /// starts no later than EASY's would, and a backfilled job that runs longer than
    /// predicted delays it by no more than that job's walltime.
    #[default]
    Walltime,
    /// When predicted (corrected once expired): EASY++'s earlier, less certain starts.
    Predicted,
}

/// The prediction part of a scheduler profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PredictionConfig {
    /// A registered estimator's name ([`ESTIMATORS`]); `None`: plan on walltimes.
    pub estimator: Option<String>,
    /// What an expired prediction becomes.
    pub correction: Correction,
    /// When reservations plan running work to end.
    pub running_ends: RunningEnds,
    /// A job holding the first reservation (EASY's head) that has waited longer than this
    /// gets EASY's guarantee: the cycle plans its backfill checks on walltimes, so no
    /// wrong prediction can delay it further. `None`: never (predictions always).
    pub guarantee_after_s: Option<i64>,
}

impl Default for PredictionConfig {
    /// Off: reservations and backfill on the users' walltimes (EASY).
    fn default() -> Self {
        PredictionConfig {
            estimator: None,
            correction: Correction::Walltime,
            running_ends: RunningEnds::Walltime,
            guarantee_after_s: None,
        }
    }
}

impl PredictionConfig {
    /// The `hpc-backfill` setting, chosen on the four traces of the scheduler README
    /// (first 10,000 jobs each): candidates are checked on `user-fraction2` predictions,
    /// reservations wait for running work's kill times, a head job waiting over 66 hours
    /// gets EASY's guarantee, and an expired prediction grows in Tsafrir's steps (with
    /// kill-time reservations it only moves the start shown to users, which it makes the
    /// most accurate).
    pub fn hpc_backfill() -> Self {
        PredictionConfig {
            estimator: Some("user-fraction2".to_string()),
            correction: Correction::Gradual,
            running_ends: RunningEnds::Walltime,
            guarantee_after_s: Some(66 * 3600),
        }
    }

    /// EASY++ as Tsafrir, Etsion and Feitelson describe it: the mean of the user's last
    /// two runtimes, running work planned on its (gradually corrected) prediction.
    pub fn easy_plus_plus() -> Self {
        PredictionConfig {
            estimator: Some("user-last2".to_string()),
            correction: Correction::Gradual,
            running_ends: RunningEnds::Predicted,
            guarantee_after_s: None,
        }
    }

    /// Whether prediction is on (an estimator is named).
    pub fn enabled(&self) -> bool {
        self.estimator.is_some()
    }
}

/// Predictions of one cycle: the estimator, the history it reads and the correction.
#[derive(Clone, Copy)]
pub(crate) struct Predictor<'a> {
    estimator: &'a dyn RuntimeEstimator,
    history: &'a RuntimeHistory,
    correction: Correction,
}

impl<'a> Predictor<'a> {
    /// `None` when prediction is off or has no history to read (plan on walltimes).
    pub(crate) fn new(
        config: &PredictionConfig,
        history: Option<&'a RuntimeHistory>,
    ) -> Option<Self> {
        let estimator = estimator(config.estimator.as_deref()?)?;
        Some(Predictor {
            estimator,
            history: history?,
            correction: config.correction,
        })
    }

    /// The runtime a job that has not started is planned on.
    pub(crate) fn pending(&self, key: &RuntimeKey, walltime_s: i64) -> i64 {
        let wall = walltime_s.max(1);
        self.estimator
            .predict(self.history, key, wall)
            .map_or(wall, |p| p.clamp(1, wall))
    }

    /// When a job started at `start` is expected to end, seen at `now`.
    pub(crate) fn running_end(
        &self,
        key: &RuntimeKey,
        start: Time,
        now: Time,
        walltime_s: i64,
    ) -> Time {
        let wall = walltime_s.max(0);
        let Some(p) = self.estimator.predict(self.history, key, wall.max(1)) else {
            return start.saturating_add(wall);
        };
        let elapsed = now.saturating_sub(start).max(0);
        start.saturating_add(self.correction.runtime(p, elapsed, wall).min(wall))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(user: u32, name: Option<u32>) -> RuntimeKey {
        RuntimeKey {
            user: Some(user),
            name,
        }
    }

    #[test]
    fn user_last2_is_the_mean_of_the_two_newest_runs() {
        let mut h = RuntimeHistory::default();
        let e = estimator("user-last2").expect("registered");
        assert_eq!(e.predict(&h, &key(1, None), 3600), None, "no history");
        h.record(key(1, None), 100, 3600);
        assert_eq!(e.predict(&h, &key(1, None), 3600), Some(100));
        h.record(key(1, None), 300, 3600);
        h.record(key(1, None), 501, 3600);
        // 300 and 501: the oldest run is forgotten; the mean rounds up.
        assert_eq!(e.predict(&h, &key(1, None), 3600), Some(401));
        // Capped by the request, and at least a second.
        assert_eq!(e.predict(&h, &key(1, None), 60), Some(60));
        h.record(key(2, None), 0, 0);
        assert_eq!(e.predict(&h, &key(2, None), 3600), Some(1));
        // Another user's history is not this one's.
        assert_eq!(e.predict(&h, &key(3, None), 3600), None);
        assert_eq!(
            e.predict(&h, &RuntimeKey::default(), 3600),
            None,
            "unknown user"
        );
    }

    #[test]
    fn user_job_last2_prefers_the_same_job_name() {
        let mut h = RuntimeHistory::default();
        let e = estimator("user-job-last2").expect("registered");
        h.record(key(1, Some(10)), 7000, 7200);
        h.record(key(1, Some(11)), 60, 7200);
        h.record(key(1, Some(11)), 80, 7200);
        assert_eq!(e.predict(&h, &key(1, Some(10)), 7200), Some(7000));
        assert_eq!(e.predict(&h, &key(1, Some(11)), 7200), Some(70));
        // A name never seen: the user's two newest runs (80, 60).
        assert_eq!(e.predict(&h, &key(1, Some(12)), 7200), Some(70));
        assert_eq!(e.predict(&h, &key(1, None), 7200), Some(70));
        // The same name of another user is another job.
        assert_eq!(e.predict(&h, &key(2, Some(10)), 7200), None);
    }

    #[test]
    fn history_keeps_the_newest_runs_and_loads_oldest_first() {
        let mut h = RuntimeHistory::default();
        for r in 1..=6 {
            h.record(key(1, Some(2)), r, 100);
        }
        assert_eq!(h.user(1), &[(6, 100), (5, 100), (4, 100), (3, 100)]);
        assert_eq!(h.job(1, 2), h.user(1));
        let mut loaded = RuntimeHistory::default();
        loaded.load_user(
            1,
            &[(1, 100), (2, 100), (3, 100), (4, 100), (5, 100), (6, 100)],
        );
        loaded.load_job(1, 2, &[(3, 100), (4, 100), (5, 100), (6, 100)]);
        assert_eq!(loaded, h);
        assert_eq!((h.users(), h.jobs()), (1, 1));
    }

    #[test]
    fn every_registered_estimator_has_a_unique_name() {
        let mut names: Vec<&str> = ESTIMATORS.iter().map(|e| e.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ESTIMATORS.len());
        for e in ESTIMATORS {
            assert!(std::ptr::eq(
                estimator(e.name()).expect("found") as *const dyn RuntimeEstimator as *const u8,
                *e as *const dyn RuntimeEstimator as *const u8
            ));
            assert!(!e.describe().is_empty());
        }
        assert!(estimator("no-such-estimator").is_none());
    }

    #[test]
    fn corrections_follow_their_ladders() {
        // Not expired: the prediction.
        for c in [
            Correction::Walltime,
            Correction::Gradual,
            Correction::Double,
        ] {
            assert_eq!(c.runtime(600, 599, 7200), 600);
        }
        assert_eq!(Correction::Walltime.runtime(600, 600, 7200), 7200);
        // 600 + 60 = 660, + 300 = 960, + 900 = 1860.
        assert_eq!(Correction::Gradual.runtime(600, 600, 7200), 660);
        assert_eq!(Correction::Gradual.runtime(600, 700, 7200), 960);
        assert_eq!(Correction::Gradual.runtime(600, 960, 7200), 1860);
        assert_eq!(Correction::Gradual.runtime(600, 7000, 7200), 7200);
        assert_eq!(Correction::Double.runtime(600, 600, 7200), 1200);
        assert_eq!(Correction::Double.runtime(600, 2500, 7200), 4800);
        assert_eq!(Correction::Double.runtime(600, 5000, 7200), 7200);
        // Past the walltime (a job the agent is stopping): the walltime.
        assert_eq!(Correction::Gradual.runtime(600, 9000, 7200), 7200);
    }

    proptest! {
        /// A corrected prediction is never above the walltime, and lies beyond the elapsed
        /// time whenever the walltime does (a running job is never planned as ended while
        /// it may still run).
        #[test]
        fn corrections_stay_within_elapsed_and_walltime(
            p in -10i64..200_000, elapsed in 0i64..400_000, wall in 1i64..300_000,
        ) {
            for c in [Correction::Walltime, Correction::Gradual, Correction::Double] {
                let r = c.runtime(p, elapsed, wall);
                prop_assert!(r <= wall && r >= 1);
                if elapsed < wall {
                    prop_assert!(r > elapsed, "{c:?}: {r} <= elapsed {elapsed}");
                }
            }
        }

        /// Every estimator's prediction lies in [1, walltime].
        #[test]
        fn predictions_never_exceed_the_walltime(
            runs in prop::collection::vec((0i64..1_000_000, 0i64..1_000_000, 0u32..3), 0..12),
            wall in 1i64..500_000, name in prop::option::of(0u32..3),
        ) {
            let mut h = RuntimeHistory::default();
            for (r, w, n) in runs {
                h.record(key(1, Some(n)), r, w);
            }
            for e in ESTIMATORS {
                if let Some(p) = e.predict(&h, &key(1, name), wall) {
                    prop_assert!((1..=wall).contains(&p), "{}: {p}", e.name());
                }
            }
        }
    }
}
