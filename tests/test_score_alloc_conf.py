"""Model processes use PyTorch's expandable segments unless the user configured the allocator
(on an H100, gpu_check step 2: fragmentation made workers hold 16-31% more than the plan's
allocated peaks). The setting is made in each model process itself, before CUDA starts (here two
CPU replicas: model processes of their own, as on a GPU); a process that scores in-process on the
CPU is left as it was."""
import json
import os

import pytest

from filterkit import REPO, gnu_tar_shards, run_cli

KITS = os.pathsep.join([os.path.join(REPO, "tests"), REPO])


def allocator_settings(tmp_path, **user):
    shard = gnu_tar_shards(str(tmp_path), [3])[0]
    record = tmp_path / "alloc.json"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")}
    env.update(user, PYTHONPATH=KITS)
    r = run_cli("score", shard, "--scorer", "scorekit:AllocConfScorer", "--scorer-opt", f"allocconf.record={record}",
                "--out", str(tmp_path / "out"), "--device", "cpu", "--replicas", "2", "--no-progress", env=env)
    assert r.returncode == 0, r.stderr
    return json.loads(record.read_text())


def test_a_model_process_gets_expandable_segments_by_default(tmp_path):
    assert allocator_settings(tmp_path) == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                                            "PYTORCH_ALLOC_CONF": None}


@pytest.mark.parametrize("name", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_the_users_allocator_settings_are_kept(tmp_path, name):
    got = allocator_settings(tmp_path, **{name: "garbage_collection_threshold:0.8"})
    other = ({"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"} - {name}).pop()
    assert got == {name: "garbage_collection_threshold:0.8", other: None}
