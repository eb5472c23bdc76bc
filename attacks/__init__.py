"""Pure core (no Beam): attacker knowledge and attacks on each kind of release."""
