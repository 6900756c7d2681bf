"""Search-augmented multi-turn RL (docs/agents.md): a generated knowledge base (`knowledge`), a BM25
retrieval service with Search-R1's request / response shape and its client (`retriever`). The agent that uses
them is examples/python/agent_search.py."""
