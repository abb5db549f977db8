#!/usr/bin/env bash
# Starts a one-node Slurm 22.05 cluster on this machine for Meridian's tests and for
# newcomers: munged, slurmdbd (accounting in the machine's MariaDB), slurmctld, slurmd, and
# slurmrestd with JWT auth on 127.0.0.1:6820. Idempotent: what already runs is left alone,
# and a second run only checks and prints. Needs root (it installs packages and writes
# /etc/slurm). Debian 12 (bookworm); see /work/shared/notes/local-peers.md section 3.
#
# Environment:
#   SLURM_NO_DBD=1        skip slurmdbd; job records then come from jobcomp/filetxt
#   SLURM_READY_TIMEOUT   seconds to wait for the node to be idle (default 60)
#
# Stop everything with infra/slurm/stop.sh.
set -euo pipefail
# The daemons inherit the working directory: from a test's (or a CI clone's) directory,
# which is deleted later, slurmrestd fails its next submission ("getcwd failed") and
# exits. Every path below is absolute.
cd /

log() { echo "slurm/start.sh: $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (it installs packages and starts daemons)"

CONF_DIR=/etc/slurm
SPOOL_CTLD=/var/spool/slurmctld
SPOOL_D=/var/spool/slurmd
LOG_DIR=/var/log/slurm
RUN_DIR=/run/slurm
JWT_KEY=$SPOOL_CTLD/jwt_hs256.key
REST_ADDR=127.0.0.1:6820
REST_PID=$RUN_DIR/slurmrestd.pid
DB_PASS=meridian-slurm-test   # a local test cluster's accounting password, not a secret
READY_TIMEOUT=${SLURM_READY_TIMEOUT:-60}
PLUGIN_DIR=/usr/lib/x86_64-linux-gnu/slurm-wlm

# --- packages -------------------------------------------------------------------------
PACKAGES=(slurm-wlm slurmrestd slurm-wlm-jwt-plugin munge slurmdbd slurm-wlm-mysql-plugin)
installed() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null &&
    command -v slurmrestd >/dev/null && command -v slurmdbd >/dev/null &&
    command -v munged >/dev/null && command -v sbatch >/dev/null &&
    ls "$PLUGIN_DIR"/auth_jwt.so "$PLUGIN_DIR"/accounting_storage_mysql.so >/dev/null 2>&1
}
if ! installed; then
  log "installing ${PACKAGES[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # Only refresh the package lists when the install fails: it is slow and usually unneeded.
  if ! apt-get install -y --no-install-recommends "${PACKAGES[@]}" >/tmp/slurm-apt.log 2>&1; then
    log "install failed; running apt-get update and trying again"
    apt-get update >>/tmp/slurm-apt.log 2>&1 || true
    apt-get install -y --no-install-recommends "${PACKAGES[@]}" >>/tmp/slurm-apt.log 2>&1 ||
      { tail -n 30 /tmp/slurm-apt.log >&2; die "apt-get install failed (log: /tmp/slurm-apt.log)"; }
  fi
  installed || die "packages installed but Slurm binaries or plugins are still missing"
fi

# --- helpers --------------------------------------------------------------------------
pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
ctld_up() { scontrol ping 2>/dev/null | grep -q 'is UP'; }
node_ready() { sinfo -h -N -o '%t' 2>/dev/null | grep -Eq '^(idle|mix|alloc)'; }
rest_up() {
  # Any HTTP answer means it listens; without a token it answers 401/500.
  command -v curl >/dev/null || return 0
  curl -s -o /dev/null -m 2 "http://$REST_ADDR/openapi/v3" 2>/dev/null
}
mysql_root() { mysql -h 127.0.0.1 -P 3306 -u root --connect-timeout=3 "$@"; }

