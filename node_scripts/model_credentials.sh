#!/usr/bin/env bash
# A model user's AWS credentials: those of its model's own IAM role (stacks/model_roles.py), never
# the node's. Installed root-owned as /usr/local/sbin/llm-model-credentials by directory_setup.sh; every
# user may run it through sudo, with no arguments (/etc/sudoers.d/llm-model-credentials), and each model
# user's ~/.aws/config calls it as `credential_process = sudo -n /usr/local/sbin/llm-model-credentials`.
#
# The role is the one of the CALLER's model: sudo's SUDO_UID (set by sudo from the caller's real uid;
# sudo's env_reset drops anything the caller sets) names the user, and the user must be a model of
# $MODEL_ROLES ("<model> <role arn>" a line, root's, written by directory_setup.sh). No argument, no
# environment variable of the caller's can choose another model. It assumes the role with the node's
# instance credentials, which only root (and the cluster's user) can reach (node_setup.sh), and prints
# them as credential_process expects (Version 1 JSON).
#
# Environment (root's, not the caller's): MODEL_ROLES (default /etc/llm/model-roles), JOBS_PYTHON (the
# jobs venv's interpreter, which has boto3: default /opt/llm-jobs/venv/bin/python), INSTANCE_AWS_CONFIG
# (default /etc/llm/instance-aws.config: used only where it exists, the local cluster's stand-in for the
# instance profile; on AWS the instance metadata service gives the node's credentials).
set -euo pipefail

MODEL_ROLES="${MODEL_ROLES:-/etc/llm/model-roles}"
JOBS_PYTHON="${JOBS_PYTHON:-/opt/llm-jobs/venv/bin/python}"
INSTANCE_AWS_CONFIG="${INSTANCE_AWS_CONFIG:-/etc/llm/instance-aws.config}"
DURATION_S=3600  # the CLI and boto3 call the helper again before the credentials expire

die() { echo "error: $* " >&2; exit 1; }

(($# == 0)) || die "llm-model-credentials takes no arguments — it gives the caller's own model's credentials"
((EUID == 0)) || die "run it as 'sudo -n $0': it needs the node's credentials, which are root's"
[[ ${SUDO_UID:-} =~ ^[0-9]+$ ]] || die "no SUDO_UID: run it through sudo, as the model's user"
user=$(getent passwd "$SUDO_UID" | cut -d: -f1) || die "uid $SUDO_UID has no user on this node"
role=$(awk -v m="$user" '$1 == m { print $2; exit }' "$MODEL_ROLES") \
  || die "cannot read $MODEL_ROLES (directory_setup.sh writes it from the cluster's model list)"
[[ -n $role ]] || die "user '$user' is not a model's user of this cluster ($MODEL_ROLES): only a model's jobs get a model's credentials"

[[ ! -f $INSTANCE_AWS_CONFIG ]] || export AWS_CONFIG_FILE="$INSTANCE_AWS_CONFIG"
# -I: isolated, no user site-packages and no PYTHON* variables.
exec "$JOBS_PYTHON" -I - "$role" "$user-$(hostname -s)" "$DURATION_S" <<'PY'
import json, sys
import boto3
role, session, duration = sys.argv[1], sys.argv[2], int(sys.argv[3])
credentials = boto3.client("sts").assume_role(RoleArn=role, RoleSessionName=session[:64], DurationSeconds=duration)["Credentials"]
print(json.dumps({"Version": 1, "AccessKeyId": credentials["AccessKeyId"], "SecretAccessKey": credentials["SecretAccessKey"],
                  "SessionToken": credentials["SessionToken"], "Expiration": credentials["Expiration"].isoformat()}))
PY
