"""Beam PTransforms and DoFns: batched IO, summaries, recoding, DP aggregation.

Importing them memoises Beam's DoFn introspection (:mod:`.introspection`) and lets Beam's
state cache collect the module globals it leaves out of its weights once per change
(:mod:`.statecache`): a fixed ~2.3 s of every pipeline's construction and start, whatever
its size."""

from privpipe.transforms import introspection, statecache

introspection.install()
statecache.install()
