#!/bin/bash
# Where an outbox write's cost goes, measured with pgbench (no Go client in
# the way): each script is one business transaction (BEGIN; INSERT the
# order; ...; COMMIT) and the variants differ only in what is added to it.
#
#   bare     the business insert alone (the baseline)
#   sel      plus a SELECT 1: the cost of one more round trip, nothing else
#   outbox   plus the outbox INSERT as runtime/outbox writes it today
#   slim     the same row without the event_id unique index, the lane passed
#            in, headers as bytea
#   two      slim without the published-rows index
#   p*       the same INSERT sent in one pipeline with the COMMIT (no round
#            trip of its own), as outbox.PipelineTx sends it; and two more
#            pipelined rows that each drop one piece of the slim row:
#   pnouniq  today's row without the event_id unique index
#   puslim   the slim row with the event_id unique index kept
#
# usage: bench/writepath/run.sh [clients] [rounds] [seconds] [variants...]
# Postgres: $PROTOEVENTS_TEST_DATABASE_URL (default the local server); the
# tables go in a schema "pgb", dropped and created again.
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
url=${PROTOEVENTS_TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable}
c=${1:-8}; r=${2:-3}; t=${3:-4}; shift $(( $# < 3 ? $# : 3 ))
variants=("$@"); [ ${#variants[@]} -gt 0 ] || variants=(bare sel outbox slim two poutbox pslim ptwo pnouniq puslim)
psql -q "$url" -f "$dir/setup.sql" 2>/dev/null
for i in $(seq "$r"); do for v in "${variants[@]}"; do
  tps=$(PGOPTIONS='-c search_path=pgb' pgbench -n -M prepared -c "$c" -j 2 -T "$t" -f "$dir/$v.sql" "$url" 2>&1 | grep -oP 'tps = \K[0-9.]+' | head -1)
  echo "$v $tps"
done; done | awk '{s[$1]=s[$1]" "int($2); n[$1]++; t[$1]+=$2} END {for (k in s) printf "%-8s tps%s  mean %d\n", k, s[k], t[k]/n[k]}' | sort
