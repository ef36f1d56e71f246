#!/bin/bash
#SBATCH --job-name=llm-pretrain
#SBATCH --nodes=64
#SBATCH --time=72:00:00
#SBATCH --gres=gpu:4
#SBATCH --constraint=GH200
#SBATCH --partition=gpu
#SBATCH --account=ml_team
#SBATCH --output=logs/%x-%j.out
#SBATCH --error=logs/%x-%j.err

export MASTER_ADDR=$(scontrol show hostnames $SLURM_NODELIST | head -n1)
srun torchrun --nnodes=$SLURM_NNODES --nproc_per_node=4 train.py --config configs/7b.yaml
