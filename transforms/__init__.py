"""Beam PTransforms and DoFns: batched IO, summaries, recoding, DP aggregation.

Importing them memoises Beam's DoFn introspection (:mod:`.introspection`) and lets Beam's
state cache collect the module globals it leaves out of its weights once per change
(:mod:`.statecache`): a fixed ~2.3 s of every pipeline's construction and start, whatever
its size. It also shortens Beam's state-sampling period (:mod:`.statesampler`), so a
bundle's end does not wait out the sampler's sleep (up to 0.2 s a bundle)."""

from privpipe.transforms import introspection, statecache, statesampler

introspection.install()
statecache.install()
statesampler.install()