# slurm.conf for this machine (its name, CPUs and memory), accounting per $USE_DBD.
write_slurm_conf() {
  local out=$1 H CPUS MEM_MB REAL_MEM ACCOUNTING
  H=$(hostname -s)
  CPUS=$(nproc)
  MEM_MB=$(free -m | awk '/^Mem:/ {print $2}')
  REAL_MEM=$((MEM_MB - 512))
  [ "$REAL_MEM" -gt 512 ] || REAL_MEM=512
  if [ "$USE_DBD" -eq 1 ]; then
    ACCOUNTING="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=6819
# Meridian finds its jobs again by their comment (meridian:<job id>); keep it in sacct.
AccountingStoreFlags=job_comment"
  else
    ACCOUNTING="AccountingStorageType=accounting_storage/none"
  fi
  cat >"$out" <<EOF
# Written by Meridian's infra/slurm/start.sh; rewritten at each start.
ClusterName=localcluster
SlurmctldHost=$H(127.0.0.1)
SlurmUser=slurm
AuthType=auth/munge
CryptoType=crypto/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
StateSaveLocation=$SPOOL_CTLD
SlurmdSpoolDir=$SPOOL_D
SlurmctldPidFile=$RUN_DIR/slurmctld.pid
SlurmdPidFile=$RUN_DIR/slurmd.pid
SlurmctldLogFile=$LOG_DIR/slurmctld.log
SlurmdLogFile=$LOG_DIR/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
# Without a default, each job takes all the memory and jobs run one at a time.
DefMemPerCPU=1024
ReturnToService=2
# Finished jobs stay in slurmctld (squeue/scontrol) at least this long, then only
# accounting has them (slurmctld purges every 60 s). Short, so tests reach that path.
MinJobAge=10
# Jobs killed at their time limit get SIGTERM, then SIGKILL this many seconds later.
KillWait=5
JobAcctGatherType=jobacct_gather/linux
JobAcctGatherFrequency=10
$ACCOUNTING
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG_DIR/jobcomp.log
NodeName=$H NodeAddr=127.0.0.1 CPUs=$CPUS RealMemory=$REAL_MEM State=UNKNOWN
# FORCE:4 lets up to four small jobs share a core: tests run many mostly-sleeping jobs at once.
PartitionName=debug Nodes=$H Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  chmod 644 "$out"
}

if ctld_up && node_ready && pid_alive "$REST_PID" && rest_up; then
  log "already running"
  RUNNING=1
  # Keep its accounting mode, but bring the rest of the config up to date (a newer
  # version of this script, a resized machine): slurmctld rereads it on reconfigure.
  if grep -q '^AccountingStorageType=accounting_storage/slurmdbd' "$CONF_DIR/slurm.conf"; then
    USE_DBD=1
  else
    USE_DBD=0
  fi
  write_slurm_conf "$CONF_DIR/slurm.conf.new"
  if cmp -s "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf"; then
    rm -f "$CONF_DIR/slurm.conf.new"
  else
    log "slurm.conf changed; reconfiguring"
    mv "$CONF_DIR/slurm.conf.new" "$CONF_DIR/slurm.conf"
    scontrol reconfigure || die "scontrol reconfigure failed"
  fi
else
  RUNNING=0
fi

if [ "$RUNNING" -eq 0 ]; then
  H=$(hostname -s)
  # --- the host name must resolve to 127.0.0.1: slurmd and slurmctld find each other by it.
  if ! getent hosts "$H" | awk '{print $1}' | grep -qx '127.0.0.1'; then
    log "adding '127.0.0.1 $H' to /etc/hosts"
    echo "127.0.0.1 $H" >>/etc/hosts
  fi

  # --- users and directories
  id slurm >/dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin slurm
  id slurmrestd >/dev/null 2>&1 || useradd -r -M -s /usr/sbin/nologin slurmrestd
  install -d -o munge -g munge -m 0755 /run/munge
  install -d -o slurm -g slurm "$SPOOL_CTLD" "$LOG_DIR" "$RUN_DIR"
  install -d "$SPOOL_D" "$CONF_DIR"
  if [ ! -s "$JWT_KEY" ]; then
    dd if=/dev/urandom of="$JWT_KEY" bs=32 count=1 status=none
  fi
  chown slurm:slurm "$JWT_KEY"
  chmod 600 "$JWT_KEY"

  # --- munge
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating /etc/munge/munge.key"
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
    chown munge:munge /etc/munge/munge.key
    chmod 400 /etc/munge/munge.key
  fi
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "starting munged"
    runuser -u munge -- /usr/sbin/munged
    for _ in $(seq 1 50); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
    munge -n | unmunge >/dev/null || die "munged does not answer"
  fi

  # --- accounting: slurmdbd on MariaDB when we can, else the jobcomp text log. A running
  # slurmctld keeps the mode it started with: changing it needs stop.sh first.
  if pid_alive "$RUN_DIR/slurmctld.pid" && [ -f "$CONF_DIR/slurm.conf" ]; then
    if grep -q '^AccountingStorageType=accounting_storage/slurmdbd' "$CONF_DIR/slurm.conf"; then
      USE_DBD=1
    else
      USE_DBD=0
    fi
  elif [ "${SLURM_NO_DBD:-0}" = 1 ]; then
    log "SLURM_NO_DBD=1: no slurmdbd; finished jobs are read with sacct -c"
    USE_DBD=0
  else
    USE_DBD=1
  fi
  if [ "$USE_DBD" -eq 1 ]; then
    if ! mysql_root -e 'select 1' >/dev/null 2>&1 && [ -x /etc/init.d/mariadb ]; then
      log "MariaDB does not answer on 127.0.0.1:3306; starting it"
      /etc/init.d/mariadb start >/dev/null 2>&1 || true
    fi
    if ! mysql_root -e "
        CREATE DATABASE IF NOT EXISTS slurm_acct_db;
        CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY '$DB_PASS';
        CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$DB_PASS';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
        GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" 2>/tmp/slurm-mysql.err; then
      pid_alive "$RUN_DIR/slurmctld.pid" &&
        die "slurmctld runs with slurmdbd but MariaDB is not usable: $(head -c 300 /tmp/slurm-mysql.err)"
      log "WARNING: cannot set up MariaDB for slurmdbd ($(head -c 300 /tmp/slurm-mysql.err));" \
          "falling back to jobcomp/filetxt (sacct -c) for finished jobs"
      USE_DBD=0
    fi
  fi

  write_slurm_conf "$CONF_DIR/slurm.conf"

  if [ "$USE_DBD" -eq 1 ]; then
    cat >"$CONF_DIR/slurmdbd.conf" <<EOF
