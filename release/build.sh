#!/usr/bin/env bash
# One release file of Jetway for a commit (`make release`): what a server
# installs with no git and no package registry (deploy/ec2/user-data.sh).
#
#   release/build.sh [--commit REV] [--version LABEL] [--out DIR]
#
# Writes DIR/jetway-LABEL.tar.gz and, beside it, its SHA-256 in
# DIR/jetway-LABEL.tar.gz.sha256 (sha256sum's format). The tarball holds one
# directory, jetway-LABEL/, with:
#   api/ handlers/ cache/ deploy/ Procfile requirements*.txt   the commit's files (git archive:
#                                                  no working-tree change gets in)
#   RELEASE, COMMIT                                the version label and the full commit
#   wheels/                                        requirements.txt and requirements-nodeps.txt
#                                                  built as wheels for this machine's interpreter
#                                                  (Debian's PyPy 3.9, this architecture): the
#                                                  runtime needs only, never requirements-dev.txt
#   master-wheels/                                 the same for Debian's CPython 3.11, which the
#                                                  master runs on (JETWAY_MASTER_PYTHON,
#                                                  api/master_python.py; RELEASE_MASTER_PYTHON
#                                                  builds them, .venv-cpython by default)
# LABEL defaults to the commit's short hash. The wheels are resolved with the
# versions the development .venv holds as constraints, so a release runs the
# dependency versions `make test` ran against. Lives outside deploy/, which
# holds configuration only (STYLE.md); run from any directory.
set -euo pipefail
cd "$(dirname "$0")/.."

commit=HEAD
version=""
out=var/releases
python=${RELEASE_PYTHON:-.venv/bin/python}
master_python=${RELEASE_MASTER_PYTHON:-.venv-cpython/bin/python}
while [ $# -gt 0 ]; do
  case "$1" in
  --commit) commit="$2"
    shift 2
    ;;
  --version) version="$2"
    shift 2
    ;;
  --out) out="$2"
    shift 2
    ;;
  *)
    echo "usage: release/build.sh [--commit REV] [--version LABEL] [--out DIR]" >&2
    exit 2
    ;;
  esac
done
sha="$(git rev-parse --verify "$commit^{commit}")"
version="${version:-$(git rev-parse --short=12 "$sha")}"
# The label names a directory on every server (/opt/jetway/releases/LABEL).
if ! [[ "$version" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ ]]; then
  echo "release/build.sh: bad version label '$version' (letters, digits, . _ -)" >&2
  exit 2
fi
"$python" -c 'import platform, sys; assert platform.python_implementation() == "PyPy" and sys.version_info[:2] == (3, 9)' ||
  { echo "release/build.sh: $python is not PyPy 3.9 (make setup makes .venv)" >&2; exit 2; }
# Debian bookworm's python3, the interpreter the server's master venv is made with.
"$master_python" -c 'import platform, sys; assert platform.python_implementation() == "CPython" and sys.version_info[:2] == (3, 11)' ||
  { echo "release/build.sh: $master_python is not CPython 3.11 (make setup-cpython makes .venv-cpython)" >&2; exit 2; }

name="jetway-$version"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/$name" "$out"
git archive --format=tar "$sha" api handlers cache deploy Procfile requirements.txt requirements-nodeps.txt |
  tar -x -C "$work/$name"
echo "$version" >"$work/$name/RELEASE"
echo "$sha" >"$work/$name/COMMIT"

# Constraints: the versions in the development .venv (those `make test` ran
# on), so an unpinned dependency of a dependency is not whatever is newest today.
"$python" -m pip freeze --exclude-editable --disable-pip-version-check | grep -v ' @ ' >"$work/constraints.txt"
# wheels PYTHON DIR: the runtime requirements built for PYTHON into the release's DIR. The
# master's take the same constraints: one set of versions on both interpreters.
wheels() {
  local pip_wheel=("$1" -m pip wheel -q --disable-pip-version-check --wheel-dir "$work/$name/$2")
  "${pip_wheel[@]}" -c "$work/constraints.txt" -r "$work/$name/requirements.txt"
  "${pip_wheel[@]}" --no-deps -r "$work/$name/requirements-nodeps.txt"
}
wheels "$python" wheels
wheels "$master_python" master-wheels

# Reproducible from the same files: sorted, no owners, the commit's time.
when="$(git show -s --format=%ct "$sha")"
tarball="$out/$name.tar.gz"
tar --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$when" -C "$work" -c "$name" | gzip -n -6 >"$tarball.partial"
mv "$tarball.partial" "$tarball"
(cd "$out" && sha256sum "$name.tar.gz" >"$name.tar.gz.sha256")
echo "$tarball $(du -h "$tarball" | cut -f1) sha256 $(cut -d' ' -f1 "$tarball.sha256")"
