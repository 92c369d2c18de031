"""The checks, one family per module, all behind the same small interface:

    a check receives one member (name, key, lower-cased extension, bytes) or one grouped sample,
    plus the shard's FindingLog, and records Findings there. It never raises on bad data.

keys.py    member names: extensions, dotfiles, dotted basenames, adjacency, duplicates
safety.py  members a default webdataset decoder would execute (never loaded here)
media.py   images (header, size guard, end-of-data check or --deep decode)
video.py   videos (PyAV: open, read the packets, cut-short check; --deep decodes every frame)
text.py    UTF-8 text and JSON members; what a sample's caption looks like to the stages
layout.py  across shards, in the parent: keys split by a shard boundary, shard count vs readers,
           uneven shard sizes
"""
