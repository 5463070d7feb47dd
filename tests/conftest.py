"""Shared test configuration: hypothesis profiles (dev: fast; ci: more examples)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Tests replay warm caches and must not depend on how loaded the machine is when they
# run: timings are stored unprobed (always replayed). tests/test_timing_lock.py and
# tests/test_cache_integrity.py switch the probe on where they test it.
os.environ.setdefault("KERNELSAT_LOAD_PROBE", "off")
