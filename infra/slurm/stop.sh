#!/usr/bin/env bash
# Stops what infra/slurm/start.sh started: slurmrestd, slurmd, slurmctld, slurmdbd and
# munged, each by its pid file. MariaDB is the machine's and is left running, and so are
# the Slurm state and accounting database (a later start.sh resumes job ids where they were).
set -uo pipefail

log() { echo "slurm/stop.sh: $*" >&2; }
[ "$(id -u)" -eq 0 ] || { log "ERROR: must run as root"; exit 1; }

stop_pid_file() {
  local name=$1 file=$2 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill -0 "$pid" 2>/dev/null; then
    log "stopping $name ($pid)"
    kill "$pid" 2>/dev/null
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$file"
}

stop_pid_file slurmrestd /run/slurm/slurmrestd.pid
stop_pid_file slurmd /run/slurm/slurmd.pid
stop_pid_file slurmctld /run/slurm/slurmctld.pid
stop_pid_file slurmdbd /run/slurm/slurmdbd.pid
stop_pid_file munged /run/munge/munged.pid
log "stopped"
