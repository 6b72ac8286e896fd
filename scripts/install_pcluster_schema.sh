#!/usr/bin/env bash
# Installs AWS ParallelCluster's config schema (not its CLI) into .build/pcluster, apart from .venv.
#
# aws-parallelcluster pins CDK v1 and jsii 1.85; installed normally it would downgrade the CDK v2
# app's jsii. Its schema code never imports aws_cdk, so we install the package without its
# dependencies plus exactly what `pcluster.schemas.cluster_schema` imports, into a folder that
# cluster_config/pcluster_schema.py puts first on sys.path of a separate, site-less interpreter.
# Usage: scripts/install_pcluster_schema.sh [PYTHON]   (default: .venv/bin/python, else python3)
set -euo pipefail
cd "$(dirname "$0")/.."

TARGET=.build/pcluster
PYTHON="${1:-$( [[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3 )}"
# One line per package; bump together with PCLUSTER_VERSION in cluster_config/render.py.
PACKAGES=(
  aws-parallelcluster==3.16.1
  marshmallow==3.26.2
  tabulate==0.9.0
  packaging==25.0
  PyYAML==6.0.3
  jinja2==3.1.6
  MarkupSafe==3.0.4
  boto3==1.43.11
  botocore==1.43.127
  s3transfer==0.17.1
  jmespath==1.1.0
  python-dateutil==2.9.0.post0
  six==1.17.0
  urllib3==2.8.0
)
STAMP="$TARGET/.installed"
WANTED="$(printf '%s\n' "${PACKAGES[@]}")"
if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$WANTED" ]]; then
  echo "ParallelCluster schema already installed in $TARGET"
  exit 0
fi
rm -rf "$TARGET"
"$PYTHON" -m pip install --disable-pip-version-check --no-deps --target "$TARGET" "${PACKAGES[@]}"
# Prove the schema imports with nothing but the standard library and $TARGET (-S: no site-packages).
"$PYTHON" -I -S -c "import sys; sys.path.insert(0, '$TARGET'); import pcluster.schemas.cluster_schema"
printf '%s\n' "$WANTED" > "$STAMP"
echo "ParallelCluster schema installed in $TARGET"