# Written by Meridian's infra/slurm/start.sh.
AuthType=auth/munge
AuthAltTypes=auth/jwt
AuthAltParameters=jwt_key=$JWT_KEY
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=6819
SlurmUser=slurm
LogFile=$LOG_DIR/slurmdbd.log
PidFile=$RUN_DIR/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=3306
StorageUser=slurm
StoragePass=$DB_PASS
StorageLoc=slurm_acct_db
EOF
    chown slurm:slurm "$CONF_DIR/slurmdbd.conf"
    chmod 600 "$CONF_DIR/slurmdbd.conf"
    if ! pid_alive "$RUN_DIR/slurmdbd.pid"; then
      log "starting slurmdbd"
      slurmdbd
    fi
    # slurmctld registers with slurmdbd at start: wait until it listens.
    for _ in $(seq 1 100); do
      (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null && break
      sleep 0.1
    done
    (exec 3<>/dev/tcp/127.0.0.1/6819) 2>/dev/null ||
      { tail -n 20 "$LOG_DIR/slurmdbd.log" >&2 || true; die "slurmdbd does not listen on 6819"; }
  fi

  # --- slurmctld and slurmd
  if pid_alive "$RUN_DIR/slurmctld.pid"; then
    # A config written above may differ from the one it runs with.
    scontrol reconfigure >/dev/null 2>&1 || true
  else
    log "starting slurmctld"
    slurmctld
  fi
  for _ in $(seq 1 100); do ctld_up && break; sleep 0.1; done
  ctld_up || { tail -n 20 "$LOG_DIR/slurmctld.log" >&2 || true; die "slurmctld does not answer"; }
  if ! pid_alive "$RUN_DIR/slurmd.pid"; then
    log "starting slurmd"
    slurmd
  fi

  # --- slurmrestd (refuses to run as root: it runs as user slurmrestd)
  if ! pid_alive "$REST_PID"; then
    log "starting slurmrestd on $REST_ADDR"
    # The slurmdbd API plugins are fatal without slurmdbd: leave them out then.
    PLUGINS=()
    [ "$USE_DBD" -eq 1 ] || PLUGINS=(-s openapi/v0.0.38)
    SLURM_JWT=daemon nohup slurmrestd -a rest_auth/jwt "${PLUGINS[@]}" -u slurmrestd "$REST_ADDR" \
      >>"$LOG_DIR/slurmrestd.log" 2>&1 </dev/null &
    echo $! >"$REST_PID"
  fi

  # --- wait until the node takes jobs
  deadline=$((SECONDS + READY_TIMEOUT))
  until node_ready; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      sinfo -N -l >&2 || true
      tail -n 20 "$LOG_DIR/slurmd.log" >&2 || true
      die "the node is not idle after ${READY_TIMEOUT}s"
    fi
    # A node left down by an earlier run comes back on its own (ReturnToService=2) or here.
    sinfo -h -N -o '%t' 2>/dev/null | grep -Eq '^(down|drain)' &&
      scontrol update nodename="$H" state=resume >/dev/null 2>&1 || true
    sleep 0.2
  done
  for _ in $(seq 1 50); do rest_up && break; sleep 0.1; done
  rest_up || { tail -n 20 "$LOG_DIR/slurmrestd.log" >&2 || true; die "slurmrestd does not answer on $REST_ADDR"; }
fi

ACCT=$(scontrol show config 2>/dev/null | awk -F' = ' '/^AccountingStorageType/ {print $2}')
log "ready: $(sinfo -h -o '%P %D nodes %t, CPUs(A/I/O/T) %C')"
log "accounting: $ACCT (jobcomp log: $LOG_DIR/jobcomp.log)"
log "REST: http://$REST_ADDR (API v0.0.38); token: scontrol token username=root lifespan=3600"
log "   curl -H \"X-SLURM-USER-NAME: root\" -H \"X-SLURM-USER-TOKEN: \$(scontrol token username=root lifespan=3600 | cut -d= -f2)\" http://$REST_ADDR/slurm/v0.0.38/ping"
