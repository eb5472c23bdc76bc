"""Beam PTransforms and DoFns: batched IO, summaries, recoding, DP aggregation."""
