#!/usr/bin/env bash
# Checks the prerequisites README.md names, and says how to get what is missing.
#   scripts/check-prereqs.sh [--for run|test] [python]
# `--for run` (make run, the venv): Python >= 3.11 with venv, Java 17. `--for test` (the default; make setup and
# make test): also Node.js with npm, which only the tests need (s3rver, a second S3 implementation).
set -u
purpose=test
if [ "${1:-}" = "--for" ]; then
  purpose=${2:-}
  shift 2 || shift $#
fi
case "$purpose" in
  run|test) ;;
  *) echo "usage: $0 [--for run|test] [python]" >&2; exit 2 ;;
esac
python=${1:-python3}
fail=0
if ! command -v "$python" >/dev/null 2>&1; then
  echo "error: $python not found. statekeeper needs Python 3.11 or newer (e.g. 'apt-get install python3 python3-venv')." >&2
  fail=1
elif ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  echo "error: $python is $("$python" -V 2>&1); statekeeper needs Python 3.11 or newer. Set PYTHON=/path/to/python3.11 when calling make." >&2
  fail=1
elif ! "$python" -c 'import venv, ensurepip' >/dev/null 2>&1; then
  echo "error: $python has no venv/ensurepip module (Debian: 'apt-get install python3-venv')." >&2
  fail=1
fi
if ! command -v java >/dev/null 2>&1; then
  echo "error: java not found. The Spark integration needs Java 17 or newer (e.g. 'apt-get install openjdk-17-jre-headless') and JAVA_HOME or java on PATH." >&2
  fail=1
else
  major=$(java -version 2>&1 | sed -n 's/.*version "\([0-9]*\).*/\1/p' | head -n1)
  if [ -z "$major" ] || [ "$major" -lt 17 ]; then
    echo "error: java reports version '${major:-unknown}'; the Spark integration needs Java 17 or newer." >&2
    fail=1
  fi
fi
if [ "$purpose" = test ]; then
  # The tests run S3 against s3rver too (tests/s3rver/package.json, installed with npm ci); `make run` does not.
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "error: node/npm not found. The tests (not 'make run') run a second S3 implementation (s3rver) on Node.js 12 or newer (e.g. 'apt-get install nodejs npm')." >&2
    fail=1
  else
    node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
    if [ "$node_major" -lt 12 ]; then
      echo "error: node reports version $(node --version 2>&1); s3rver needs Node.js 12 or newer." >&2
      fail=1
    fi
  fi
fi
exit $fail
