# Shoal: `make demo` and `make test` do all the set-up on a fresh machine.
PY ?= python3
STAMP := .make/installed
DEMO_DIR ?= demo-out

CLUSTER_FILE ?= cluster.toml
HOST ?= $(shell hostname -s)

.PHONY: install test demo bench-generate clean cluster-up cluster-down

# torch 2.13.0 is pinned here (a local CPU wheel on the dev machines); pyproject accepts
# any torch >= 2.4 so a GPU host keeps its CUDA build.
# iproute2 (`ip`) makes the network namespaces of the partition test.
$(STAMP): pyproject.toml
	@command -v ip >/dev/null || (apt-get update -qq && apt-get install -y -qq iproute2)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[worker,node,dev]"
	@mkdir -p .make && touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(PY) -m shoal.cli make-model --preset tiny --out $(DEMO_DIR)/model-tiny --dtype float32
	$(PY) scripts/make_prompts.py --out $(DEMO_DIR)/prompts.jsonl --count 64
	$(PY) -m shoal.cli generate --model $(DEMO_DIR)/model-tiny --input $(DEMO_DIR)/prompts.jsonl \
		--output $(DEMO_DIR)/results.jsonl --max-tokens 48
	@echo "results: $(DEMO_DIR)/results.jsonl"

# This host's nodes from the cluster file (see shoal/cluster_file.py for its schema).
cluster-up: $(STAMP)
	$(PY) -m shoal.cli cluster-up --file $(CLUSTER_FILE) --host $(HOST)

cluster-down:
	$(PY) -m shoal.cli cluster-down --file $(CLUSTER_FILE) --host $(HOST)

bench-generate: $(STAMP)
	$(PY) scripts/bench_generate.py

clean:
	rm -rf .make $(DEMO_DIR)
