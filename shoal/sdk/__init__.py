"""The client SDK: `Client` sends jobs to a cluster's router over ZeroMQ and reads their
results; `EmbeddingSet` reads an embedding job's output. `pip install shoal` is enough
for it (no torch)."""
