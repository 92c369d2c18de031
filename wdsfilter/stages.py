"""`wdsfilter.stages`, the documented import path of stream/stages.py: this name is that module (every
attribute, the same objects), kept for code written against it."""
import sys

from .stream import stages as _module

sys.modules[__name__] = _module
