#!/usr/bin/env bash
# make demo: runs the wordcount example (two Rust operators, checkpointing every
# second) on its bundled input with bin/streamd, shows that the final checkpoint
# committed the output exactly once, where the output is, the top 10 words, and
# checks the output against the expected file. Then it checks, and prints, the
# two-terminal recipe that runs the same job on a streamd server.
# `make demo` builds bin/streamd and the wasm modules first.
set -euo pipefail
cd "$(dirname "$0")/.."

STREAMD=${STREAMD:-bin/streamd}
JOB=examples/wasm/wordcount/wordcount.yaml
DIR=$(dirname "$JOB")
OUT=$DIR/out
CKPT=$DIR/checkpoints

for f in "$STREAMD" "$DIR/split.wasm" "$DIR/count.wasm"; do
	if [[ ! -e $f ]]; then
		echo "demo: $f is missing; run 'make demo' (it builds bin/streamd and the wasm modules)" >&2
		exit 1
	fi
done

# With checkpointing every committed file is part-<subtask>-<checkpoint>: a
# previous run's files would add to this one's.
TRACES=$DIR/traces.json
rm -rf "$OUT" "$CKPT" "$TRACES"

echo "== $STREAMD run --tracing --tracing-protocol file --tracing-endpoint $TRACES $JOB"
"$STREAMD" run --progress log --tracing --tracing-protocol file --tracing-endpoint "$TRACES" "$JOB"

echo
echo "== the final checkpoint: $STREAMD inspect $CKPT/"
"$STREAMD" inspect "$CKPT/" | sed 's/^/   /'
# Every operator "fully" finished in the latest checkpoint: the job ended with a
# final checkpoint taken after all input was processed, and the file sink
# committed what it wrote on that checkpoint (two-phase commit), once.
unfinished=$("$STREAMD" inspect "$CKPT/" | awk 'seen && $4 != "fully" {print $1} /^OPERATOR/ {seen=1}')
if [[ -n $unfinished ]]; then
	echo "FAIL: operators not fully finished in the final checkpoint: $unfinished" >&2
	exit 1
fi
echo "   every operator finished before the final checkpoint completed: the sink committed all records exactly once"

echo
echo "== output: $(cd "$OUT" && pwd)/ ($(ls "$OUT" | paste -sd " " -))"
echo "== top 10 words (word count):"
# Each output line is "word count".
cat "$OUT"/part-* | sort -k2,2nr -k1,1 | head -n 10 | sed 's/^/   /'

echo
if diff <(cat "$OUT"/part-* | LC_ALL=C sort) <(LC_ALL=C sort "$DIR/expected.txt") >/dev/null; then
	echo "OK: output matches $DIR/expected.txt ($(cat "$OUT"/part-* | wc -l | tr -d ' ') words)"
else
	echo "FAIL: output differs from $DIR/expected.txt:" >&2
	diff <(cat "$OUT"/part-* | LC_ALL=C sort) <(LC_ALL=C sort "$DIR/expected.txt") | head -n 20 >&2
	exit 1
fi

echo
names=$(sed -n 's/^{"Name":"\([^"]*\)".*/\1/p' "$TRACES")
spans=$(grep -c . <<<"$names" || true)
checkpoints=$(grep -cx checkpoint <<<"$names" || true)
echo "== traces: $(cd "$(dirname "$TRACES")" && pwd)/$(basename "$TRACES") ($spans spans, $checkpoints checkpoint trace(s); one JSON object per line)"
echo "   spans by name: $(sort <<<"$names" | uniq -c | sort -rn | awk '{printf "%s x%s, ", $2, $1}' | sed 's/, $//')"
echo "   To see a checkpoint's spans as a waterfall, no Jaeger needed: the web console of streamd run or streamd server"
echo "   (its URL is logged at start; --http 127.0.0.1:8081 for a fixed port): open a job, then a checkpoint's 'waterfall' link"
echo "   (GET /jobs/{id}/checkpoints/{cid}/trace; docs/observability.md, \"Web console\")."
echo "   Optionally, in Jaeger: make bin/jaeger; bin/jaeger --config tools/jaeger/jaeger-loopback.yaml &"
echo "   then streamd run --tracing --tracing-endpoint http://127.0.0.1:4317 ... and open http://127.0.0.1:16686"

# The cluster recipe, checked before it is printed: a server on a free port
# with its own data directory, the job deployed from a copy of the example
# (so this check writes nothing into examples/), its output compared.
tmp=$(mktemp -d)
server_pid=""
cleanup() {
	if [[ -n $server_pid ]]; then
		kill "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT

cluster_check() {
	cp -r "$DIR" "$tmp/wordcount" || return 1
	rm -rf "$tmp/wordcount/out" "$tmp/wordcount/checkpoints"
	local port up=""
	for _ in 1 2 3; do
		port=$((20000 + RANDOM % 40000))
		export STREAMD_NATS_URL=nats://127.0.0.1:$port
		"$STREAMD" server --nats-port "$port" --data-dir "$tmp/data" --slots 2 --log-level warn >"$tmp/server.log" 2>&1 &
		server_pid=$!
		for _ in $(seq 100); do
			if "$STREAMD" hosts >/dev/null 2>&1; then
				up=1
				break
			fi
			kill -0 "$server_pid" 2>/dev/null || break
			sleep 0.1
		done
		[[ -n $up ]] && break
		kill "$server_pid" 2>/dev/null || true
		wait "$server_pid" 2>/dev/null || true
		server_pid=""
	done
	if [[ -z $up ]]; then
		echo "streamd server did not start:"
		cat "$tmp/server.log"
		return 1
	fi
	local id
	id=$("$STREAMD" deploy "$tmp/wordcount/wordcount.yaml" --wait) || return 1
	"$STREAMD" status "$id" >"$tmp/status.txt" || return 1
	grep -q finished "$tmp/status.txt" || { cat "$tmp/status.txt"; return 1; }
	diff <(cat "$tmp/wordcount/out"/part-* | LC_ALL=C sort) <(LC_ALL=C sort "$DIR/expected.txt") >/dev/null || {
		echo "the deployed job's output differs from expected.txt"
		return 1
	}
	echo "$port $id" >"$tmp/result"
}

echo
echo "== checking the cluster recipe (streamd server on a free port, deploy --wait, status)"
# Not in a $(...) subshell: cleanup must see server_pid.
if cluster_check >"$tmp/check.log" 2>&1; then
	read -r port id <"$tmp/result"
	echo "   checked: a server on port $port ran job $id to 'finished' with the expected output"
	kill "$server_pid" 2>/dev/null || true
	wait "$server_pid" 2>/dev/null || true
	server_pid=""
else
	echo "FAIL: the cluster recipe did not work:" >&2
	sed 's/^/   /' "$tmp/check.log" >&2
	exit 1
fi

cat <<EOF

== run the same job on a streamd server (two terminals, from $(pwd)):
   terminal 1:   $STREAMD server
                 (embedded NATS with JetStream on 127.0.0.1:4222, a controller and a host;
                  --nats-port P for another port, then STREAMD_NATS_URL=nats://127.0.0.1:P below)
   terminal 2:   rm -rf $OUT $CKPT    # the deployed job writes there too
                 $STREAMD deploy $JOB --wait
                 $STREAMD list                  # the job, finished
                 $STREAMD status JOB_ID         # per operator: records, subtasks and their host
                 open the console URL the server logged: jobs, hosts, logs, checkpoint waterfalls
   More: docs/cli.md ("Cluster").
EOF
