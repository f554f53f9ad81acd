#!/usr/bin/env bash
# The main job: set up (Debian packages, .venv with TensorFlow, the plugin built and installed),
# then train a Keras CNN on the real Fashion-MNIST on the best GPU adapter tfwgpu finds, and
# say where each op ran. Arguments go to the demo (--epochs, --batch-size, --limit, --device,
# --compare-cpu).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/env.sh
"$PYTHON" -m pip install -q --disable-pip-version-check --no-build-isolation ./python
demo=$("$PYTHON" -c 'import tensorflow_wgpu.demo as d; print(d.__file__)')
exec "$PYTHON" -m tensorflow_wgpu.report --summary "$demo" "$@"
