"""Media: what is read from an image or a video member, one opener each, with the guards every
reader needs (images.py: content Pillow must not read refused, sizes from headers, the pixel guard;
videos.py: FFmpeg's demuxers and decoders bounded; frames.py: frames sampled from a clip), and what
is computed from pixels alone (hashes.py: sha256, phash; masking.py: text boxes filled)."""
