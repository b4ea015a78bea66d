"""The device side: everything that builds, compiles, places and calls a program.

The fused per-start step and the chunk step (:mod:`~multistart.device.step`), the flat or
pytree layout of a start (:mod:`~multistart.device.layout`), how rows are dealt into
compiled calls (:mod:`~multistart.device.backends`), where the population lives
(:mod:`~multistart.device.placement`), the only object that steps
(:mod:`~multistart.device.sweeper`), chunk bookkeeping in NumPy
(:mod:`~multistart.device.chunking`), the program cache and the out-of-memory back-off
(:mod:`~multistart.device.programs`, :mod:`~multistart.device.oom`), the filter's value program
(:mod:`~multistart.device.evaluator`), several processes (:mod:`~multistart.device.distributed`)
and the compilation cache (:mod:`~multistart.device.cache`)."""
