"""wdsfilter: safe, loud, memory-aware filtering and scoring of WebDataset shards."""

__version__ = "0.1.0"
