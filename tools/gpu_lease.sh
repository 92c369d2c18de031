#!/usr/bin/env bash
# tools/gpu_check.py inside a short GPU lease (the workplace's `device` tool; ../shared/GPU_CHECKLIST.md).
# The leased machine's image has PyTorch, torchvision, pillow, pyarrow, opencv ... but not
# webdataset, open_clip, easyocr or Ray, and no network: the caller carries them in .whl/ (wheels
# for its Python, a slimmed Ray as ray-slim.tar.xz, the tiny CLIP as tiny-clip/: tools/gpu_wheels.sh
# makes them). This installs
# them into /tmp/site, runs the steps in the order given under a deadline (a step that would not
# fit is skipped, not cut off), and leaves under $OUT: table.json (written after every step),
# log.txt, gpu.txt and runs.tgz (each run's output folder and its OUT.log with command and stderr).
#
#   bash tools/gpu_lease.sh [STEPS] [DEADLINE_SECONDS]     # defaults: 7,1,2,3,5,4,6 and 420
set -u
STEPS=${1:-7,1,2,3,5,4,6}
DEADLINE=${2:-420}
OUT=${OUT:-/tmp/gpu-lease-out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
if [ -f .whl/ray-slim.tar.xz ]; then
    tar -xJf .whl/ray-slim.tar.xz -C /tmp/site 2>/dev/null ||
        python3 -c "import tarfile; tarfile.open('.whl/ray-slim.tar.xz').extractall('/tmp/site')" || exit 3
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" >> "$OUT/gpu.txt" 2>&1
python3 tools/gpu_check.py --quick --only "$STEPS" --deadline "$DEADLINE" --tiny-clip .whl/tiny-clip \
    --keep /tmp/gc --json "$OUT/table.json" > "$OUT/log.txt" 2>&1
rc=$?
tail -c 6000 "$OUT/log.txt"
tar -czf "$OUT/runs.tgz" -C /tmp/gc --exclude='*.tar' --exclude='embeddings' out 2>/dev/null
exit $rc
