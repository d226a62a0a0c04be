# run.sh: the local, single-device training command that epl-launch starts on every worker.
python local_model.py
