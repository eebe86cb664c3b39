"""Dataset sources of captioned images: each lists its items and fingerprints the files it reads."""
