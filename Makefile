# rayemb — the two commands a newcomer needs: `make run` and `make test`.
.PHONY: install run test test-fast bench clean-data help

PY := .venv/bin/python
PYTEST_ARGS ?=
# two pytest-xdist workers: one runs the Ray jobs and clusters one after another, the other every other test
# beside them (tests/conftest.py says which and why); PYTEST_WORKERS= runs the suite in one process
PYTEST_WORKERS ?= -n 2 --dist loadgroup
# extra arguments for the job, e.g. make run ARGS="--set train.epochs=3"
ARGS ?=

help:
	@echo "make run        install if needed, generate data, start a local Ray head, submit jobs/train.py"
	@echo "                (job arguments: make run ARGS=\"--set train.epochs=3\")"
	@echo "make test       install if needed and run the whole test suite (slow tests included)"
	@echo "make test-fast  the suite without tests marked slow"

install:
	@bash scripts/install.sh

run: install
	@bash scripts/run.sh $(ARGS)

# pytest exits 5 when it collects no test: that must not pass.
test: install
	@t0=$$(date +%s); $(PY) -m pytest $(PYTEST_WORKERS) $(PYTEST_ARGS); rc=$$?; \
	echo "make test: the suite took $$(( $$(date +%s) - t0 )) s (exit $$rc)"; \
	if [ $$rc -eq 5 ]; then echo "make test: no tests were collected" >&2; exit 1; fi; exit $$rc

test-fast: install
	@$(PY) -m pytest $(PYTEST_WORKERS) -m "not slow" $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test-fast: no tests were collected" >&2; exit 1; fi; exit $$rc

clean-data:
	rm -rf data/synth_small
