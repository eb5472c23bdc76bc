"""Pure core (no Beam): hierarchies, lattice, privacy models, search, metrics, risk."""
