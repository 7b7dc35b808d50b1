# The two commands of a fresh machine:  make predict   and   make test
PROMPT ?= Once upon a time
.PHONY: bootstrap predict test serve validate bench doc-tables
bootstrap:
	@scripts/bootstrap.sh
predict:  # needs only .venv: the extra Pythons' venvs are the tests'
	@SKIP_EXTRA_PYTHONS=1 scripts/bootstrap.sh
	@.venv/bin/trtllm-truss predict . --prompt "$(PROMPT)"
# The import contracts (the layers), then every suite (scripts/test_suites.sh, which says in what order, side by
# side): the whole suite on Python 3.11 (.venv, with CPU torch), everything that needs no torch on each extra Python
# (.venv-py3.X; torch-marked tests skip there), and the NVIDIA image environments once.
EXTRA_PYTHONS ?= 3.10 3.12 3.13
test: bootstrap
	@echo "== Import contracts (pyproject.toml [tool.importlinter], docs/design.md)"
	@PYTHONPATH=packages .venv-lint/bin/lint-imports --no-cache
	@scripts/test_suites.sh "$(PYTEST_ARGS)" $(EXTRA_PYTHONS)
serve: bootstrap
	@.venv/bin/trtllm-truss serve .
validate: bootstrap
	@.venv/bin/trtllm-truss validate .
bench: bootstrap
	@.venv/bin/trtllm-truss bench . --compare
# Rewrite the docs' tables that the code decides (images, examples, backends x features, model families);
# make test fails while the committed docs differ from them (tests/unit/test_doc_tables.py).
doc-tables: bootstrap
	@.venv/bin/python -m trtllm_truss.commands.doc_tables
