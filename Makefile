# The two commands of a fresh machine:  make predict   and   make test
PROMPT ?= Once upon a time
.PHONY: bootstrap predict test serve validate bench
bootstrap:
	@scripts/bootstrap.sh
predict: bootstrap
	@.venv/bin/trtllm-truss predict . --prompt "$(PROMPT)"
test: bootstrap
	@.venv/bin/python -m pytest $(PYTEST_ARGS)
serve: bootstrap
	@.venv/bin/trtllm-truss serve .
validate: bootstrap
	@.venv/bin/trtllm-truss validate .
bench: bootstrap
	@.venv/bin/trtllm-truss bench . --compare
