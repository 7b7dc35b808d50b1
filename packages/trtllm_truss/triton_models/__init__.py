"""Triton python-backend models: each `<name>/model.py` is copied into the rendered repository
(`trtllm_truss.repository.render`) and runs inside a Triton python stub, never imported from here."""
