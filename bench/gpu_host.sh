#!/usr/bin/env bash
# Runs on the GPU host (no network, no Rust): sets up what earlier calls staged in /tmp and runs
# one measurement. Staging, one call each, back to back (the host stays warm ~30 s):
#   .tfc/pN chunks  -> bash bench/gpu_host.sh stage-tf N    (copies .tfc/pN, or .tfc/N when
#                      there is no .tfc/pN, into /tmp/tfc; the carry limit is 64 MiB with the
#                      tracked tree, ~17 MB in session 11: split 50 MB chunks in halves named so
#                      that `cat tf.part.*` keeps their order, e.g. tf.part.00a, tf.part.00b)
#   last chunk      -> bash bench/gpu_host.sh install-tf    (also copies .data/ into /tmp/data)
# Then, carrying .gl and .hostrun/ (release plugin + bench binary):
#   bash bench/gpu_host.sh run "<command>"   with the plugin installed for TensorFlow.
set -euo pipefail
case "$1" in
stage-tf)
  d=.tfc/p"$2"; [ -d "$d" ] || d=.tfc/"$2"
  mkdir -p /tmp/tfc && cp "$d"/* /tmp/tfc/ && ls /tmp/tfc | wc -l ;;
install-tf)
  mkdir -p /tmp/tfc && cp .tfc/p"$2"/* /tmp/tfc/
  source .tfc/install.sh
  if [ -d .data ]; then mkdir -p /tmp/data && cp -r .data/* /tmp/data/; fi
  python3 -c "import sys; sys.path.insert(0, '/tmp/site'); import tensorflow as tf; print(tf.__version__)" ;;
run)
  source .gl/activate.sh
  sp=/tmp/w/site-packages
  mkdir -p $sp/tensorflow-plugins
  cp .hostrun/libtfwgpu_plugin.so $sp/tensorflow-plugins/
  rm -rf $sp/tensorflow_wgpu && cp -r python/tensorflow_wgpu $sp/
  echo "import tensorflow_wgpu._hooks as m; m.install()" > $sp/tensorflow_wgpu.pth
  # TensorFlow loads tensorflow-plugins/ only when it is itself imported from a path containing
  # "site-packages", and only from such paths; the .pth startup hook needs a site dir.
  mkdir -p /tmp/tf && ln -sfn /tmp/site /tmp/tf/site-packages
  echo "import site; site.addsitedir('$sp')" > $sp/sitecustomize.py
  export PYTHONPATH=$sp:/tmp/tf/site-packages
  export TF_CPP_MIN_LOG_LEVEL=2
  bash -c "$2" ;;
esac
