"""The row field a scorer hands its embeddings over in, for the modules not yet importing it from
runfolder/embeddings.py (the Ray engine's, moved on when it is next edited)."""
from ..runfolder.embeddings import FIELD  # noqa: F401
