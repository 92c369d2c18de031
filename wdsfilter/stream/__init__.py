"""The stream: shard URLs -> tar members -> samples -> the stages, one sample at a time, as the
validator, the scoring run and the training loader read them. The stage config (config.py), what a
member is before its bytes are used (members.py), tar -> samples (reading.py), the public stages
(stages.py, curried by curry.py), the first shard's key check (keycheck.py, census.py), the
pipeline (pipeline.py) and a loader's place in its epoch (loaderstate.py)."""
