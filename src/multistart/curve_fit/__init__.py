"""``curve_fit``: scipy's interface, many starts, and the data as arguments of the program.

The residuals ``(f(x, *p) - y) / sigma`` take ``(x, y, sigma)`` as an argument of the compiled
step, so a refit of the same ``f`` on data of the same shapes compiles nothing. ``batched=True``:
one search whose row ``r`` fits dataset ``r // n_starts``. docs/curve-fit.md explains the rest.

The package's modules, top to bottom (each imports only from those below it):

- ``fit``: the entry, scipy's signature and full output;
- ``single``, ``batch``: one dataset's fit, and a stack of datasets as one search;
- ``starts``, ``hold``: where the starts come from; held (fixed and tied) parameters;
- ``covariance``, ``arguments``: curve_fit's ``pcov``; scipy's arguments read and checked;
- ``model``: ``f`` traced once, the residuals as the search's model.
"""

from ..result.batch import BatchFits as BatchFits
from .fit import curve_fit as curve_fit

__all__ = ["curve_fit", "BatchFits"]
