"""Search-R1's search agent (`--agent_func_path examples/python/agent_search.py`; docs/agents.md).

Each turn the model either searches or answers, in Search-R1's tags:
    <search>home of Zorvik</search>   -> the environment answers <information>Doc 1(Title: ...) ...</information>
    <answer>Plent</answer>            -> the episode ends; reward 1.0 for an exact match (normalised), else 0.0
The first complete tag of a turn decides. A turn with neither, an empty query, or a search beyond
SEARCH_MAX_SEARCHES gets a short correction from the environment and the model acts again (up to
--agent_max_turns turns); an answer longer than 64 characters scores 0. Retrieved text is environment
tokens (action_mask 0): never trained, never in the IS correction. The environment itself is
reinforce_pro.search.agent, which the search self-play task shares.

Settings (environment variables, read when the file is loaded): SEARCH_RETRIEVER_URL (default
http://127.0.0.1:8000, the service of reinforce_pro.search.retriever), SEARCH_TOPK (3), SEARCH_INFO_CHARS
(the budget of one <information> block, 240 characters: tokens, for the built-in character tokenizer),
SEARCH_MAX_SEARCHES (4), SEARCH_TIMEOUT (5 s), SEARCH_OFF (1: every search is answered with an empty block, the
baseline "the same model without search"). A retriever that is down or answers outside the contract stops
the run with one line (reinforce_pro.search.retriever.RetrieverError).

The label (--label_key) is the answer, or JSON {"answer": ..., "gold": [passage ids]} as
reinforce_pro.search.knowledge writes it; with gold ids the hit rate is logged. Per episode (summed over turns,
logged as reward/<name>): searches, searched (0/1), hit (0/1: a gold passage was in some search's top-k),
correct (0/1), invalid (turns with neither tag).
"""

from reinforce_pro.search.agent import search_agent_from_environment

AgentInstance = search_agent_from_environment()
