"""The host side of a fit: its options (:mod:`~multistart.host.config`), identity and
checkpoints, the driver that runs one fit top to bottom, the engine, the host loop and its pure
decisions, the run state, the schedules, the Result's assembly, a search's parts (a fit split
in parts or over processes, and the parts through an engine's ``submit``:
:mod:`~multistart.host.parts`) and the progress display."""
