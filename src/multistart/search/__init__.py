"""The searches a user makes: :mod:`~multistart.search.gradient` (MultiStartGradient and the
named rules) and :mod:`~multistart.search.least_squares` (MultiStartLeastSquares), each class a
rule and the options (:mod:`~multistart.search.core`)."""
