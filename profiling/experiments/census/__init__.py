"""The compile census: where a fit's compile time goes, cold and warm.

Each cell (a factor graph of one or several bands, :mod:`.cells`) is compiled under each
transform (one start's value_and_grad, a vmap of it, a ``lax.map`` of it, and the engine's own
chunk step swept in Python, :mod:`.probe`) in a fresh process with a fresh persistent
compilation cache (cold), then again in another fresh process with that cache (warm). The parent
(:mod:`.runner`) runs each child under the harness's caps (``profiling/harness.py``'s
``run_child``: a time cap per phase the child announces, a memory cap), writes one
JSON row per measurement, and renders them as a markdown table (:mod:`.report`).

Run it from the repository root: ``python -m profiling.experiments.census --help`` (and see
``profiling/experiments/jax_compile/README.md``).
"""
