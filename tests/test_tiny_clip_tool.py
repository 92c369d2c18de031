"""tools/make_tiny_clip.py trains on the captions' own vocabulary; the saved model must be the one
that training the full 49408-token embedding gives."""
import logging

import open_clip
import pytest
import torch

from tools import make_tiny_clip as tool

pytestmark = pytest.mark.slow  # trains a model (a few steps)


def fresh_model(folder):
    tool.write_config(folder)
    torch.manual_seed(0)
    logging.disable(logging.WARNING)  # "no weights found": expected
    try:
        return open_clip.create_model("local-dir:" + folder)
    finally:
        logging.disable(logging.NOTSET)


def test_training_on_the_compact_vocabulary_equals_training_the_full_embedding(tmp_path):
    torch.set_num_threads(1)
    full, compact = fresh_model(str(tmp_path / "a")), fresh_model(str(tmp_path / "b"))
    tokenizer = open_clip.get_tokenizer("local-dir:" + str(tmp_path / "a"))
    captions = ["a red circle on a blue background", "two green squares", "a yellow triangle", "a white star"] * 4
    tokens = tokenizer(captions)
    images = torch.rand(len(captions), 3, 64, 64)
    init = {k: v.clone() for k, v in full.state_dict().items()}
    tool.train(full, images, tokens, steps=3, seconds=0, batch_size=8, lr=1e-2, seed=0, log_every=0)
    renumbered, restore = tool.compact_vocabulary(compact, tokens)
    assert int(renumbered.max()) == len(torch.unique(tokens)) - 1  # end-of-text stays the highest id
    tool.train(compact, images, renumbered, steps=3, seconds=0, batch_size=8, lr=1e-2, seed=0, log_every=0)
    restore()
    a, b = full.state_dict(), compact.state_dict()
    assert a.keys() == b.keys() and compact.token_embedding.num_embeddings == 49408
    for name in a:
        assert torch.allclose(a[name], b[name], atol=1e-5), name
    used = torch.unique(tokens)
    moved = (a["token_embedding.weight"] != init["token_embedding.weight"]).any(-1)
    # Only the captions' tokens learn; not even padding (0), which follows end-of-text and which
    # the causal mask hides from the pooled end-of-text position.
    assert moved.nonzero().flatten().tolist() == [t for t in used.tolist() if t != 0]
