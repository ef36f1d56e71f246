//! lattice-compat: the pure parsing and translation library behind
//! `lattice submit` and the Slurm front-end (`sbatch`, `squeue`, `scancel`,
//! `sinfo`, `sacct` aliases).
//!
//! * [`translate`]: batch script (`#SBATCH` / `#LATTICE` directives) +
//!   [`SubmitFlags`] (command line, wins) + [`CompatConfig`]
//!   (`lattice-compat.yaml`) → Allocation manifest JSON + [`Warning`]s.
//! * [`constraints`]: `--constraint` expressions → `resources.constraints`
//!   (`features` and `anyOf` groups).
//! * [`directives`]: sbatch's directive rules (which lines count, quoting,
//!   getopt-style options).
//! * [`values`]: parsers for `--time`, `--array`, `--constraint`, `--gres`,
//!   `--nodes`, `--dependency`, ... with errors that say what, where and how to fix.
//! * [`names`]: Slurm account and partition names as tenant and vCluster names.
//! * [`slurm`]: Slurm command-line translation, `squeue -o` formatting,
//!   `SLURM_*` environment; [`hostlist`]: `nid[001-004,007]`.
//!
//! Nothing here does I/O.
//!
//! ```
//! use lattice_compat::{translate, CompatConfig, SubmitFlags};
//!
//! let compat = CompatConfig::from_yaml("partitions: {gpu: ml-training}\nqos: {high: 7}\n").unwrap();
//! let script = "#!/bin/bash\n#SBATCH -N 4\n#SBATCH --time=1-00:00:00\n#SBATCH -p gpu\n#SBATCH --mem=64G\nsrun ./app\n";
//! let flags = SubmitFlags { tenant: Some("physics".into()), ..Default::default() };
//! let t = translate(script, &flags, &compat).unwrap();
//! assert_eq!(t.allocation["spec"]["resources"]["nodes"], 4);
//! assert_eq!(t.allocation["spec"]["lifecycle"]["walltime"], "24:00:00");
//! assert_eq!(t.allocation["spec"]["vcluster"], "ml-training");
//! assert_eq!(t.allocation["metadata"]["namespace"], "physics");
//! assert_eq!(
//!     t.warnings[0].to_string(),
//!     "#SBATCH --mem=64G ignored (Lattice uses full-node scheduling, memory is not constrainable)"
//! );
//! assert_eq!(t.warnings[0].source.line(), Some(5));
//! ```

pub mod config;
pub mod constraints;
pub mod directives;
pub mod error;
pub mod flags;
pub mod hostlist;
pub mod names;
pub mod slurm;
pub mod translate;
pub mod values;

pub use config::{CompatConfig, PartitionMatch};
pub use error::{Source, SubmitError, ValueError, Warning};
pub use flags::SubmitFlags;
pub use translate::{translate, ClientOptions, Translation};
