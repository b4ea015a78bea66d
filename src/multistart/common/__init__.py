"""What every other package uses and none imports from: the logger and progress lines
(:mod:`~multistart.common.log`), the per-start :class:`~multistart.common.status.Status`,
hyperparameter checks that name the argument (:mod:`~multistart.common.checks`), compile
counting from JAX's monitoring events (:mod:`~multistart.common.monitor`), the hashes a
search's identity is made of (:mod:`~multistart.common.digest`) and the options every program
is compiled with (:mod:`~multistart.common.xla`)."""
