"""One example of every message type: round-trip tests and golden fixtures use these."""

EXAMPLES = {
    "Hello": ({"role": "worker", "node_id": "w-1", "model": "Qwen3ForCausalLM:abc", "capabilities": {"kv_blocks": 4096}}, {}),
    "Ready": ({"role": "scheduler", "node_id": "s-1", "model": ""}, {}),
    "Error": ({"code": "bad_version", "message": "protocol 2.0 is not compatible with 1.0", "about": "Hello"}, {}),
    "Ping": ({"sent_at": 12.5}, {}),
    "Pong": ({"sent_at": 12.5}, {}),
    "SubmitJob": ({"job_key": "k-1", "program": "generate", "params": {"max_tokens": 8},
                   "items": [{"id": 1, "prompt": "hi"}], "input_path": ""}, {"items_jsonl": b'{"id": 2, "prompt": "yo"}\n'}),
    "JobAccepted": ({"job_id": "j-1", "job_key": "k-1", "total": 2, "duplicate": False}, {}),
    "JobStatusQuery": ({"job_id": "j-1"}, {}),
    "JobStatus": ({"job_id": "j-1", "state": "running", "total": 2, "done": 1, "failed": 0, "tokens_per_s": 10.0}, {}),
    "Subscribe": ({"job_id": "j-1", "offset": 0}, {}),
    "ResultBatch": ({"job_id": "j-1", "offset": 0, "records": [{"id": 1, "text": "x", "token_ids": [5]}], "final": True}, {}),
    "CancelJob": ({"job_id": "j-1"}, {}),
    "AssignSequences": ({"epoch": 7, "job_id": "j-1", "sequences": [{"seq_id": "j-1/1", "prompt_token_ids": [1, 2]}]}, {}),
    "ProgressReport": ({"node_id": "w-1", "finished": ["j-1/1"], "stats": {"tokens": 12}}, {}),
    "SequenceState": ({"state": {"seq_id": "j-1/1", "num_computed": 3}}, {"kv": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      "}),
    "WriteResults": ({"job_id": "j-1", "records": [{"id": 1, "text": "x"}]}, {}),
    "WriteAck": ({"job_id": "j-1", "written": 1, "duplicates": 0}, {}),
}
