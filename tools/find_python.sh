#!/usr/bin/env bash
# Print the path of a working Python 3.7 interpreter, or explain what to install.
# Order: $PYTHON, python3.7 on PATH (only if it really runs: pyenv shims can exist
# without the version being selected), then pyenv's 3.7.x installs.
set -u
works() { [ -n "$1" ] && "$1" -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 7) else 1)' >/dev/null 2>&1; }
if [ -n "${PYTHON:-}" ]; then
  if works "$PYTHON"; then echo "$PYTHON"; exit 0; fi
  echo "PYTHON=$PYTHON is not a working Python 3.7 interpreter." >&2; exit 1
fi
if command -v python3.7 >/dev/null 2>&1 && works python3.7; then command -v python3.7; exit 0; fi
for root in "${PYENV_ROOT:-}" "$HOME/.pyenv"; do
  [ -n "$root" ] || continue
  for cand in "$root"/versions/3.7*/bin/python; do
    if works "$cand"; then echo "$cand"; exit 0; fi
  done
done
cat >&2 <<'MSG'
No Python 3.7 found. EPL needs Python 3.7 (TensorFlow 1.15.5 has no wheels for newer Pythons).
Install one of:
  - pyenv:  pyenv install 3.7.16          (then re-run make)
  - Debian/Ubuntu: apt install python3.7 python3.7-venv
or point PYTHON at an interpreter:  make setup PYTHON=/path/to/python3.7
MSG
exit 1
