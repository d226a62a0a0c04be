#!/usr/bin/env bash
# Print the path of a working Python interpreter of one minor version, or explain what to install.
# Usage: tools/find_python.sh [VERSION]   (VERSION defaults to 3.7; `make setup-tf2` asks for 3.11)
# Order: the variable naming an interpreter ($PYTHON for 3.7, $PYTHON311 for 3.11), pythonX.Y on
# PATH (only if it really runs: pyenv shims can exist without the version being selected), then
# pyenv's X.Y.z installs ($PYENV_ROOT, else $HOME/.pyenv: a bare environment has no shims, may
# have no PYENV_ROOT and even no HOME).
set -u
VERSION="${1:-3.7}"
MAJOR="${VERSION%%.*}"
MINOR="${VERSION#*.}"
case "$VERSION" in
  3.7) VAR=PYTHON; TARGET=setup; WHY="TensorFlow 1.15.5 has no wheels for newer Pythons" ;;
  *) VAR="PYTHON${MAJOR}${MINOR}"; TARGET=setup-tf2
     WHY="the TensorFlow 2.x leg is pinned to it: requirements-tf2.txt" ;;
esac
works() {
  [ -n "$1" ] && "$1" -c "import sys; sys.exit(0 if sys.version_info[:2] == ($MAJOR, $MINOR) else 1)" \
    >/dev/null 2>&1
}
GIVEN="${!VAR:-}"
if [ -n "$GIVEN" ]; then
  if works "$GIVEN"; then echo "$GIVEN"; exit 0; fi
  echo "$VAR=$GIVEN is not a working Python $VERSION interpreter." >&2; exit 1
fi
if command -v "python$VERSION" >/dev/null 2>&1 && works "python$VERSION"; then
  command -v "python$VERSION"; exit 0
fi
for root in "${PYENV_ROOT:-}" "${HOME:+$HOME/.pyenv}"; do
  [ -n "$root" ] || continue
  for cand in "$root"/versions/"$VERSION".*/bin/python; do
    if works "$cand"; then echo "$cand"; exit 0; fi
  done
done
cat >&2 <<MSG
No Python $VERSION found. EPL needs Python $VERSION here ($WHY).
Install one of:
  - pyenv:  pyenv install $VERSION          (then re-run make)
  - Debian/Ubuntu: apt install python$VERSION python$VERSION-venv
or point $VAR at an interpreter:  make $TARGET $VAR=/path/to/python$VERSION
MSG
exit 1
