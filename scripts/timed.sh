#!/usr/bin/env bash
# Runs one install step under a heading and says how long it took (the Makefile's install steps).
# Usage: scripts/timed.sh "what is being installed" command [args...]
set -euo pipefail
what=$1
shift
printf '\n==> %s\n' "$what"
start=$SECONDS
"$@"
printf '==> %s: done in %ds\n' "$what" $((SECONDS - start))
