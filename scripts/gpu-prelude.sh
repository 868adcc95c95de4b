# Source at the start of a command on the GPU machine (after carrying .whl, see
# scripts/fetch-wheels.sh): installs the wheels that machine lacks and puts the project on
# PYTHONPATH (no build backend is reachable there, so no editable install).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
