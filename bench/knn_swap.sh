#!/usr/bin/env bash
# The KNN rebuild job submitted twice with `ray job submit` to a local Ray while the Serve app
# answers traffic: the second publish swaps under the live router; every request must succeed.
#
#   bash bench/knn_swap.sh [WORKDIR]      # default: a fresh temporary directory
#
# Starts its own head (`ray start --head`, token auth off for a loopback-only demo), deploys the
# app with `serve deploy`, runs a client in the background, submits the job twice and prints a
# summary (requests, non-200 answers, KNN versions seen). Stops everything it started.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-$(mktemp -d)}"
mkdir -p "$WORK"
export RAY_AUTH_MODE=disabled RAY_DEDUP_LOGS=1 PYTHONPATH="$ROOT"
GCS_PORT=6390 DASH_PORT=8275 HTTP_PORT=8010
export RAY_ADDRESS="http://127.0.0.1:$DASH_PORT"

cleanup() {
  [[ -n "${CLIENT_PID:-}" ]] && kill "$CLIENT_PID" 2>/dev/null || true
  if [[ -n "${HEAD_PID:-}" ]]; then  # `ray start --block` stops its node on SIGTERM
    kill -TERM "$HEAD_PID" 2>/dev/null || true
    wait "$HEAD_PID" 2>/dev/null || true
    # the head leaves its address behind; a later `serve run` would try to join it
    { grep -qs ":$GCS_PORT" /tmp/ray/ray_current_cluster && rm -f /tmp/ray/ray_current_cluster; } || true
  fi
}
trap cleanup EXIT

echo "== data and artifacts in $WORK"
[[ -f "$WORK/data/meta.json" ]] || solaris data --out "$WORK/data" --interactions 20000 >/dev/null
[[ -f "$WORK/artifacts/manifest.json" ]] || \
  solaris train --dataset synthetic --data-dir "$WORK/data" --out "$WORK/artifacts" >/dev/null
cat > "$WORK/app.yaml" <<EOF
knn: {table_uri: "$WORK/knn", poll_s: 1.0}
EOF
cat > "$WORK/serve.yaml" <<EOF
proxy_location: HeadOnly
http_options: {host: 127.0.0.1, port: $HTTP_PORT}
applications:
  - name: solaris
    route_prefix: /
    import_path: serve_app:build_app
    args: {config: "$WORK/app.yaml", artifacts: "$WORK/artifacts", app_id: knnswap}
EOF

echo "== ray start --head"
# the app holds 1.4 logical CPUs; Ray Data's shuffle tasks ask for 1 CPU each: 3 logical
ray start --head --block --num-cpus 3 --port "$GCS_PORT" --dashboard-port "$DASH_PORT" \
  --include-dashboard true > "$WORK/head.log" 2>&1 &
HEAD_PID=$!
for _ in $(seq 60); do ray job list >/dev/null 2>&1 && break; sleep 2; done
ray job list >/dev/null 2>&1 || { echo "the head did not start: see $WORK/head.log"; exit 1; }

echo "== serve deploy"
serve deploy --address "$RAY_ADDRESS" "$WORK/serve.yaml"
for _ in $(seq 90); do curl -sf "localhost:$HTTP_PORT/healthz" >/dev/null && break; sleep 2; done
curl -sf "localhost:$HTTP_PORT/healthz" || { echo "the app did not come up"; exit 1; }; echo

echo "== client"
python - "$HTTP_PORT" "$WORK/client.json" <<'EOF' &
import json, sys, time, signal, numpy as np, requests
port, out = sys.argv[1], sys.argv[2]
rng, stats, stop = np.random.default_rng(0), {"requests": 0, "non_200": 0, "versions": []}, []
signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
while not stop:
    body = {"user_id": int(rng.integers(600)), "task": "click",
            "candidates": rng.choice(400, 50, replace=False).tolist()}
    try:
        r = requests.post(f"http://127.0.0.1:{port}/rank", json=body, timeout=10)
        ok, v = r.status_code == 200, r.json()["versions"]["knn"] if r.status_code == 200 else None
    except Exception:
        ok, v = False, None
    stats["requests"] += 1
    stats["non_200"] += not ok
    if v is not None and (not stats["versions"] or stats["versions"][-1] != v):
        stats["versions"].append(v)
    json.dump(stats, open(out, "w"))
    time.sleep(0.02)
EOF
CLIENT_PID=$!

for run in 1 2; do
  echo "== ray job submit #$run"
  ray job submit --working-dir "$ROOT" \
    --runtime-env-json '{"excludes": [".venv", ".git", "runs", "**/__pycache__"]}' -- \
    python jobs/rebuild_knn.py --data "$WORK/data" --artifacts "$WORK/artifacts" \
    --out "$WORK/knn" --encoder-cpus 0.1 --task-cpus 0.1 --set knn.k=20 2>&1 | grep -E "published|Job '.*' (succeeded|failed)|Error" || true
  sleep 4
  curl -s "localhost:$HTTP_PORT/healthz"; echo
done
sleep 2
kill "$CLIENT_PID"; sleep 1
echo "== client summary"
cat "$WORK/client.json"; echo
python -c "import json,sys; s=json.load(open(sys.argv[1])); sys.exit(0 if s['non_200']==0 and len([v for v in s['versions'] if v])>=2 else 1)" "$WORK/client.json" \
  && echo "PASS: both publishes served, no failed request" || { echo "FAIL"; exit 1; }
serve shutdown --address "$RAY_ADDRESS" -y >/dev/null 2>&1 || true
