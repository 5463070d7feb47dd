"""kernelsat.driver: the layer above the stages, the only place that knows the whole
pipeline.

The optimize pipeline (`pipeline`), the evaluation backends that run candidate jobs
locally or on Ray (`jobs`, `backends`, `ray_backend`) and the ship gate that decides
what may ship (`jobs.gate_backend`), reports and output folders (`report`, `outputs`),
and the stages' CLI commands (`commands`; `kernelsat.cli` assembles them with the learning
commands). It imports the core and every stage; no stage imports it (tests/test_layers.py
enforces this; docs/architecture.md draws the layers).
"""
