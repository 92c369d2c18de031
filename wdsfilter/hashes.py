"""`wdsfilter.hashes`, the documented import path of media/hashes.py: this name is that module (every
attribute, the same objects), kept for code written against it."""
import sys

from .media import hashes as _module

sys.modules[__name__] = _module
