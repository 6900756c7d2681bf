"""A search self-play task whose every valid question is learnable, for the end-to-end test: a briefly
warm-started solver is rarely right, so under the built-in thresholds (some right, some wrong) a two-step run
may keep no question, and its update would hold proposer rows only. Here every valid proposal's episodes are
trained beside the proposals. Run by examples/scripts/train_search_selfplay.sh with TASK_PATH set."""

import os

from reinforce_pro.selfplay.search_task import SearchTask


class AllLearnable(SearchTask):
    name = "search"
    thresholds = {"completion": (0.5, 0.0, 1.0)}  # any share of right answers, none included


TASK = AllLearnable(os.environ["SEARCH_SELFPLAY_KB"], os.environ["SEARCH_RETRIEVER_URL"])
