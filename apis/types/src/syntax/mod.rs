//! The string grammars of the API, each defined once: what users write in manifests
//! and on command lines, and what every component that reads such a string calls.
//!
//! * [`duration`] — walltimes, delays, grace periods: `24h`, `1h30m`, `72:00:00`,
//!   `1-12:00:00`, a bare number of minutes;
//! * [`tasks`] — task ranges (job arrays): `0-99`, `0-15:4`, `1,3,5-7`, and `RANGE%N`;
//! * [`deps`] — dependency strings: `--depends-on` (`prep:success`), Slurm
//!   `--dependency` (`afterok:1:2`, `after:3+10`, `singleton`) and Flux RFC 26
//!   (`afterok:ID`, `begin-time:T`, `string:NAME?type=in`);
//! * [`uenv`] — software environments: `prgenv-gnu/24.11:v1,tools/1.0` and views.
//!
//! Slurm-only syntax that no manifest takes (`--time`'s `D-HH:MM:SS` without range
//! checks, `?` any-of lists, `ID_TASK`) is read by `lattice-compat` on top of these.

pub mod deps;
pub mod duration;
pub mod image;
pub mod tasks;
pub mod uenv;
