"""Pure core (no Beam): mechanisms, secure noise, accounting, ledger, local DP, continual observation."""
