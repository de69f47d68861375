"""The storage node and its parts: job input, result logs, checkpoints, the job log, corpora and the index shards it serves."""
