# Shoal: `make demo` and `make test` do all the set-up on a fresh machine.
PY ?= python3
STAMP := .make/installed
DEMO_DIR ?= demo-out

.PHONY: install test demo bench-generate clean

# torch 2.13.0 is pinned here (a local CPU wheel on the dev machines); pyproject accepts
# any torch >= 2.4 so a GPU host keeps its CUDA build.
$(STAMP): pyproject.toml
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

bench-generate: $(STAMP)
	$(PY) scripts/bench_generate.py

clean:
	rm -rf .make $(DEMO_DIR)
