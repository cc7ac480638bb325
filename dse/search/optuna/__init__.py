"""The optuna and nested strategies on Optuna's public API: the strategy (``strategy``, its
loop steps ``run``), the study's bookkeeping (``study``, ``segments``), enqueued trials
(``enqueue``) and the short runs' surrogate (``surrogate``)."""
