"""Pure core (no Beam): mechanisms, secure noise, accounting, ledger, partition selection,
local DP and continual observation."""
