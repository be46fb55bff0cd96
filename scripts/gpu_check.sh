#!/usr/bin/env bash
# One short, prepared run of the GPU recipes on a lent single-GPU machine (an H200), numbers to $OUT.
#   BERT-large (seq 128, bf16) under ddp, zero2 and zero3; the CIFAR-10 ConvNet eager vs torch.compile.
# Each strategy is a real `launch submit` on the local backend with one GPU; `launch bench` compares them.
# Usage (device tool): scripts/gpu_check.sh        writes $OUT/bert_large.json, $OUT/convnet.json, $OUT/*.html
# The device image has torch, transformers and accelerate but not pydantic or deepspeed: carry them as wheels
# in .whl/ (see the device README) and they are installed to /tmp/site first.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if compgen -G ".whl/*" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export LAUNCH_HOME=/tmp/launch-home TORCH_EXTENSIONS_DIR=/tmp/torch-ext  # not under $OUT: 8 files come back
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"

cat > /tmp/cluster.yaml <<YAML
name: h200
backend: local
local: {gpus: 1}
gpu: {name: H200, memory_gb: 141}
python: $(command -v "$PY")
YAML
launch() { "$PY" -m launcher "$@"; }
one_gpu=(--set resources.nodes=1 --set resources.nproc_per_node=1 --set checkpoint.dir=null --set checkpoint.every_steps=0 --set restarts=0)

# BERT-large, seq 128, bf16: micro 64 x accumulation 2 on one GPU, 40 steps (10 warm-up).
launch bench jobs/bert_large_zero3.yaml --cluster /tmp/cluster.yaml --strategies ddp,zero2,zero3 --steps 40 \
  "${one_gpu[@]}" --set batch.micro_batch=64 --set batch.global_batch=128 --set precision=bf16 \
  --set metrics.every=10 --json --out "$OUT/bert_large.json" | tee "$OUT/bert_large.stdout"

# CIFAR-10 ConvNet: eager DDP vs DDP + torch.compile, micro 256, 300 steps.
launch bench jobs/cifar10_convnet_ddp.yaml --cluster /tmp/cluster.yaml --strategies ddp,ddp_compile --steps 300 \
  "${one_gpu[@]}" --set batch.global_batch=null --set batch.micro_batch=256 --set batch.grad_accum=1 --set metrics.every=50 \
  --json --out "$OUT/convnet.json" | tee "$OUT/convnet.stdout"

launch report $(launch status --json --limit 0 | "$PY" -c 'import json,sys; print(" ".join(j["id"] for j in json.load(sys.stdin)[::-1] if not j["id"].startswith("launch-check")))') \
  --out "$OUT/report.html"
echo "gpu_check: done; numbers in $OUT/bert_large.json and $OUT/convnet.json"
