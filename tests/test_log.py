"""The multistart logger's own handler, and the root logger's handlers it leaves alone."""

import contextlib
import logging

from multistart.common import log


@contextlib.contextmanager
def bare_root(monkeypatch):
    """The root logger with no handler and the multistart logger with none of its own, as in
    a fresh process; both as they were afterwards. Yields the root logger. (A context inside
    the test, not a fixture: pytest adds its capture handlers to the root after fixtures run.)"""
    root = logging.getLogger()
    saved = list(root.handlers)
    for h in saved:
        root.removeHandler(h)
    monkeypatch.setattr(log, "_own_handler", None)
    try:
        yield root
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)
        if log._own_handler is not None:
            log.logger.removeHandler(log._own_handler)


def test_no_duplicate_log_lines_once_the_root_logger_has_a_handler(monkeypatch):
    with bare_root(monkeypatch) as root:
        log.configure()
        own = log._own_handler
        assert own is not None and own in log.logger.handlers
        root.addHandler(logging.NullHandler())  # e.g. absl, imported with orbax
        log.configure()
        assert own not in log.logger.handlers and log._own_handler is None


def test_absls_bare_root_handler_is_not_taken_for_an_applications(monkeypatch):
    # absl calls logging.basicConfig() the first time it logs (orbax logs through absl): our
    # lines then lost their timestamps, or printed twice.
    monkeypatch.setattr(log.logger, "propagate", True)
    with bare_root(monkeypatch) as root:
        logging.basicConfig()  # what absl does
        log.configure()
        own = log._own_handler
        assert own is not None and own in log.logger.handlers
        assert log.logger.propagate is False  # absl's handler would print each line again
        app = logging.StreamHandler()
        app.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        root.addHandler(app)  # an application's own configuration
        log.configure()
        assert own not in log.logger.handlers and log._own_handler is None
        assert log.logger.propagate is True
