# Shared by the search recipes (sourced, not run): the knowledge base of OUT, ENTITIES and SEED, and its BM25
# retrieval service on 127.0.0.1:PORT, started here (its process id kept, stopped when the script exits, however
# it exits) unless RETRIEVER_URL names a running service of yours (Search-R1's contract). Returns once the
# service answers /health; RETRIEVER_URL then names it.
mkdir -p "$OUT"
"$PYTHON" -m reinforce_pro.search.knowledge --out "$OUT/kb" --entities "$ENTITIES" --seed "$SEED"

if [[ -z "$RETRIEVER_URL" ]]; then
    "$PYTHON" -m reinforce_pro.search.retriever --corpus "$OUT/kb/corpus.jsonl" --port "$PORT" &
    SERVICE_PID=$!
    trap 'kill "$SERVICE_PID" 2>/dev/null || true' EXIT
    RETRIEVER_URL="http://127.0.0.1:$PORT"
fi
"$PYTHON" - "$RETRIEVER_URL" <<'PY'
import sys, time
from reinforce_pro.search.retriever import RetrieverClient, RetrieverError
client, deadline = RetrieverClient(sys.argv[1], timeout=2), time.time() + 60
while True:
    try:
        print(f"[search] service up: {client.health()['passages']} passages at {client.url}")
        break
    except RetrieverError as e:
        if time.time() > deadline:
            sys.exit(f"[search] {e}")
        time.sleep(0.5)
PY
