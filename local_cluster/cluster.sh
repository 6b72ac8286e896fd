#!/usr/bin/env bash
# A real three-node Slurm 22.05 cluster on this one machine, for testing the sbatch payloads and the
# node scripts.
#
#   local_cluster/cluster.sh up       start it (installs the Debian packages if missing); idempotent, and
#                                     boots again any node whose boot failed
#   local_cluster/cluster.sh down     stop what `up` started and remove what it created; idempotent
#   local_cluster/cluster.sh status   short health summary; exits non-zero unless the cluster is up
#   local_cluster/cluster.sh reboot NODE...
#                                     boot those nodes again, through their custom actions (e.g. after
#                                     editing node_scripts/); exits 1 if one stays out of service
#   local_cluster/cluster.sh rollup   roll the hour in progress up now, so that sreport's cluster and
#                                     user reports show it (provisional: see cmd_rollup)
#   local_cluster/cluster.sh update   as `pcluster update-cluster` after a settings change (a model added
#                                     or removed): render the config again, then the head node's
#                                     OnNodeUpdated (see cmd_update)
#   local_cluster/cluster.sh login [USER]
#                                     a login shell on the head node as USER (default ssm-user, whom
#                                     `aws ssm start-session` logs in): /fsx and /opt/llm-jobs mounted
#                                     as there; commands on stdin run as typed (see cmd_login)
#
# Layout: slurmctld, slurmdbd and munged run on the host (the "head node"); node1, node2 and node3
# each run a slurmd in their own network + UTS + mount namespace, with a veth into a host bridge,
# their own hostname, address, /etc/hosts and node-local disk. The bridge has no route out and no NAT,
# so no traffic leaves the machine.
# Nodes boot as ParallelCluster boots them (local_cluster/node_boot.sh): the custom actions of dev's
# rendered cluster config (node_scripts/node_setup.sh, directory_setup.sh) run for real, on the head
# node and on each node, and a node whose actions fail stays DOWN with the reason. The AWS side is
# stood in for (local_cluster/stand_ins/: `aws s3` from a folder filled as the cluster stack fills the
# assets bucket, `dnf` for the interpreter, and Pyxis: a SPANK plugin that runs `srun --container-image` tasks
# in the jobs' image, docs/containers.md). Three nodes, so that a two-node job can move off a node
# its health check drained (the head node installs node_scripts/slurm_health_hook.sh as prolog and
# epilog; local_cluster/health_check.sh stands in for the GPU/EFA hardware).
# Accounting is real: slurmdbd stores into a MariaDB server of its own (data under
# .local_cluster/state/mysql, kept across down/up), both listening on 127.0.0.1 only; the head node's
# OnNodeConfigured creates the per-model accounts and QOS (node_scripts/slurm_accounts.sh). The
# models are dev's (cluster_config/dev.yaml): `up` writes their job scripts and configs into jobs/
# as the cluster stack does into the bundle, so `sbatch jobs/train_model1.sh` here runs dev's model1
# (with sbatch --gpus-per-node=0: CPUs only).
# Monitoring runs as on AWS (local_cluster/monitoring.sh, docs/monitoring.md): a node exporter and a
# stand-in DCGM exporter in each node, the head node's exporter loop, Prometheus with the repository's
# alert rules, Alertmanager, and a webhook standing in for SNS (.local_cluster/log/alerts.log).
# Users as on ParallelCluster: the cluster's default user ec2-user (cfn_cluster_user: it owns the
# shared folders the node setup makes, prepares data and runs the acceptance run under account ops),
# ssm-user (Session Manager's login, with sudo and no Slurm account), and one user per model, named as
# the model, which the node setup makes and its training jobs run as; `login` starts a shell as one of
# them. make demo's jobs are typed as them (local_cluster/as_user.sh); the drills' own jobs run as root.
# Everything the cluster writes lives under .local_cluster/ in the repository root; beside it, `up`
# creates the users (kept by `down`, as the packages are) and the empty mount points /fsx and
# /opt/llm-jobs (removed by `down`).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# A second cluster can run beside this one (the goodput simulation's 80 nodes, docs/goodput.md):
# LOCAL_CLUSTER_NAME gives it its own folder .local_cluster/<name>/, slurm.conf there (export
# SLURM_CONF=<that file> to use it), bridge, namespaces, munged and database, and no monitoring; it
# needs its own LOCAL_CLUSTER_NET and LOCAL_CLUSTER_PORT_OFFSET. LOCAL_CLUSTER_NODES (default 3) and
# LOCAL_CLUSTER_ENV (whose config the nodes boot with, default dev) apply to either. Unset, all is as above.
NAME="${LOCAL_CLUSTER_NAME:-}"
if [[ -n $NAME ]]; then
  [[ $NAME =~ ^[a-z][a-z0-9]{0,5}$ ]] || { echo "error: LOCAL_CLUSTER_NAME=$NAME: 1 to 6 lowercase letters or digits, a letter first" >&2; exit 2; }
  [[ -n ${LOCAL_CLUSTER_NET:-} && ${LOCAL_CLUSTER_PORT_OFFSET:-0} != 0 ]] ||
    { echo "error: cluster '$NAME' needs a /24 and ports of its own: set LOCAL_CLUSTER_NET (e.g. 10.199.78) and LOCAL_CLUSTER_PORT_OFFSET (e.g. 100)" >&2; exit 2; }
