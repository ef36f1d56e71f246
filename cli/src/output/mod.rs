//! Output: tables (kubectl's plain space-aligned style) and json/yaml/name formats.

pub mod format;
pub mod table;

pub use format::{human_age, OutputFormat};
pub use table::{Aligner, Table};
