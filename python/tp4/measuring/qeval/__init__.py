"""`tp4 qeval`: the line's quality suite (docs/qeval.md).

:mod:`tp4.measuring.qeval.checks` holds the scorers (pure: an answer in, a verdict out), :mod:`tp4.measuring.qeval.tasks`
the tasks, :mod:`tp4.measuring.qeval.sandbox` the throwaway container model-generated code runs in (on a
worker, never the head) and :mod:`tp4.measuring.qeval.suite` the run, its results and the baseline."""
