"""Data layer: typed records, acquisition, webdataset shards, condition cache, loaders."""