fi
BASE="$REPO/.local_cluster${NAME:+/$NAME}"
ETC="$BASE/etc"            # slurm.conf (master copy), munge key, per-node hosts files
RUN="$BASE/run"            # pid files, munge socket, record of what `up` created
STATE="$BASE/state"        # slurmctld state and slurmd spool; kept across restarts
LOGS="$BASE/log"           # daemon logs and the job completion log
FSX="$BASE/fsx"            # stand-in for the FSx for Lustre file systems mounted on /fsx/<name>

SLURM_CONF=/etc/slurm/slurm.conf
[[ -z $NAME ]] || export SLURM_CONF="$BASE/slurm.conf"  # the host's is the default cluster's
SLURM_CLUSTER="${NAME:-localcluster}"
CONF_MARK="# Generated by local_cluster/cluster.sh"
MUNGE_SOCKET="$RUN/munge/munge.socket"

# A private /24 that nothing else on a build machine uses; override if it collides.
NET_PREFIX="${LOCAL_CLUSTER_NET:-10.199.77}"
BRIDGE="lc${NAME}br0"
HEAD_IP="$NET_PREFIX.1"
NODE_COUNT="${LOCAL_CLUSTER_NODES:-3}"
[[ $NODE_COUNT =~ ^[1-9][0-9]*$ ]] && ((NODE_COUNT <= 240)) || { echo "error: LOCAL_CLUSTER_NODES=$NODE_COUNT: 1 to 240" >&2; exit 2; }
NODES=()
for ((i = 1; i <= NODE_COUNT; i++)); do NODES+=("node$i"); done
# Non-default ports, so a Slurm or MySQL already installed on the host is not disturbed.
PORT_OFFSET="${LOCAL_CLUSTER_PORT_OFFSET:-0}"
[[ $PORT_OFFSET =~ ^[0-9]+$ ]] && ((PORT_OFFSET < 1000)) || { echo "error: LOCAL_CLUSTER_PORT_OFFSET=$PORT_OFFSET: 0 to 999" >&2; exit 2; }
CTLD_PORT=$((16817 + PORT_OFFSET))
SLURMD_PORT=$((16818 + PORT_OFFSET))
DBD_PORT=$((16819 + PORT_OFFSET))
MYSQL_PORT=$((16306 + PORT_OFFSET))
MYSQL_SOCKET="$RUN/mysqld.sock"
MYSQL_DATA="$STATE/mysql"
# Per node: 2 CPUs (the host has 2 cores; oversubscribing is fine for tests) and 4 GiB.
NODE_CPUS=2
NODE_MEMORY_MB=4096

# libslurm-dev (spank.h) and squashfs-tools: the Pyxis stand-in, built here, and the images it mounts.
PACKAGES=(slurmctld slurmd slurm-client slurmdbd mariadb-server munge iproute2 util-linux procps
  prometheus prometheus-alertmanager prometheus-node-exporter curl sudo libslurm-dev squashfs-tools)

# ParallelCluster's default user on Amazon Linux (cfn_cluster_user), and the user Session Manager
# logs in as (the SSM agent creates it with passwordless sudo).
CLUSTER_USER=ec2-user
LOGIN_USER=ssm-user
JOBS_HOME_MOUNT=/opt/llm-jobs  # where every node mounts the head node's jobs home (JOBS_HOME_DIR)

