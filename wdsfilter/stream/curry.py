"""Picklable curried stages, as webdataset's `pipelinefilter` makes them, without importing
webdataset: importing webdataset imports torch where torch is installed (webdataset/pytorch.py),
and the configuration checks that need no model (keys on the first shard) must answer before that.

    read = pipelinefilter(_read)      # read(cfg, tally) is a stage: stage(samples) -> samples

The stages stay plain callables, so webdataset's DataPipeline composes them like its own.
"""
from __future__ import annotations


class FilterFunction:
    """f with every argument but the first bound: a picklable stage (f is module-level)."""

    def __init__(self, f, *args, **kw):
        self.f, self.args, self.kw = f, args, kw

    def __call__(self, data):
        return self.f(data, *self.args, **self.kw)

    def __repr__(self):
        return f"<{self.f.__name__} {self.args} {self.kw}>"


class RestCurried:
    def __init__(self, f):
        self.f = f

    def __call__(self, *args, **kw) -> FilterFunction:
        return FilterFunction(self.f, *args, **kw)


def pipelinefilter(f) -> RestCurried:
    """Turn f(data, *args, **kw) into a stage factory: pipelinefilter(f)(*args, **kw)(data)."""
    return RestCurried(f)


def compose(source, stages):
    """Run `stages` over `source` in order, without a DataPipeline (no webdataset import)."""
    data = source
    for stage in stages:
        data = stage(data)
    return data
