//! `lattice-agent`: the Lattice node agent.
