"""Beam pipelines for tests, on the runner privpipe itself uses for DirectRunner.

``beam.Pipeline()`` / ``runner="DirectRunner"`` first tries Beam's Prism runner, whose
download fails without network and leaves an empty ``/tmp/beam-temp*`` folder per
pipeline (see ``pipelines.runner.runner_for``)."""

from __future__ import annotations

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions

from privpipe.pipelines.runner import runner_for


def local_pipeline() -> beam.Pipeline:
    """A pipeline on the FnApiRunner, as ``privpipe run`` builds one for DirectRunner."""
    options = PipelineOptions()
    return beam.Pipeline(runner=runner_for(options), options=options)
