"""Where starts come from: the strategies, user starts and the broad-start filter
(:mod:`~multistart.starts.strategies`), the queue a freed slot's next start comes from
(:mod:`~multistart.starts.queues`), TikTak's blended starts (:mod:`~multistart.starts.tiktak`)
and what puts new starts into freed slots (:mod:`~multistart.starts.refill`)."""
