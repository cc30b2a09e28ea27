"""A served index that learns its query bank from the queries it answers, safely.

* :class:`BankReservoir` (:mod:`.reservoir`): the bounded bank of query embeddings (never the
  raw text or image): time window, per-client quotas, near-duplicate folding
  (:mod:`.folding`), a seed never fully displaced, a held-out share;
* :mod:`.refit`: the statistics of the reservoir's bank, computing only the rows not seen yet;
* :mod:`.guard`: whether a refit may be served (the hubness of held-out queries, the largest
  relative bias move);
* :class:`BankLearner` (:mod:`.learner`): the background refits through the index's versions.

``hubless serve --learn-bank NAME`` runs a learner per index named (see
docs/how-to/learn-the-bank.md).
"""

from hubless.learning.guard import GuardSettings, Judgement, judge
from hubless.learning.learner import BankLearner
from hubless.learning.reservoir import BankReservoir, Offered

__all__ = ["BankLearner", "BankReservoir", "GuardSettings", "Judgement", "Offered", "judge"]
