"""Dataset sources of captioned media: each lists its items and fingerprints what it reads."""
