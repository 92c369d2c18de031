"""Storage: bytes in and out, below every reader of samples. Which shards and how they are opened
(local files, `pipe:` commands, object stores and web servers through fsspec: remote*.py), a tar's
headers and members copied as stored (tars.py), compressed shards, conditional writes of whole
objects, atomic files and checked outputs, and the files beside written shards (sizes.json)."""
