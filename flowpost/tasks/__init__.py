"""One plain function per node kind: paths in, paths and manifests out. No Prefect here."""
