# The two quick-start commands (README): `make demo` and `make test`. Each sets itself up the first time.
VENV := .venv
LAUNCH := $(VENV)/bin/launch
export LAUNCH_HOME ?= $(HOME)/.launch
export TORCH_EXTENSIONS_DIR ?= $(CURDIR)/.cache/torch_extensions

.PHONY: demo test lint ops bytecode setup setup-test

setup:
	@scripts/setup.sh

setup-test:
	@scripts/setup.sh --test

demo: setup
	$(LAUNCH) submit jobs/cifar10_convnet.yaml
	$(LAUNCH) status --last

# Four pytest workers (pytest-xdist) share the machine's two cores: the suite waits more than it computes (three
# workers kept them about half busy: 22 CPU-minutes in a 26-minute run), and the wall time is the work over the
# workers once no bed's tests alone take longer (each bed's are about a quarter of the work); tests that need the
# machine-wide beds (namespaced hosts, Slurm, Ray, podman) run by bed, each bed on one worker, and a module whose
# fixture runs jobs on one worker (tests/conftest.py). TEST_WORKERS=0: one process.
TEST_WORKERS ?= 4
test: setup-test
	@$(MAKE) --no-print-directory -j3 lint ops bytecode
	$(VENV)/bin/python -m pytest -q -p no:cacheprovider --durations=25 -n $(TEST_WORKERS) $(PYTEST_ARGS)

# The checkers (rules and reasons in pyproject.toml): ruff, then mypy at the Python floor.
lint: setup-test
	$(VENV)/bin/ruff check launcher tests scripts tools
	$(VENV)/bin/mypy

# DeepSpeed's CPU ops (the comm op, cpu_adam for zero3_offload), built once into TORCH_EXTENSIONS_DIR while
# the checkers run (a fresh clone's first DeepSpeed test would otherwise build them, with the other worker's
# first one waiting on torch's build lock; a lock file an interrupted build left is removed). About 1.5 min of CPU.
ops: setup-test
	@$(VENV)/bin/python -c "from tests.helpers import build_deepspeed_ops_before_the_suite as build; build()"

# Where PYTHONDONTWRITEBYTECODE is set (CI's machines) every process compiles again the modules it imports from
# source, and the suite starts thousands: bytecode written here once, while the checkers run, for launcher's modules
# (each CLI, supervisor or agent start: about 0.15 s of CPU), the test modules as pytest rewrites their asserts
# (every xdist worker rewrote all of them: 13.6 s of CPU to collect the suite, 5 s with them written) and what
# the ranks import that the install left uncompiled (transformers, Lightning, DeepSpeed, Accelerate: 1.4-3.5 s a process).
bytecode: setup-test
	@$(VENV)/bin/python -m compileall -q launcher tests tools >/dev/null
	@PYTHONDONTWRITEBYTECODE= $(VENV)/bin/python -m pytest -q -p no:cacheprovider --collect-only >/dev/null
	@PYTHONDONTWRITEBYTECODE= DS_ACCELERATOR=cpu $(VENV)/bin/python -c "import accelerate, deepspeed, lightning, transformers; \
		from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, GPT2LMHeadModel, Trainer, TrainingArguments"
