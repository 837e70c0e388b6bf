"""The GPU check (benchmarks/gpu/README.md): `bash benchmarks/gpu/run.sh OUT_DIR` on a GPU machine."""
