//! Dependency strings: Lattice `--depends-on`, Slurm `--dependency`, and Flux
//! RFC 26 URI-like forms. The grammar is the API's ([`lattice_apis::syntax::deps`]);
//! the DAG core names its parts as it always has: [`Condition`] is
//! [`lattice_apis::DependencyCondition`], [`SymbolAccess`] is
//! [`lattice_apis::SymbolType`], [`Dependency`] is a parsed dependency string
//! ([`lattice_apis::syntax::deps::DependencyExpr`]).

pub use lattice_apis::syntax::deps::{
    is_ident_char, parse_depends_on, parse_flux_dependency, parse_flux_uri, parse_slurm_dependency,
    DependencyExpr as Dependency, FluxDependency, ParseError, FLUX_SCHEMES,
};
pub use lattice_apis::{DependencyCondition as Condition, SymbolScope, SymbolType as SymbolAccess};
