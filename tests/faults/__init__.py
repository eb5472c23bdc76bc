"""Helpers of the fault corpus (tests/test_faults.py): child processes killed on purpose."""
