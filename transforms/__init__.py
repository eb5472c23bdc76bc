"""Beam PTransforms and DoFns: batched IO, summaries, recoding, DP aggregation.

Importing them memoises Beam's DoFn introspection (:mod:`.introspection`): a fixed ~2 s of
every pipeline's construction and start, whatever its size."""

from privpipe.transforms import introspection

introspection.install()
