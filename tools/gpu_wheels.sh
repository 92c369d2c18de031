#!/usr/bin/env bash
# Fills .whl/ (git-ignored) with what tools/gpu_lease.sh installs on a leased GPU machine whose image
# has Python 3.12 and PyTorch but no network: wheels of the packages the image lacks, Ray slimmed to
# fit the lease's 64 MiB transfer limit (no jars, RLlib, Serve, Tune, Train, LLM or dashboard client:
# 79 MB -> 29 MB), and the tiny CLIP (built here if models/tiny-clip is missing). Run it here, where
# pip reaches the registry. Versions: this checkout's virtual environment's.
set -eu
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
version() { "$PY" -m pip show "$1" 2>/dev/null | awk '/^Version/{print $2}'; }
mkdir -p .whl
platforms="--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
specs=""
for name in webdataset braceexpand open_clip_torch ftfy wcwidth easyocr python-bidi pyclipper shapely \
            jsonschema jsonschema-specifications referencing rpds-py; do
    specs="$specs $name==$(version "$name")"
done
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
    -d .whl $specs
ray=$(version ray)
work=$(mktemp -d)
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
    -d "$work" "ray==$ray"
(cd "$work" && unzip -q ray-*.whl && rm -rf ray/jars ray/rllib ray/dashboard/client ray/serve ray/tune ray/train \
    ray/llm && find ray -name '*.map' -delete && tar -cf - ray ray-*.dist-info | xz -T0 -6 > ray-slim.tar.xz)
mv "$work/ray-slim.tar.xz" .whl/
rm -rf "$work"
[ -d models/tiny-clip ] || "$PY" tools/make_tiny_clip.py
rm -rf .whl/tiny-clip && cp -r models/tiny-clip .whl/tiny-clip
du -sh .whl
