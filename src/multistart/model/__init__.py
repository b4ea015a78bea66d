"""What a search fits: priors and spaces (:mod:`~multistart.model.priors`), the checked problem
and its one trace (:mod:`~multistart.model.problem`), and factor graphs of per-dataset
likelihoods (:mod:`~multistart.model.graph`). Nothing here knows how a fit runs."""