log() { printf '[local-cluster] %s\n' "$*"; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# How nodes boot: their custom actions, the stand-ins, the node-local paths.
# shellcheck source=local_cluster/node_boot.sh
source "$REPO/local_cluster/node_boot.sh"
# Prometheus, Alertmanager, the exporters and the alert receiver (docs/monitoring.md).
# shellcheck source=local_cluster/monitoring.sh
source "$REPO/local_cluster/monitoring.sh"
# A named cluster runs without it: its ports are fixed (the default cluster's), and the goodput
# simulation reads Slurm and the jobs' files itself.
if [[ -n $NAME ]]; then
  for f in write_monitoring_config start_head_monitoring start_node_monitoring start_exporter_loop \
    wait_monitoring_ready monitoring_pidfiles monitoring_status; do
    eval "$f() { :; }"
  done
fi

node_ip() { echo "$NET_PREFIX.$((10 + ${1#node}))"; }
netns_of() { echo "lc$NAME-$1"; }
veth_of() { echo "lc${NAME}veth${1#node}"; }

# --- packages ---------------------------------------------------------------------------------
install_packages() {
  local missing=() pkg
  for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep '^install ok installed$' >/dev/null || missing+=("$pkg")
  done
  ((${#missing[@]} == 0)) && return 0
  log "installing ${missing[*]}"
  # Keep the packages' init scripts from starting system-wide daemons: we start our own.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod 755 "$policy" && made_policy=1
  fi
  local rc=0
  {
    DEBIAN_FRONTEND=noninteractive apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
  } >"$BASE/apt.log" 2>&1 || rc=$?
  ((made_policy)) && rm -f "$policy"
  ((rc == 0)) || die "apt-get failed (exit $rc); see $BASE/apt.log"
}

# --- small helpers ----------------------------------------------------------------------------
# The pid in FILE if that process is alive and runs the program NAME.
live_pid() {
  local file=$1 name=$2 pid stat
  [[ -s $file ]] || return 1
  pid=$(<"$file")
  [[ $pid =~ ^[0-9]+$ ]] && [[ "$(cat "/proc/$pid/comm" 2>/dev/null)" == "$name" ]] || return 1
  # Not a zombie: a killed daemon that is not reaped yet must be started again (reboot, up).
  stat=$(cat "/proc/$pid/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  [[ ${stat%% *} != Z ]] || return 1
  echo "$pid"
}

# Stop the daemons named by "pidfile:program" pairs together (each takes ~2 s to shut down).
stop_daemons() {
  local entry file name pid pids=() i
  for entry in "$@"; do
    file=${entry%%:*} name=${entry##*:}
    if pid=$(live_pid "$file" "$name"); then
      kill -TERM "$pid" 2>/dev/null || true
      pids+=("$pid")
      log "stopping $name ($pid)"
    fi
    rm -f "$file"
  done
  for ((i = 0; i < 100; i++)); do
    any_alive "${pids[@]}" || return 0
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}

any_alive() {
  local pid
  for pid in "$@"; do [[ -d /proc/$pid ]] && return 0; done
  return 1
}

record() { echo "$1" >>"$RUN/created"; }
recorded() { [[ -f $RUN/created ]] && grep -qx "$1" "$RUN/created"; }

# --- users -------------------------------------------------------------------------------------
# The cluster user and the login user, as the AMI and the SSM agent make them. Kept across `down`:
# files they own on the stand-in FSx outlive the cluster, as on FSx.
create_users() {
  local user
  for user in "$CLUSTER_USER" "$LOGIN_USER"; do
    id "$user" >/dev/null 2>&1 || useradd --create-home --shell /bin/bash "$user"
  done
  printf '%s ALL=(ALL) NOPASSWD:ALL\n' "$LOGIN_USER" >/etc/sudoers.d/ssm-agent-users
  chmod 0440 /etc/sudoers.d/ssm-agent-users
}

# The jobs' interpreter is the host's Python that .venv was made from; on ParallelCluster it is
# /usr/bin/python3.11, which every user can run. A Python under a private home (pyenv under /root,
# mode 0700) would stop the jobs of the cluster's and the models' users, so `up` grants traverse (o+x,
# not read) on each folder in the way, and `down` takes back what it granted. Every cluster of this
# repository does it (the second cluster's jobs run as the models' users too); a cluster going down
# while another is up hands its grants over to that one, whose jobs still need them, instead of taking
# them back under its running jobs.
open_interpreter_path() {
  local python dir
  python=$(readlink -f "$REPO/.venv/bin/python")
  for dir in "$(dirname "$(dirname "$python")")" "$REPO/.venv"; do
    while [[ $dir != / ]]; do
      if [[ $(stat -c %A "$dir") != *[xt] ]]; then  # t: sticky and searchable
        chmod o+x "$dir"
        record "traverse:$dir"
        log "granted traverse (o+x) on $dir: the cluster's users run the jobs' interpreter $python"
      fi
      dir=$(dirname "$dir")
    done
  done
}

# The run folders of this repository's other clusters that are up (a live slurmctld).
other_clusters_up() {
  local run
  for run in "$REPO/.local_cluster/run" "$REPO"/.local_cluster/*/run; do
    [[ $run != "$RUN" ]] || continue
    if live_pid "$run/slurmctld.pid" slurmctld >/dev/null; then echo "$run"; fi
  done
}

close_interpreter_path() {
  local line heir
  [[ -f $RUN/created ]] || return 0
  heir=$(other_clusters_up | sed -n 1p)
  while read -r line; do
    [[ $line == traverse:* ]] || continue
    if [[ -n $heir ]]; then
      echo "$line" >>"$heir/created"
      log "kept traverse on ${line#traverse:}: the cluster of $heir uses it (its down takes it back)"
    else
      chmod o-x "${line#traverse:}"
    fi
  done <"$RUN/created"
  return 0
}

# --- configuration ----------------------------------------------------------------------------
write_config() {
  mkdir -p "$ETC" "$RUN/munge" "$STATE" "$LOGS" "$FSX"/{data,checkpoints,logs/validation,logs/acceptance}
  chmod 755 "$RUN/munge"
  if [[ ! -s $ETC/munge.key ]]; then
    (umask 077 && dd if=/dev/urandom of="$ETC/munge.key" bs=1024 count=1 status=none)
  fi
  chmod 600 "$ETC/munge.key"

  local head node
  head=$(hostname -s)
  {
    echo "$CONF_MARK for the local test cluster; restored to the previous file by 'down'."
    cat <<EOF
ClusterName=$SLURM_CLUSTER
SlurmctldHost=$head($HEAD_IP)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
# Own munged socket; cred_expire also sets how soon a requeued job may start again.
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET,cred_expire=10
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd-%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd-%n.log
# No cgroups inside namespaces: plain process tracking.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# Accounting through slurmdbd (sacct, sreport); a job needs an association (user + account), and
# the account's QOS limits hold (ParallelCluster: SlurmSettings.Database + CustomSlurmSettings).
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=127.0.0.1
AccountingStoragePort=$DBD_PORT
# For auth/munge this names the munged socket used to reach slurmdbd (the default one is not ours).
AccountingStoragePass=$MUNGE_SOCKET
AccountingStorageEnforce=associations,limits,qos
# Completed jobs also go to a text file (a record that does not need the database).
JobCompType=jobcomp/filetxt
JobCompLoc=$LOGS/jobcomp.txt
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Schedule within seconds instead of the default 30-60 s; a job whose prolog failed goes back to
# the queue instead of being held (as on ParallelCluster).
SchedulerParameters=bf_interval=1,sched_interval=2,nohold_on_prolog_fail
# The node health check before and after every job (ParallelCluster: prolog.d/ and epilog.d/).
Prolog=$ETC/prolog.sh
Epilog=$ETC/epilog.sh
MpiDefault=none
MailProg=/bin/true
# Trust the node lines below rather than the host's 2 cores: each node advertises its own CPUs.
SlurmdParameters=config_overrides
ReturnToService=2
SlurmdTimeout=60
# Seconds between SIGTERM and SIGKILL at scancel / the time limit: room for the workers' save
# (ParallelCluster: CustomSlurmSettings, sized in cluster_config/render.py).
KillWait=30
InactiveLimit=0
EOF
    for node in "${NODES[@]}"; do
      echo "NodeName=$node NodeAddr=$(node_ip "$node") NodeHostname=$node CPUs=$NODE_CPUS Sockets=1 CoresPerSocket=$NODE_CPUS ThreadsPerCore=1 RealMemory=$NODE_MEMORY_MB State=UNKNOWN"
    done
    # Same queue names as the ParallelCluster config; both partitions span all nodes.
    echo "PartitionName=gpu Nodes=$(IFS=,; echo "${NODES[*]}") Default=YES MaxTime=INFINITE State=UP"
    echo "PartitionName=cpu Nodes=$(IFS=,; echo "${NODES[*]}") Default=NO MaxTime=INFINITE State=UP"
  } >"$ETC/slurm.conf"

  # Prolog and epilog: what the head node's OnNodeConfigured installed in prolog.d/ and epilog.d/
  # (ParallelCluster's slurm.conf runs them all: Prolog=/opt/slurm/etc/scripts/prolog.d/*), with the
  # local paths the hook cannot know and the stand-in for the hardware check (slurmd gives no PATH).
  local hook
  for hook in prolog epilog; do
    cat >"$ETC/$hook.sh" <<EOF
#!/bin/bash
export PATH=/usr/bin:/bin:/usr/sbin:/sbin
export HEALTH_CONF=$SLURM_ETC_DIR/llm/health.conf HEALTH_LOG=$LOGS/node-health.log
export HEALTH_CHECK=$REPO/local_cluster/health_check.sh LOCAL_HEALTH_MARKERS=$FSX/.node-health
export NODE_HEALTH_CHECK=$SLURM_ETC_DIR/llm/node_health.sh NODE_HEALTH_ENV=$NODE_LOCAL/etc/llm/node-health.env
for script in $SLURM_ETC_DIR/scripts/$hook.d/*; do
  [[ -x \$script ]] || continue
  "\$script" || exit
done
EOF
    chmod 755 "$ETC/$hook.sh"
  done
  # The same check for a job that runs it itself (jobs/acceptance.sh: HEALTH_CONF=<this file>), as
  # ParallelCluster's /opt/slurm/etc/llm/health.conf would name it.
  mkdir -p "$SLURM_ETC_DIR/llm"
  cat >"$SLURM_ETC_DIR/llm/health.conf" <<EOF
HEALTH_CHECK=$REPO/local_cluster/health_check.sh LOCAL_HEALTH_MARKERS=$FSX/.node-health
NODE_HEALTH_CHECK=$SLURM_ETC_DIR/llm/node_health.sh NODE_HEALTH_ENV=$NODE_LOCAL/etc/llm/node-health.env
EOF

  write_dbd_config

  for node in "${NODES[@]}"; do
    {
      echo "127.0.0.1 localhost"
      echo "$HEAD_IP $head"
      local n
      for n in "${NODES[@]}"; do echo "$(node_ip "$n") $n"; done
    } >"$ETC/hosts.$node"
  done
}

# slurmdbd reads slurmdbd.conf beside the slurm.conf that SLURM_CONF names ($ETC); it must be
# private (it holds the database password), as must the password file.
write_dbd_config() {
  if [[ ! -s $ETC/mysql.pass ]]; then
    (umask 077 && head -c 18 /dev/urandom | base64 | tr -d '/+=' >"$ETC/mysql.pass")
  fi
  (
    umask 077
    cat >"$ETC/slurmdbd.conf" <<EOF
$CONF_MARK for the local test cluster.
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
DbdHost=localhost
DbdAddr=127.0.0.1
DbdPort=$DBD_PORT
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOGS/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=127.0.0.1
StoragePort=$MYSQL_PORT
StorageUser=slurm
StoragePass=$(<"$ETC/mysql.pass")
StorageLoc=slurm_acct_db
EOF
  )
  chmod 600 "$ETC/slurmdbd.conf"
}

# Install the config where the Slurm commands look for it, keeping any existing one.
install_config() {
  mkdir -p "$(dirname "$SLURM_CONF")"
  if [[ -e $SLURM_CONF ]] && ! grep -qF "$CONF_MARK" "$SLURM_CONF"; then
    cp -p "$SLURM_CONF" "$ETC/slurm.conf.previous"
    record "slurm_conf_backup"
  fi
  cp "$ETC/slurm.conf" "$SLURM_CONF"
}

# Pyxis's stand-in (local_cluster/stand_ins/pyxis/): a SPANK plugin built against this Slurm, which srun and
# every job step load through the plugstack.conf.d/ that Debian's /etc/slurm/plugstack.conf includes (on
# ParallelCluster: /opt/slurm/etc/plugstack.conf.d/pyxis.conf, which the node setup puts in place); a named
# cluster's Slurm reads the plugstack.conf beside its own slurm.conf. It reads each node's Enroot settings
# where the node setup wrote them.
PYXIS_CONF=/etc/slurm/plugstack.conf.d/local-cluster-pyxis.conf
[[ -z $NAME ]] || PYXIS_CONF="$BASE/plugstack.conf"
install_pyxis_standin() {
  local src="$REPO/local_cluster/stand_ins/pyxis/pyxis_standin.c" so="$BASE/lib/pyxis_standin.so"
  mkdir -p "$BASE/lib" "$(dirname "$PYXIS_CONF")"
  if [[ ! -f $so || $src -nt $so ]]; then
    gcc -Wall -O2 -shared -fPIC -o "$so.new" "$src" >"$LOGS/pyxis-build.log" 2>&1 ||
      die "cannot build the Pyxis stand-in from $src; see $LOGS/pyxis-build.log"
    mv "$so.new" "$so"  # a step starting meanwhile loads the old file or the new one, never half of one
  fi
  printf '# %s: the Pyxis stand-in, removed by down.\noptional %s helper=%s enroot_conf=%s node_root=%s\n' \
    "${CONF_MARK#\# }" "$so" "$REPO/local_cluster/stand_ins/pyxis/container_root.sh" \
    "$NODE_LOCAL/etc/enroot/enroot.conf" "$NODE_LOCAL" >"$PYXIS_CONF"
}

# --- network ----------------------------------------------------------------------------------
check_subnet_free() {
  local used
  used=$(ip -4 -o addr show | awk -v p="$NET_PREFIX." -v b="$BRIDGE" '$2 != b && index($4, p) == 1 {print $2}')
  [[ -z $used ]] || die "$NET_PREFIX.0/24 is already used by $used; set LOCAL_CLUSTER_NET to a free /24 prefix"
}

setup_network() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    check_subnet_free
    ip link add "$BRIDGE" type bridge
    ip addr add "$HEAD_IP/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
  fi
  local node ns veth
  for node in "${NODES[@]}"; do
    ns=$(netns_of "$node") veth=$(veth_of "$node")
    [[ -e /run/netns/$ns ]] || ip netns add "$ns"
    if ! ip link show "$veth" >/dev/null 2>&1; then
      ip link add "$veth" type veth peer name eth0 netns "$ns"
      ip link set "$veth" master "$BRIDGE" up
      ip -n "$ns" addr add "$(node_ip "$node")/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
    fi
  done
}

link_exists() { ip link show "$1" >/dev/null 2>&1; }

teardown_network() {
  local node ns veth pid pids i
  for node in "${NODES[@]}"; do
    ns=$(netns_of "$node") veth=$(veth_of "$node")
    if [[ -e /run/netns/$ns ]]; then
      # Job steps left inside the node (started by its slurmd) go with it; the namespace and
      # its veth only go away once the last of them has exited.
      for ((i = 0; i < 50; i++)); do
        pids=$(ip netns pids "$ns" 2>/dev/null || true)
        [[ -z $pids ]] && break
        for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
        sleep 0.1
      done
      ip netns delete "$ns"
    fi
    # Deleting the namespace removes the veth pair, but not always at once.
    for ((i = 0; i < 50; i++)); do link_exists "$veth" || break; sleep 0.1; done
    if link_exists "$veth" && ! ip link delete "$veth" 2>/dev/null && link_exists "$veth"; then
      die "cannot remove $veth"
    fi
  done
  if link_exists "$BRIDGE"; then ip link delete "$BRIDGE"; fi
  return 0
}

# --- daemons ----------------------------------------------------------------------------------
start_munged() {
  live_pid "$RUN/munged.pid" munged >/dev/null && return 0
  munged --key-file="$ETC/munge.key" --socket="$MUNGE_SOCKET" --pid-file="$RUN/munged.pid" \
    --log-file="$LOGS/munged.log" --seed-file="$STATE/munged.seed"
}

mysql() { mariadb --no-defaults --socket="$MYSQL_SOCKET" --user=root "$@"; }

# The data folder is made in a folder beside it and renamed into place once complete, so a failed
# install leaves nothing that the next `up` would take for a database (a half-made one made every later
# install fail too). One more try after a failure, which is then shown whole: on a loaded build machine a
# first install has failed once, and its log is the only evidence.
install_mariadb_data() {
  local attempt tmp="$MYSQL_DATA.installing"
  for attempt in 1 2; do
    rm -rf "$tmp" "$MYSQL_DATA"
    if mariadb-install-db --no-defaults --user=root --datadir="$tmp" --auth-root-authentication-method=socket \
      >"$LOGS/mariadb-install.log" 2>&1; then
      mv "$tmp" "$MYSQL_DATA"
      return 0
    fi
    log "mariadb-install-db failed (attempt $attempt of 2); its log ($LOGS/mariadb-install.log) ends:"
    tail -n 30 "$LOGS/mariadb-install.log" | sed 's/^/  | /' >&2
  done
  rm -rf "$tmp"
  die "mariadb-install-db failed twice; see $LOGS/mariadb-install.log"
}

# MariaDB for slurmdbd: its own data folder (kept across restarts), socket and pid file, TCP on
# 127.0.0.1 only. The first start creates the data folder and the 'slurm' database user.
start_mariadb() {
  live_pid "$RUN/mariadb.pid" mariadbd >/dev/null && return 0
  local first=0 i
  if [[ ! -d $MYSQL_DATA/mysql ]]; then
    first=1
    install_mariadb_data
  fi
  # slurmdbd's advice: a larger buffer pool and lock wait than the defaults.
  setsid mariadbd --no-defaults --user=root --datadir="$MYSQL_DATA" --socket="$MYSQL_SOCKET" \
    --pid-file="$RUN/mariadb.pid" --bind-address=127.0.0.1 --port="$MYSQL_PORT" \
    --log-error="$LOGS/mariadb.log" --innodb-buffer-pool-size=128M --innodb-lock-wait-timeout=900 \
    </dev/null >/dev/null 2>&1 &
  for ((i = 0; i < 300; i++)); do
    mariadb-admin --no-defaults --socket="$MYSQL_SOCKET" --user=root ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  ((i < 300)) || die "MariaDB did not start in 30 s; see $LOGS/mariadb.log"
  local pass
  pass=$(<"$ETC/mysql.pass")
  # Idempotent: also re-applies the password if the file was regenerated.
  mysql -e "CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
            ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '$pass';
            GRANT ALL ON slurm_acct_db.* TO 'slurm'@'127.0.0.1';" || die "cannot create the database user slurm"
  ((first)) && log "MariaDB data folder created in $MYSQL_DATA"
  return 0
}

start_slurmdbd() {
  if ! live_pid "$RUN/slurmdbd.pid" slurmdbd >/dev/null; then
    SLURM_CONF="$ETC/slurm.conf" slurmdbd
  fi
  local i
  for ((i = 0; i < 300; i++)); do
    sacctmgr -n show cluster >/dev/null 2>&1 && break
    sleep 0.1
  done
  ((i < 300)) || die "slurmdbd does not answer after 30 s; see $LOGS/slurmdbd.log"
  # The cluster must be known to the database before slurmctld registers with it.
  if ! sacctmgr -nP show cluster format=cluster | grep -x "$SLURM_CLUSTER" >/dev/null; then
    sacctmgr -i add cluster "$SLURM_CLUSTER" >/dev/null
  fi
}

start_slurmctld() {
  live_pid "$RUN/slurmctld.pid" slurmctld >/dev/null && return 0
  slurmctld
}

# Wait until NODEs are usable (idle, allocated, mixed or completing).
wait_nodes_ready() {
  local deadline=$((SECONDS + 60)) states list
  list=$(IFS=,; echo "$*")
  while ((SECONDS < deadline)); do
    states=$(sinfo -h -N -p gpu -n "$list" -o '%N %T' 2>/dev/null || true)
    if [[ -n $states ]] && ! grep -qvE ' (idle|allocated|mixed|completing)$' <<<"$states"; then
      return 0
    fi
    sleep 0.5
  done
  die "nodes not ready after 60 s: ${states:-no answer from slurmctld}; see $LOGS/"
}

# Stop NODE's slurmd and whatever is left inside its namespaces (job steps it started).
stop_node() {
  local node=$1 ns pid pids i
  stop_daemons "$RUN/slurmd-$node.pid:slurmd"
  ns=$(netns_of "$node")
  [[ -e /run/netns/$ns ]] || return 0
  for ((i = 0; i < 50; i++)); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [[ -z $pids ]] && return 0
    for pid in $pids; do kill -KILL "$pid" 2>/dev/null || true; done
    sleep 0.1
  done
}

# --- commands ---------------------------------------------------------------------------------
cmd_up() {
  [[ $(id -u) == 0 ]] || die "needs root (packages, network namespaces, mounts)"
  local start=$EPOCHREALTIME node head_boot=0 to_boot=() healthy=()
  mkdir -p "$BASE" "$RUN"
  install_packages
  write_config
  write_monitoring_config
  install_config
  install_pyxis_standin
  create_users
  if [[ ! -d /fsx ]]; then
    mkdir /fsx
    [[ -n $NAME ]] || record "fsx_mountpoint"
  fi
  open_interpreter_path
  if [[ -z $NAME ]]; then
    if [[ ! -d $JOBS_HOME_MOUNT ]]; then
      mkdir -p "$JOBS_HOME_MOUNT"
      record "jobs_home_mountpoint"
    fi
  fi
  # Removing /fsx would detach every node's mounts on it, the other cluster's too: a named cluster
  # never removes it, and its mark keeps the default cluster's `down` from removing it meanwhile.
  [[ -z $NAME ]] || touch "/fsx/.in-use-by-$NAME"
  setup_network
  start_head_monitoring
  start_node_monitoring "${NODES[@]}"
  make_plan
  write_action_env
  start_munged
  start_mariadb
  start_slurmdbd
  # The head node boots once per `up` after `down` (or again after its boot failed).
  if [[ ! -e $BOOT/head.booted ]]; then
    head_boot=1
    boot_head_start
  fi
  start_slurmctld
  ((head_boot == 0)) || boot_head_configured
  for node in "${NODES[@]}"; do
    live_pid "$RUN/slurmd-$node.pid" slurmd >/dev/null || to_boot+=("$node")
  done
  ((${#to_boot[@]} == 0)) || boot_nodes "${to_boot[@]}"
  print_boot_table head "${NODES[@]}"
  for node in "${NODES[@]}"; do
    [[ " ${BOOT_FAILED[*]} " == *" $node "* ]] || healthy+=("$node")
  done
  ((${#healthy[@]})) || die "no node booted; see $LOGS/boot-node*.log"
  start_exporter_loop
  wait_nodes_ready "${healthy[@]}"
  wait_monitoring_ready
  log "up in $(elapsed "$start") s: controller $(hostname -s) ($HEAD_IP:$CTLD_PORT), nodes ${healthy[*]}, /fsx/{data,checkpoints,logs} -> $FSX"
  [[ -n $NAME ]] || log "alerts: Prometheus http://127.0.0.1:$PROM_PORT/alerts, Alertmanager http://127.0.0.1:$AM_PORT, notifications $ALERTS_LOG"
  for node in "${BOOT_FAILED[@]}"; do
    log "$node is out of service: $(cat "$BOOT/$node.failed" 2>/dev/null || echo "its boot failed") (log: $LOGS/boot-$node.log; '$0 up' boots it again)"
  done
  sinfo
}

cmd_reboot() {
  [[ $(id -u) == 0 ]] || die "needs root (namespaces, mounts)"
  (($#)) || die "name the nodes to boot again — usage: $0 reboot NODE... (${NODES[*]})"
  live_pid "$RUN/slurmctld.pid" slurmctld >/dev/null || die "the cluster is not up — start it with '$0 up'"
  local node start=$EPOCHREALTIME healthy=()
  for node in "$@"; do
    [[ " ${NODES[*]} " == *" $node "* ]] || die "no node '$node' — the nodes are ${NODES[*]}"
  done
  make_plan
  write_action_env
  for node in "$@"; do
    # Out of service first, so that no job lands on it while it boots.
    scontrol update nodename="$node" state=down reason="rebooting (cluster.sh reboot)"
    stop_node "$node"
  done
  boot_nodes "$@"
  start_node_monitoring "$@"  # stop_node ended them with everything else in the namespace
  print_boot_table "$@"
  for node in "$@"; do
    [[ " ${BOOT_FAILED[*]} " == *" $node "* ]] && continue
    healthy+=("$node")
    # A fresh node, as ParallelCluster's replacement of an unhealthy one: no DOWN or DRAIN left over.
    # Slurm refuses it for a node that came back by itself (ReturnToService=2): the wait below tells.
    scontrol update nodename="$node" state=resume 2>/dev/null || true
  done
  ((${#healthy[@]} == 0)) || wait_nodes_ready "${healthy[@]}"
  log "rebooted in $(elapsed "$start") s: ${healthy[*]:-no node}"
  for node in "${BOOT_FAILED[@]}"; do
    log "$node is out of service: $(cat "$BOOT/$node.failed" 2>/dev/null || echo "its boot failed") (log: $LOGS/boot-$node.log)"
  done
  ((${#BOOT_FAILED[@]} == 0))
}

cmd_down() {
  local node daemons user
  if command -v scancel >/dev/null && live_pid "$RUN/slurmctld.pid" slurmctld >/dev/null; then
    for user in $(squeue -h -o %u 2>/dev/null | sort -u); do scancel --quiet --full "--user=$user" 2>/dev/null || true; done
  fi
  # Monitoring stops with the Slurm daemons (one wait for all): Prometheus evaluates nothing after its
  # SIGTERM, so the cluster going down raises no alert.
  mapfile -t daemons < <(monitoring_pidfiles)
  daemons+=("$RUN/slurmctld.pid:slurmctld")
  for node in "${NODES[@]}"; do daemons+=("$RUN/slurmd-$node.pid:slurmd"); done
  stop_daemons "${daemons[@]}"
  rm -f "$TEXTFILE_DIR/llm.prom"
  # Alertmanager's notification log: an alert still firing at the down was notified once; kept, it would keep the
  # next up from notifying the same alert firing again (a repeat waits repeat_interval, hours), and the alert
  # drills after it wait for that notification.
  rm -rf "$AM_DATA"
  stop_daemons "$RUN/slurmdbd.pid:slurmdbd"
  stop_daemons "$RUN/mariadb.pid:mariadbd"
  stop_daemons "$RUN/munged.pid:munged"
  teardown_network
  if [[ -f $PYXIS_CONF ]] && grep -qF "${CONF_MARK#\# }" "$PYXIS_CONF"; then rm -f "$PYXIS_CONF"; fi
  if [[ -f $SLURM_CONF ]] && grep -qF "$CONF_MARK" "$SLURM_CONF"; then
    if recorded slurm_conf_backup; then
      cp -p "$ETC/slurm.conf.previous" "$SLURM_CONF"
    else
      rm -f "$SLURM_CONF"
    fi
  fi
  [[ -z $NAME ]] || rm -f "/fsx/.in-use-by-$NAME"
  if recorded fsx_mountpoint; then rmdir /fsx 2>/dev/null || log "kept /fsx: not empty"; fi
  if recorded jobs_home_mountpoint; then rmdir "$JOBS_HOME_MOUNT" 2>/dev/null || log "kept $JOBS_HOME_MOUNT: not empty"; fi
  close_interpreter_path
  rm -rf "$RUN"
  log "down"
}

cmd_status() {
  local ok=0 node pid
  report() { if pid=$(live_pid "$1" "$2"); then log "$3: running (pid $pid)"; else log "$3: NOT running"; ok=1; fi; }
  report "$RUN/munged.pid" munged munged
  report "$RUN/mariadb.pid" mariadbd mariadb
  report "$RUN/slurmdbd.pid" slurmdbd slurmdbd
  report "$RUN/slurmctld.pid" slurmctld slurmctld
  for node in "${NODES[@]}"; do
    report "$RUN/slurmd-$node.pid" slurmd "slurmd $node"
    if [[ -f $BOOT/$node.failed ]]; then log "  $node's boot failed: $(<"$BOOT/$node.failed")"; fi
  done
  monitoring_status
  if ((ok == 0)) && sinfo -h >/dev/null 2>&1; then
    sinfo -N -o '%N %P %T %c %m'
    if sinfo -h -N -o '%T' | grep -vE '^(idle|allocated|mixed|completing)$' >/dev/null; then
      log "some nodes are not usable"; ok=1
    fi
  else
    ok=1
  fi
  return "$ok"
}

# sreport's cluster and user reports read slurmdbd's usage tables, which slurmdbd fills once an hour
# for the hours that have ended (its rollup), so they never show the hour in progress. This runs the
# same rollup now over the hour in progress: `sacctmgr rollup START END` (a Slurm admin command
# that its man page does not list) with END the next full hour. Finished jobs count exactly as
# slurmdbd will count them; a job still running counts as if it ran to END. Provisional: the roll-up
# does not advance slurmdbd's last-rollup mark, so slurmdbd rolls the hour up again when it ends
# (at its next start if it is down then) and those figures replace these.
cmd_rollup() {
  live_pid "$RUN/slurmdbd.pid" slurmdbd >/dev/null || die "slurmdbd is not running; start the cluster with '$0 up'"
  local hour next out running
  hour=$(date +%Y-%m-%dT%H:00:00)
  next=$(date -d "${hour/T/ } 1 hour" +%Y-%m-%dT%H:00:00)
  out=$(sacctmgr -i rollup "$hour" "$next" 2>&1) || die "sacctmgr rollup $hour $next failed: $out"
  log "rolled up $hour to now; see: sreport -t minutes cluster AccountUtilizationByUser start=$hour end=now"
  log "provisional: slurmdbd rolls this hour up again at ${next#*T}"
  running=$(squeue -h -t running,completing -o %i 2>/dev/null | wc -l)
  if ((running)); then
    log "warning: $running job(s) still running; each counts as if it ran until ${next#*T} (run rollup again after they end)" >&2
  fi
}

# As `pcluster update-cluster` on a config rendered from changed settings: the stand-in assets bucket
# and the checkout's model jobs refilled (what `cdk deploy` does), then the head node's OnNodeUpdated
# action runs, as ParallelCluster runs it on an update (directory_setup.sh: the bundle synced again,
# added models' accounts, QOS and folders made, removed ones retired). LOCAL_CLUSTER_CONFIG_DIR names
# a folder holding a changed <env>.yaml (default cluster_config/), so a test changes no tracked file.
cmd_update() {
  [[ $(id -u) == 0 ]] || die "needs root (a mount namespace for the head node's action)"
  live_pid "$RUN/slurmctld.pid" slurmctld >/dev/null || die "the cluster is not up — start it with '$0 up'"
  local start=$EPOCHREALTIME
  make_plan
  write_action_env
  sed -i '/\tOnNodeUpdated\t/d' "$BOOT/head.results" 2>/dev/null || true
  rm -f "$BOOT/head.failed"
  unshare --mount --propagation private -- "$SELF" _head-action OnNodeUpdated ||
    die "the head node's OnNodeUpdated failed ($(cat "$BOOT/head.failed" 2>/dev/null || echo "see the log")); see $LOGS/boot-head.log. On ParallelCluster the update rolls back"
  print_boot_table head
  log "updated in $(elapsed "$start") s: $BOOT_ENV's config from ${LOCAL_CLUSTER_CONFIG_DIR:-$REPO/cluster_config}"
}

# A login on the head node, as `aws ssm start-session` then gives one: a login shell as USER
# (default ssm-user) with the environment reset, /fsx and /opt/llm-jobs mounted as on the head node (in a
# mount namespace of its own: the host's mount table stays as it was). Commands on stdin run as if
# typed, `sudo su - ec2-user` included (a shell reading a pipe leaves the rest of it to that one):
#   local_cluster/cluster.sh login <<'EOF'
#   sudo su - ec2-user
#   cd /opt/llm-jobs/bundle && bash jobs/submit.sh model1
#   EOF
cmd_login() {
  [[ $(id -u) == 0 ]] || die "needs root (a mount namespace, then the user's shell)"
  [[ -z $NAME ]] || die "login is for the default cluster: a named one mounts no /opt/llm-jobs"
  live_pid "$RUN/slurmctld.pid" slurmctld >/dev/null || die "the cluster is not up — start it with '$0 up'"
  local user=${1:-$LOGIN_USER}
  id "$user" >/dev/null 2>&1 || die "no user '$user' on this machine (the cluster's are $CLUSTER_USER, $LOGIN_USER and one per model)"
  exec unshare --mount --propagation private -- "$SELF" _login "$user"
}

# Inside the login's mount namespace (internal command).
cmd_login_inside() {
  mount_shared_storage
  mount_jobs_home
  exec runuser --login "$1"
}

case "${1:-}" in
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  reboot) shift; cmd_reboot "$@" ;;
  rollup) cmd_rollup ;;
  login) shift; cmd_login "$@" ;;
  update) cmd_update ;;
  # Internal: a node's boot inside its namespaces; the head node's OnNodeConfigured in its own.
  _boot-node) cmd_boot_node "$2" ;;
  _head-action) cmd_head_action "$2" ;;
  _login) cmd_login_inside "$2" ;;
  *) echo "error: unknown command '${1:-}' — usage: $0 up|down|status|reboot NODE...|rollup|update|login [USER]" >&2; exit 2 ;;
esac
