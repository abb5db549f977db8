#!/usr/bin/env bash
# Checks the units with what this machine runs: `systemd-analyze verify` on each (with
# ExecStart pointed at the meridian binary given), and each ExecStart's command line,
# its variables filled from meridian.env and adapter-site.env and %i as a site name,
# parsed by that binary (`--help` appended: an unknown flag or a bad value fails).
#
#   infra/systemd/check.sh target/debug/meridian
set -euo pipefail
bin=$(realpath "${1:?the meridian binary to check the units against}")
cd "$(dirname "$0")"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
set -a
# shellcheck source=/dev/null
. ./meridian.env
# shellcheck source=/dev/null
. ./adapter-site.env
set +a
status=0
for unit in *.service; do
  sed "s|/usr/local/bin/meridian|$bin|g; s|/etc/meridian/|$work/etc/|g" "$unit" > "$work/$unit"
  mkdir -p "$work/etc"
  cp meridian.env "$work/etc/meridian.env"
  cp adapter-site.env "$work/etc/adapter-hpc.env"
  name=$unit
  [[ $unit == *@.service ]] && name=${unit/@/@hpc}
  [[ $unit == *@.service ]] && cp "$work/$unit" "$work/$name"
  if ! out=$(SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "$work/$name" 2>&1); then
    echo "$unit: systemd-analyze verify failed:"; echo "$out"; status=1
  fi
  # What verify says of a unit it accepts is noise (no such user here, …), unless it
  # names a directive or a command.
  if grep -Ei "unknown (key|section)|invalid|not executable|failed to parse" <<<"$out"; then
    echo "$unit: systemd-analyze verify complained"; status=1
  fi
  line=$(sed -n 's/^ExecStart=//p' "$unit")
  line=${line//%i/hpc}
  line=$(envsubst <<<"$line")
  read -r -a argv <<<"$line"
  argv[0]=$bin
  if ! "${argv[@]}" --help >/dev/null 2>"$work/err"; then
    echo "$unit: its ExecStart does not parse: ${line}"; cat "$work/err"; status=1
  fi
done
[ $status = 0 ] && echo "infra/systemd: $(ls ./*.service | wc -l) units verified, their commands parse"
exit $status
