"""`wdsfilter.errors`, the documented import path of core/errors.py: this name is that module (every
attribute, the same objects), kept for code written against it."""
import sys

from .core import errors as _module

sys.modules[__name__] = _module
