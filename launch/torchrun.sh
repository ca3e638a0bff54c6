#!/usr/bin/env bash
# Plain DDP with torchrun, on one node or several, without an accelerate config file.
#   bash launch/torchrun.sh RECIPE SCRIPT [key=value ...]
#   bash launch/torchrun.sh recipes/phi-4/sft.yaml fic/train_sft.py
# Several nodes: run it on every node, with node 0's hostname as MASTER_ADDR and the node's own rank:
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=gpu001 bash launch/torchrun.sh recipes/phi-4/sft.yaml fic/train_sft.py
# SCRIPT is fic/train_sft.py or fic/train_vasd.py; key=value overrides go to it. DRY_RUN=1 prints the
# command instead of running it. GLOBAL_BATCH=B keeps B conversations per optimizer step on any GPU
# count that divides it (the launch check sets train.grad_accum_steps). Other settings: GPUS_PER_NODE
# (8), MASTER_PORT (29500), MIXED_PRECISION (bf16), PYTHON (python).
#
# DDP keeps the whole model, its gradients and optimizer state on every GPU: right for LoRA recipes and
# small models. Full fine-tuning of a 7-14B model needs ZeRO: `accelerate launch` with
# launch/deepspeed_zero2.yaml, or the SLURM scripts.
set -euo pipefail
cd "$(dirname "$0")/.."
source launch/lib.sh
fic_args "$@"
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
NNODES=${NNODES:-1}

# torchrun runs what launch/accelerate_multi_gpu.yaml describes (DDP, bf16), so the check reads that file.
fic_check launch/accelerate_multi_gpu.yaml $((NNODES * GPUS_PER_NODE)) "$NNODES"
if (( NNODES == 1 )); then
  # A free port of its own: two single-node jobs on one machine do not collide.
  rendezvous=(--standalone)
else
  need NODE_RANK "this node's rank, 0 to NNODES-1"
  need MASTER_ADDR "node 0's hostname, the same on every node"
  rendezvous=(--nnodes "$NNODES" --node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR"
              --master_port "${MASTER_PORT:-29500}")
fi
# `accelerate launch` tells each process the precision through this variable; torchrun does not, and
# the recipe's train.mixed_precision=auto would then compute in float32.
cmd=(env ACCELERATE_MIXED_PRECISION="${MIXED_PRECISION:-bf16}" torchrun "${rendezvous[@]}"
     --nproc_per_node "$GPUS_PER_NODE" "$SCRIPT" --config "$RECIPE" "${OVERRIDES[@]}")
if [[ ${DRY_RUN:-0} == 1 ]]; then
  quote "${cmd[@]}"
else
  exec "${cmd[@]}"
fi
