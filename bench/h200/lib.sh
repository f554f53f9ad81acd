# Sourced first by the request scripts (from the checkout's root on the GPU host, OUT set): the
# logs folder $L, the Vulkan loader of .gl, the carried binaries unpacked, $B the bench, and
# the GPU's name, driver and clock printed.
set -u
L=$OUT/logs
mkdir -p "$L"
source .gl/activate.sh
gunzip -f .hostrun/*.gz 2>/dev/null
chmod +x .hostrun/*
B=./.hostrun/tfwgpu-bench
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
