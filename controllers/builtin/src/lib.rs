//! Lattice's built-in controllers.
