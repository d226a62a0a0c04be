# run.sh: the local, single-device training command that epl-launch starts on every worker.
# `python` is the launcher's Python; the script runs from any directory.
python "$(dirname "$0")/local_model.py"
